/**
 * The nats-server the mesh starts itself (`mesh up`) writes into one log through two outputs; stopping it waits for
 * both to close, so the log holds the server's last lines and nothing is written to it after its end. A real
 * nats-server, stopped while running and stopped after a pause (SIGSTOP, then SIGCONT), as the connect-deadline test
 * leaves one; and a process whose outputs close apart, the last lines coming after one closed.
 */
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { spawn } from "node:child_process";
import { test } from "node:test";
import { freePort, logOutputs, startNatsServer } from "../../src/bus/nats/server.js";
import { tempDir } from "../support/tmp.js";

for (const paused of [false, true]) {
  test(`nats-server log — stopped${paused ? " after a pause" : ""}, its log ends with the server's own last line`, async () => {
    const dir = tempDir("mesh-nats-log-");
    try {
      const port = await freePort();
      const config = join(dir.path, "nats.conf");
      writeFileSync(config, `listen: 127.0.0.1:${port}\n`);
      const log = join(dir.path, "nats.log");
      const server = await startNatsServer(config, { host: "127.0.0.1", port }, log);
      if (paused) {
        process.kill(server.pid, "SIGSTOP");
        process.kill(server.pid, "SIGCONT");
      }
      await server.stop();
      const lines = readFileSync(log, "utf8").trimEnd().split("\n");
      assert.match(lines.at(-1) ?? "", /\[INF\] Server Exiting/, lines.slice(-3).join("\n"));
    } finally {
      dir.remove();
    }
  });
}

test("nats-server log — an output that closes first does not end the log: the other's later lines are kept", async () => {
  const dir = tempDir("mesh-nats-log-");
  try {
    const log = join(dir.path, "out.log");
    // Standard output closed at once; standard error writes a moment later, then the process ends.
    const child = spawn(
      process.execPath,
      ["-e", 'process.stdout.end("first\\n", () => setTimeout(() => process.stderr.write("last\\n"), 200));'],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    await logOutputs(child, log);
    assert.equal(readFileSync(log, "utf8"), "first\nlast\n");
  } finally {
    dir.remove();
  }
});
