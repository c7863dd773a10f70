/**
 * What the acting control plane does, over a bus that records what it is asked: the bus asserted before anything
 * is answered or consumed, revocations applied at the start and again after a reconnection, the control queue
 * handed back while the gate is closed, and nothing running after a stop.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { ControlBus, ControlDelivery, ControlHandler, ControlSide } from "../../src/bus/index.js";
import { compileMeshOptions } from "../../src/config/options.js";
import { ControlMetrics } from "../../src/control/control-metrics.js";
import { Duties } from "../../src/control/duties.js";
import { retireNode } from "../../src/control/retire.js";
import { loadOrCreateSigningKey } from "../../src/keys/index.js";
import { encodeMessage } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { enrolled, storeBackends } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";

describe("the acting control plane's duties", () => {
  const dir = tempDir("mesh-duties-");
  let location: { url: string; cleanup(): Promise<void> };
  let store: Store;
  before(async () => {
    location = await storeBackends[0]!.fresh();
    store = await openStore(location.url, { historyLimit: 5 });
  });
  after(async () => {
    await store.close();
    await location.cleanup();
    dir.remove();
  });

  test("duties — started in order, revocations applied again on reconnection, the queue handed back while the gate is shut", async () => {
    await enrolled(store, "d-1", new Date());
    await enrolled(store, "d-2", new Date());
    await retireNode(store, "d-2", new Date());
    const calls: string[] = [];
    let reconnect: () => void = () => undefined;
    let handle: ControlHandler | undefined;
    let closeQueue: () => void = () => undefined;
    const bus = {
      assert: () => {
        calls.push("assert");
        return Promise.resolve();
      },
      answerEnrolments: () => {
        calls.push("answerEnrolments");
        return Promise.resolve();
      },
      consumeControl: (handler: ControlHandler) => {
        calls.push("consumeControl");
        handle = handler;
        return new Promise<void>((resolve) => (closeQueue = resolve));
      },
      onReconnect: (listener: () => void) => void (reconnect = listener),
      // Asked every period by the hearing duty: not recorded, the order of the rest is what is checked.
      backlog: () => Promise.resolve(0),
    } as unknown as ControlBus;
    const side = {
      bus,
      identities: {
        url: "nats://127.0.0.1:4222",
        sweepsTokens: false,
        revoke: (revoked: ReadonlyMap<string, Date>) => {
          calls.push(`revoke ${[...revoked.keys()].join(",")}`);
          return Promise.resolve();
        },
        forget: (node: string) => {
          calls.push(`forget ${node}`);
          return Promise.resolve();
        },
      },
    } as unknown as ControlSide;
    const options = compileMeshOptions({
      dataDir: join(dir.path, "data"),
      flags: { store: location.url },
      env: {},
    });
    let open = true;
    const metrics = new ControlMetrics({ held: () => open, epoch: () => 1, withoutEpoch: () => false });
    const duties = new Duties({
      options,
      periods: { ...options.periods, flushEveryMs: 20 },
      store,
      side,
      signing: loadOrCreateSigningKey(join(dir.path, "keys")),
      log: createLogger({ level: "error" }),
      now: () => new Date(),
      gate: () => open,
      epoch: () => 1,
      metrics,
    });

    await duties.start();
    assert.deepEqual(calls, ["assert", "revoke U-d-2", "forget d-2", "answerEnrolments", "consumeControl"]);
    calls.length = 0;
    reconnect();
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.deepEqual(calls, ["revoke U-d-2", "forget d-2"], "applied again after a reconnection");

    const alive: ControlDelivery = {
      kind: "alive",
      node: "d-1",
      body: encodeMessage({
        kind: "alive",
        node: "d-1",
        sent_at: new Date().toISOString(),
        holds: { epoch: 0, sequence: 0 },
      }),
      redelivered: false,
      receivedAt: new Date(),
    };
    assert.deepEqual(await handle?.([alive]), ["done"]);
    open = false;
    assert.deepEqual(
      await handle?.([alive, alive]),
      ["retry", "retry"],
      "handed back while the gate is shut",
    );
    const text = metrics.metrics.text();
    assert.match(text, /^mesh_control_messages_total 1$/m);
    assert.match(text, /^mesh_control_messages_handed_back_total 2$/m);

    // The batched last_seen is written by the flush timer.
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.notEqual((await store.nodes.get("d-1"))?.lastSeen, null);

    await duties.stop();
    closeQueue();
    await duties.consuming;
    await duties.finish();
  });
});
