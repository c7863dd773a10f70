/**
 * A connect to a server that takes the socket but answers nothing (stopped with SIGSTOP: its port stays open) fails
 * with the mesh's `timeout`, and leaves nothing behind that keeps a process alive. It runs in a child process of its
 * own, on the built code (npm test builds first), so that "the process ends by itself" is what is asserted.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { test } from "node:test";
import { newUserKey } from "../../src/bus/nats/authority.js";
import { startOperatorServer } from "../support/nats.js";

const root = new URL("../../", import.meta.url).pathname;

test("nats connect — no answer within the timeout is a timeout, and the process still ends by itself", async (t) => {
  const broker = await startOperatorServer();
  t.after(async () => {
    process.kill(broker.server.pid, "SIGCONT");
    await broker.stop();
  });
  process.kill(broker.server.pid, "SIGSTOP");

  const script = `
    import { connectNats } from ${JSON.stringify(`${root}dist/bus/nats/connect.js`)};
    const [url, seed] = process.argv.slice(1);
    try {
      await connectNats({ url, identity: { jwt: "unused", seed }, name: "deadline", reconnect: false, timeoutMs: 1000 });
      console.log("connected");
    } catch (error) {
      console.log(error.code);
    }
  `;
  const child = spawn(
    process.execPath,
    ["--input-type=module", "-e", script, broker.url, newUserKey().seed],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
  // A guard against a hang, generous: the socket the client left open kept such a process alive for good.
  const failSafe = setTimeout(() => child.kill("SIGKILL"), 60_000);
  await once(child, "close");
  clearTimeout(failSafe);
  assert.equal(child.signalCode, null, `the process ended by itself (printed ${JSON.stringify(stdout)})`);
  assert.equal(child.exitCode, 0, stderr);
  assert.equal(stdout, "timeout\n");
});
