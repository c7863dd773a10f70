/**
 * A roll-out that keeps failing (here the store refuses every new declaration row, as a full disk or a broken
 * table would) is tried again after pauses that grow, not at every look of the plan watch: each try allocates every
 * target's next sequence and reads the fleet, and tried every 25 ms it would keep the control plane's thread and the
 * store busy for as long as the fault lasts. Once the fault is gone the roll-out goes out within the longest pause,
 * and the log says so. A real `mesh serve` on an operator-mode nats-server and a SQLite store, the fault a trigger.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import Database from "better-sqlite3";
import { rolloutRetryMs } from "../../src/control/plan-watch.js";
import { enrolNode, mesh } from "../support/cli.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, logLines, startBin } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

test("serve — a roll-out that keeps failing is tried again after growing pauses, and goes out once the fault is gone", async (t) => {
  const dir = tempDir("mesh-rollout-failing-");
  const data = join(dir.path, "data");
  const running: { serve?: Running } = {};
  const server = await startOperatorBroker(data, dir.path);
  t.after(async () => {
    await running.serve?.stop();
    await server.stop();
    dir.remove();
  });
  const cli = (args: string[]) => mesh(["--data", data, ...args]);
  const serve = startBin("mesh", ["--data", data, "serve", "--broker", server.url]);
  running.serve = serve;
  await eventually("serve to serve", () => (/control\.serving/.test(serve.stderr()) ? true : undefined));
  await enrolNode(cli, "edge-1", join(dir.path, "edge-1"));

  const db = new Database(join(data, "mesh.db"));
  db.pragma("busy_timeout = 5000");
  t.after(() => db.close());
  const allocated = () =>
    (db.prepare("SELECT declaration_sequence AS s FROM nodes WHERE name = 'edge-1'").get() as { s: number })
      .s;
  db.exec(
    "CREATE TRIGGER refuse_declarations BEFORE INSERT ON declarations BEGIN SELECT RAISE(ABORT, 'the disk is full (test)'); END",
  );
  const file = join(dir.path, "motd.yaml");
  writeFileSync(file, "files:\n  - path: /etc/motd\n    content: hello\n");
  // The command writes the plan and waits for it to be sent, which it cannot be while the fault lasts.
  const declared = await cli(["declare", "edge-1", "-f", file, "--timeout", "3s"]);
  assert.notEqual(declared.code, 0, declared.stdout);
  assert.match(declared.stderr, /had not sent it/);
  const failed = () =>
    logLines<{ level: string; event: string }>(serve.stderr()).filter(
      (line) => line.event === "plan.rollout_failed",
    );
  await eventually("the roll-out to fail", () => (failed().length > 0 ? true : undefined));

  // It is tried again (each try allocates edge-1 a sequence) ...
  const failedAt = allocated();
  await eventually("the roll-out to be tried again", () => (allocated() > failedAt ? true : undefined));
  // ... and over the next stretch, every 25 ms it would be some 40 tries a second; with pauses doubling from the
  // first, a handful in all (a slow machine can only try less often).
  const before = allocated();
  const stretchMs = 6_000;
  await new Promise((resolve) => setTimeout(resolve, stretchMs));
  const tries = allocated() - before;
  let most = 0;
  for (let waited = 0, failures = 1; waited < stretchMs; failures++) {
    waited += rolloutRetryMs(failures);
    most++;
  }
  assert.ok(tries <= most + 1, `${tries} tries in ${stretchMs} ms (at most ${most + 1} with growing pauses)`);
  assert.equal(failed().length, 1, "the failure told once, however many tries");

  db.exec("DROP TRIGGER refuse_declarations");
  await eventually("the roll-out to go out once the fault is gone", async () => {
    const shown = await cli(["node", "show", "edge-1", "--json"]);
    return (JSON.parse(shown.stdout) as { declaration: { sequence: number } | null }).declaration !== null
      ? true
      : undefined;
  });
  await eventually("the log to say the roll-outs went again", () =>
    /plan\.rollout_again/.test(serve.stderr()) ? true : undefined,
  );
});
