/**
 * Commands that reach the broker end at their deadline (`--timeout`) with one line, whatever the broker does; a
 * reader that goes away ends a command quietly. The broker here is `mesh up`'s own nats-server, stopped with
 * SIGSTOP: it keeps its port open and takes connections but answers nothing, as a hung or overloaded server would.
 */
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { once } from "node:events";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { describe, test } from "node:test";
import { openStore } from "../../src/store/index.js";
import { mesh } from "../support/cli.js";
import { eventually, startBin } from "../support/processes.js";
import type { Running } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

const root = new URL("../../", import.meta.url).pathname;

/** A guard against a hang, generous: a command that has not ended by then never would. */
const failSafeMs = 60_000;

/** The children of a process, from /proc (every thread's list: a child is listed under the thread that made it). */
function childrenOf(pid: number): number[] {
  return readdirSync(`/proc/${pid}/task`).flatMap((task) =>
    readFileSync(`/proc/${pid}/task/${task}/children`, "utf8")
      .split(" ")
      .filter((word) => word !== "")
      .map(Number),
  );
}

/** `mesh up` on a free port with its own data dir, serving; stopped (and its server resumed) when `t` ends. */
async function meshUp(
  t: TestContext,
): Promise<{ data: string; dir: string; up: Running; serverPid: number }> {
  const dir = tempDir("mesh-deadlines-");
  const data = join(dir.path, "data");
  const up = startBin("mesh", ["--data", data, "up", "--nats-port", "0"]);
  const server: { pid?: number | undefined } = {};
  t.after(async () => {
    // Resumed before it is stopped, or neither it nor `mesh up` could end. Its exit code is not asserted: a
    // control plane whose broker was stopped past the lease's life stops on its own, by design.
    if (server.pid !== undefined) process.kill(server.pid, "SIGCONT");
    await up.stop();
    dir.remove();
  });
  await eventually("the control plane to serve", () =>
    /control\.serving/.test(up.stderr()) ? true : undefined,
  );
  const upPid = up.child.pid ?? 0;
  const serverPid = childrenOf(upPid).find(
    (pid) => readFileSync(`/proc/${pid}/comm`, "utf8").trim() === "nats-server",
  );
  assert.ok(serverPid !== undefined, "mesh up runs a nats-server");
  server.pid = serverPid;
  return { data, dir: dir.path, up, serverPid };
}

/** Waits for a process to end, or kills it at the fail-safe; `ended` says whether it ended by itself. */
async function toEnd(child: ChildProcess): Promise<{ code: number | null; ended: boolean }> {
  const closed = once(child, "close");
  const failSafe = setTimeout(() => child.kill("SIGKILL"), failSafeMs);
  await closed;
  clearTimeout(failSafe);
  return { code: child.exitCode, ended: child.signalCode === null };
}

async function meshToEnd(
  args: readonly string[],
): Promise<{ code: number | null; stderr: string; ended: boolean }> {
  const run = startBin("mesh", args);
  return { ...(await toEnd(run.child)), stderr: run.stderr() };
}

describe("deadlines and broken pipes", { concurrency: true }, () => {
  test("deadline — against a broker that answers nothing, each command ends at --timeout with one line", async (t) => {
    const { data, dir, serverPid } = await meshUp(t);
    const issued = await mesh(["--data", data, "token", "issue", "web-1", "--json"]);
    assert.equal(issued.code, 0, issued.stderr);
    const file = join(dir, "motd.json");
    writeFileSync(file, JSON.stringify({ files: [{ path: "/etc/motd", content: "hello\n" }] }));

    process.kill(serverPid, "SIGSTOP");
    const cases: Array<{ args: string[]; nothing: string }> = [
      { args: ["declare", "web-1", "-f", file], nothing: "nothing was declared" },
      { args: ["token", "issue", "web-2"], nothing: "no token was issued" },
      { args: ["node", "retire", "web-1"], nothing: "nothing was retired" },
      { args: ["lease", "show"], nothing: "nothing was done" },
    ];
    for (const { args, nothing } of cases) {
      // The flag is global: before the command or after it.
      const run = await meshToEnd(["--data", data, ...args, "--timeout", "2s"]);
      assert.ok(run.ended, `mesh ${args.join(" ")} ended by itself`);
      assert.equal(run.code, 1, `${args.join(" ")}: ${run.stderr}`);
      assert.equal(
        run.stderr,
        `mesh: no answer from the broker within 2s (--timeout); ${nothing}\n`,
        args.join(" "),
      );
    }

    // What they said was not done was not: the store holds web-1's token only, and web-1 is not retired.
    const tokens = await mesh(["--data", data, "token", "list", "--json"]);
    assert.equal(tokens.code, 0, tokens.stderr);
    assert.deepEqual(
      (JSON.parse(tokens.stdout) as Array<{ node: string }>).map(({ node }) => node),
      ["web-1"],
    );
    const shown = await mesh(["--data", data, "node", "show", "web-1", "--json"]);
    assert.equal(shown.code, 0, shown.stderr);
    const node = JSON.parse(shown.stdout) as { state: string; declaration: unknown };
    assert.equal(node.state, "invited");
    assert.equal(node.declaration, null);
  });

  test("deadline — a --timeout that is no duration is a usage error, before anything is written", async () => {
    const dir = tempDir("mesh-deadline-usage-");
    try {
      const data = join(dir.path, "data");
      for (const args of [
        ["--data", data, "--timeout", "nonsense", "token", "issue", "web-1"],
        ["--data", data, "token", "issue", "web-1", "--timeout", "0s"],
      ]) {
        const run = await mesh(args);
        assert.equal(run.code, 2, run.stderr);
        assert.equal(run.stderr.split("\n").length, 2, run.stderr);
        assert.match(
          run.stderr,
          /^mesh: --timeout: "(nonsense|0s)" (is not a duration|must be longer than zero)/,
        );
        assert.equal(run.stdout, "");
        assert.equal(existsSync(data), false, "nothing was written");
      }
    } finally {
      dir.remove();
    }
  });

  test("broken pipe — a reader that goes away after the first chunk ends `mesh node list` quietly", async () => {
    const dir = tempDir("mesh-epipe-");
    try {
      const data = join(dir.path, "data");
      // Far more than a pipe holds (64 KiB), so the command is still writing when its reader has gone.
      const store = await openStore(`sqlite:${join(data, "mesh.db")}`, { historyLimit: 5 });
      try {
        const now = new Date();
        const expires = new Date(now.getTime() + 3_600_000).toISOString();
        for (let i = 0; i < 2000; i += 1) {
          await store.tokens.issue({
            id: `tok_${i.toString(16).padStart(12, "0")}`,
            node: `node-${i}`,
            secretHash: "x",
            createdAt: now.toISOString(),
            expiresAt: expires,
          });
        }
      } finally {
        await store.close();
      }

      const child = spawn(
        process.execPath,
        [`${root}bin/mesh.js`, "--data", data, "node", "list", "--json"],
        {
          cwd: root,
          env: { ...process.env, MESH_HOME: "" },
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      let stderr = "";
      let read = 0;
      child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
      child.stdout.once("data", (chunk: Buffer) => {
        read += chunk.length;
        child.stdout.destroy();
      });
      const { code, ended } = await toEnd(child);
      assert.ok(ended, "mesh node list ended by itself");
      assert.equal(code, 0, stderr);
      assert.equal(stderr, "", "no stack, no error line");
      assert.ok(read > 0 && read < 2000 * 100, `the reader went away early (read ${read} bytes)`);
    } finally {
      dir.remove();
    }
  });
});
