/**
 * Key generation under garbage collection. Node 20 can freeze a thread for good when a key object made by
 * `generateKeyPair(Sync)` is exported while a collection runs (the export and the collected job share one lock):
 * a `mesh lab` of 600 nodes froze that way in mid-join. The mesh makes its keys so that no such key object exists.
 * A frozen thread makes no progress and uses no CPU, so the child is watched for progress, not for its speed.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { test } from "node:test";

/** How long the child may go without making a thousand keys (it makes them in well under a second). */
const stuckAfterMs = 60_000;

test("keys — ten thousand broker and signing keys made and exported under constant garbage collection, none freezes", async () => {
  const script = new URL("../support/key-churn.ts", import.meta.url).pathname;
  const count = 10_000;
  const child = spawn(
    process.execPath,
    ["--max-semi-space-size=1", "--import", "tsx", script, String(count)],
    {
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
  const lines: string[] = [];
  let watchdog: NodeJS.Timeout | undefined;
  let stuck = false;
  const watch = () => {
    clearTimeout(watchdog);
    watchdog = setTimeout(() => {
      stuck = true;
      child.kill("SIGKILL");
    }, stuckAfterMs);
  };
  watch();
  createInterface({ input: child.stdout }).on("line", (line) => {
    lines.push(line);
    watch();
  });
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  clearTimeout(watchdog);
  assert.equal(
    stuck,
    false,
    `no progress for ${stuckAfterMs / 1000} s after "${lines.at(-1) ?? "nothing"}": the thread is frozen`,
  );
  assert.equal(code, 0, stderr);
  assert.equal(lines.at(-1), `done ${count} true`);
});
