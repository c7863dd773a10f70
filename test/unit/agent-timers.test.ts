/**
 * The agent's timers cannot end the process by an unhandled rejection. The alive timer's work failing (the pending
 * report unreadable for a moment, a publish that throws instead of rejecting) is logged and tried again at the
 * next interval; the agent keeps running. The first alive failing is part of starting: run() ends with it.
 */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, mock, test } from "node:test";
import type { NodeBus } from "../../src/bus/index.js";
import { Agent } from "../../src/host/agent.js";
import { HostState, memoryStorage } from "../../src/host/state.js";
import type { StateStorage } from "../../src/host/state.js";
import { encodeSigningPublicKey, fingerprint, generateSigningKeyPair } from "../../src/keys/index.js";
import { MemoryApplier } from "../../src/lab/memory-applier.js";
import { createLogger } from "../../src/log.js";

const node = "edge-1";
const everyMs = 1000;
const signer = generateSigningKeyPair();

describe("agent — a timer's work that fails", () => {
  let broken = false;
  let throwOnAlive = false;
  let alives = 0;
  let closedBus = 0;
  let lines: string[] = [];
  let storage: StateStorage;
  let bus: NodeBus;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => void unhandled.push(reason);

  beforeEach(() => {
    mock.timers.enable({ apis: ["setInterval"] });
    process.on("unhandledRejection", onUnhandled);
    broken = false;
    throwOnAlive = false;
    alives = 0;
    closedBus = 0;
    lines = [];
    unhandled.length = 0;
    const memory = memoryStorage();
    // Reading any secret file fails while `broken`: the tick reads the pending report first.
    storage = {
      ...memory,
      exists: (path) => {
        if (broken && path.includes("pending-report")) throw new Error("EIO: the disk answered badly");
        return memory.exists(path);
      },
    };
    new HostState("/state", storage).saveIdentity({
      node,
      queue: "mesh.node.edge-1",
      broker: { url: "nats://127.0.0.1:4222", credential: { type: "nats", jwt: "aaa.bbb.ccc" } },
      signing_key: encodeSigningPublicKey(signer.publicKey),
      fingerprint: fingerprint(signer.publicKey),
      joined_at: new Date().toISOString(),
    });
    bus = {
      publishReport: () => Promise.resolve(),
      publishAlive: () => {
        // Thrown, not rejected: the agent's own `.catch` on the publish cannot see it.
        if (throwOnAlive) throw new Error("the connection is not writable");
        alives++;
        return Promise.resolve();
      },
      consumeNode: () => new Promise<void>(() => undefined),
      closed: () => new Promise<Error | undefined>(() => undefined),
      close: () => {
        closedBus++;
        return Promise.resolve();
      },
    };
  });
  afterEach(() => {
    mock.timers.reset();
    process.off("unhandledRejection", onUnhandled);
  });

  const agentWith = () =>
    new Agent({
      stateDir: "/state",
      root: "/nonexistent",
      aliveEveryMs: everyMs,
      log: createLogger({ level: "error", pretty: false, write: (line) => void lines.push(line) }),
      storage,
      applier: new MemoryApplier(),
      openBus: () => Promise.resolve(bus),
    });

  async function interval(): Promise<void> {
    mock.timers.tick(everyMs);
    for (let i = 0; i < 10; i++) await Promise.resolve();
    // An unhandled rejection is reported on a later turn of the event loop.
    await new Promise((resolve) => setImmediate(resolve));
  }

  test("agent — an alive tick that throws is logged and tried again; the agent keeps running", async () => {
    const agent = agentWith();
    let ended = false;
    await new Promise<void>((ready) => void agent.run(ready).finally(() => (ended = true)));
    const before = alives;
    assert.equal(before, 1, "the first alive went out");

    broken = true;
    await interval();
    throwOnAlive = true;
    broken = false;
    await interval();
    assert.equal(alives, before, "no alive while the work fails");
    assert.deepEqual(unhandled, [], "no unhandled rejection");
    assert.equal(ended, false, "run() goes on");
    const failures = lines.filter((line) => line.includes('"agent.tick_failed"'));
    assert.equal(failures.length, 2, "each failure logged once");
    assert.match(failures[0] ?? "", /EIO: the disk answered badly/);

    throwOnAlive = false;
    await interval();
    assert.equal(alives, before + 1, "retried at the next interval");
    await agent.stop();
  });

  test("agent — the first alive failing ends run() with the failure, the connection closed", async () => {
    broken = true;
    const agent = agentWith();
    await assert.rejects(
      agent.run(() => assert.fail("never running")),
      /EIO: the disk answered badly/,
    );
    assert.equal(closedBus, 1);
    assert.deepEqual(unhandled, []);
  });
});
