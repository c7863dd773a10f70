/**
 * While the acting control plane sends a roll-out's declarations, what nodes send waits (`PlanWatch.rollingOut`),
 * so the roll-out and the reports it causes do not share serve's thread chunk by chunk. The hold covers the sending
 * only: a roll-out that finds nothing to send, as at a takeover, holds nothing. On a real NATS bus and SQLite store,
 * with the bus's publishing held back by the test to see the hold from the inside.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { ControlBus, ControlSide } from "../../src/bus/index.js";
import { PlanWatch } from "../../src/control/plan-watch.js";
import { pinned, planText, readPlan } from "../../src/control/plans.js";
import { loadOrCreateSigningKey } from "../../src/keys/index.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { eventually } from "../support/processes.js";
import { enrolled } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";
import type { Transport } from "../support/transports.js";
import { natsTransport } from "../support/transports.js";

describe("plan watch — ingest waits while a roll-out sends", () => {
  const dir = tempDir("mesh-rollout-hold-");
  const nodes = Array.from({ length: 300 }, (_, i) => `h${String(i).padStart(5, "0")}`);
  let transport: Transport;
  let side: ControlSide;
  let store: Store;
  // Nodes whose agents hold files: the plan's one unit is placed on every one of them.
  const fileHolder = JSON.stringify({ cpu: 2, memory_mb: 2048, labels: {}, drivers: ["file"] });

  before(async () => {
    transport = await natsTransport();
    side = await transport.openControl();
    store = await openStore(`sqlite:${join(dir.path, "store.db")}`, { historyLimit: 50 });
    for (const node of nodes) await enrolled(store, node, new Date(), fileHolder);
    const plan = pinned(
      (await readPlan(store)).plan,
      { all: true },
      {
        files: [{ type: "file", path: "/etc/held", content: "every node\n" }],
        users: [],
        groups: [],
        services: [],
      },
    );
    await store.plans.write({
      expected: 0,
      plan: planText(plan),
      at: new Date().toISOString(),
      by: "test",
      epoch: 1,
    });
  });
  after(async () => {
    await store.close();
    await side.close();
    await transport.stop();
    dir.remove();
  });

  test("plan watch — a roll-out that sends holds ingest until its declarations are sent, and one that sends nothing holds nothing", async () => {
    // The real bus, whose publishing waits until the test lets it go.
    let publishing: () => void = () => {};
    const published = new Promise<void>((resolve) => (publishing = resolve));
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => (release = resolve));
    let publishes = 0;
    const bus = new Proxy(side.bus, {
      get(target, property, receiver) {
        if (property !== "publishDeclarations") return Reflect.get(target, property, receiver) as unknown;
        return async (batch: Parameters<ControlBus["publishDeclarations"]>[0]) => {
          publishes++;
          publishing();
          await released;
          await target.publishDeclarations(batch);
        };
      },
    });
    const watch = new PlanWatch({
      context: {
        store,
        signing: loadOrCreateSigningKey(join(dir.path, "keys")),
        bus,
        now: () => new Date(),
        outOfTouchAfterMs: 45_000,
      },
      store,
      log: createLogger({ level: "error" }),
      epoch: () => 1,
      gate: () => true,
      everyMs: 50,
      revisionEveryMs: 50,
      awayEveryMs: 60_000,
    });
    try {
      assert.equal(await settledBy(watch.rollingOut(600_000)), true, "nothing is sent yet: nothing is held");
      watch.start();
      await published;
      // A bound no machine reaches: the wait can only end by the sending's end.
      const held = watch.rollingOut(600_000);
      assert.equal(await settledBy(held), false, "ingest went on while the roll-out was sending");
      release();
      await held;
      await eventually("every node to be sent its declaration", async () =>
        (await store.declarations.latestSent()).size === nodes.length ? true : undefined,
      );
      const chunks = publishes;
      // The plan is unchanged: the next looks send nothing, and nothing holds ingest.
      await eventually("the plan to be marked sent", async () =>
        (await store.plans.sent())?.revision === 1 ? true : undefined,
      );
      assert.equal(await settledBy(watch.rollingOut(600_000)), true);
      assert.equal(publishes, chunks, "an unchanged plan was sent again");
    } finally {
      release();
      await watch.stop();
    }
  });
});

/** Whether `promise` has settled once everything already queued has run (a timer's turn of the event loop). */
async function settledBy(promise: Promise<void>): Promise<boolean> {
  let settled = false;
  void promise.then(() => (settled = true));
  await new Promise((resolve) => setTimeout(resolve, 0));
  return settled;
}
