/**
 * A roll-out's sending, as the acting control plane's plan watch does it. While it sends, what nodes send waits
 * (`PlanWatch.rollingOut`), so the roll-out and the reports it causes do not share serve's thread chunk by chunk; a
 * roll-out that finds nothing to send, as at a takeover, holds nothing. A sending that fails part-way leaves a chunk
 * recorded that the broker may not have taken: the next look sends it again before anything newer. On a real NATS
 * bus and SQLite store, the bus's publishing held back or failed by the test to see each from the inside.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { ControlBus, ControlSide } from "../../src/bus/index.js";
import { declarationChunk } from "../../src/control/declarations.js";
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

describe("plan watch — a roll-out's sending", () => {
  const dir = tempDir("mesh-rollout-hold-");
  // One whole chunk and some more.
  const nodes = Array.from({ length: declarationChunk + 50 }, (_, i) => `h${String(i).padStart(5, "0")}`);
  let transport: Transport;
  let side: ControlSide;
  const stores: Store[] = [];
  // Nodes whose agents hold files: the plan's one unit is placed on every one of them.
  const fileHolder = JSON.stringify({ cpu: 2, memory_mb: 2048, labels: {}, drivers: ["file"] });

  before(async () => {
    transport = await natsTransport();
    side = await transport.openControl();
  });
  after(async () => {
    for (const store of stores) await store.close();
    await side.close();
    await transport.stop();
    dir.remove();
  });

  /** A fresh store with the whole fleet enrolled and a plan of one unit, a file, for every node. */
  async function fleetStore(name: string): Promise<Store> {
    const store = await openStore(`sqlite:${join(dir.path, `${name}.db`)}`, { historyLimit: 50 });
    stores.push(store);
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
    return store;
  }

  /** A plan watch acting at epoch 1 on `store`, sending on `bus`, looking every 50 ms. */
  function watchOn(store: Store, bus: ControlBus): PlanWatch {
    return new PlanWatch({
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
  }

  test("plan watch — a roll-out that sends holds ingest until its declarations are sent, and one that sends nothing holds nothing", async () => {
    // The real bus, whose publishing waits until the test lets it go.
    const { bus, published, release, publishes } = heldPublishing(side.bus);
    const store = await fleetStore("held");
    const watch = watchOn(store, bus);
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
      const chunks = publishes();
      // The plan is unchanged: the next looks send nothing, and nothing holds ingest.
      await eventually("the plan to be marked sent", async () =>
        (await store.plans.sent())?.revision === 1 ? true : undefined,
      );
      assert.equal(await settledBy(watch.rollingOut(600_000)), true);
      assert.equal(publishes(), chunks, "an unchanged plan was sent again");
    } finally {
      release();
      await watch.stop();
    }
  });

  test("plan watch — a roll-out slower than the hold holds ingest that long in all, not that long for each batch", async () => {
    // The real bus, whose publishing waits until the test lets it go: a broker too busy to confirm.
    const { bus, published, release } = heldPublishing(side.bus);
    const store = await fleetStore("slow");
    const watch = watchOn(store, bus);
    try {
      watch.start();
      await published;
      // The first batch waits out the hold, the sending still under way.
      await watch.rollingOut(50);
      // The next ones are not held again by the same roll-out, however long the bound they give.
      assert.equal(await settledBy(watch.rollingOut(600_000)), true, "a later batch was held again");
      assert.equal(await settledBy(watch.rollingOut(600_000)), true, "a later batch was held again");
      release();
      await eventually("the plan to be marked sent", async () =>
        (await store.plans.sent())?.revision === 1 ? true : undefined,
      );
    } finally {
      release();
      await watch.stop();
    }
  });

  test("plan watch — a roll-out whose sending failed part-way sends the recorded declarations again, before anything newer", async () => {
    const store = await fleetStore("failed-part-way");
    // The real bus; its first chunk's publishing fails as a lost connection would, after the chunk was recorded.
    const calls: string[] = [];
    let chunks = 0;
    const bus = new Proxy(side.bus, {
      get(target, property, receiver) {
        if (property === "publishDeclarations") {
          return async (batch: Parameters<ControlBus["publishDeclarations"]>[0]) => {
            if (++chunks === 1) throw new Error("the connection to the broker was lost");
            for (const { node } of batch) calls.push(`chunk ${node}`);
            await target.publishDeclarations(batch);
          };
        }
        if (property === "publishDeclaration") {
          return async (node: string, envelope: Uint8Array) => {
            calls.push(`again ${node}`);
            await target.publishDeclaration(node, envelope);
          };
        }
        return Reflect.get(target, property, receiver) as unknown;
      },
    });
    const watch = watchOn(store, bus);
    try {
      watch.start();
      await eventually("the plan to be marked sent", async () =>
        (await store.plans.sent())?.revision === 1 ? true : undefined,
      );
      const firstChunk = nodes.slice(0, declarationChunk);
      assert.deepEqual(
        calls.filter((call) => call.startsWith("again ")),
        firstChunk.map((node) => `again ${node}`),
        "the chunk recorded when the broker was lost is sent again, each node once",
      );
      assert.deepEqual(
        calls.filter((call) => call.startsWith("chunk ")),
        nodes.slice(declarationChunk).map((node) => `chunk ${node}`),
        "the rest is sent by the roll-out that follows",
      );
      assert.ok(
        calls.findIndex((call) => call.startsWith("chunk ")) >
          calls.lastIndexOf(`again ${firstChunk.at(-1) ?? ""}`),
        "the recorded chunk goes again before the roll-out that follows sends anything",
      );
      const latest = await store.declarations.latestSent();
      assert.equal(latest.size, nodes.length);
      // The recorded chunk keeps its sequence; the rest, whose sequences the failed roll-out allocated and never
      // used, have the next.
      assert.deepEqual(
        nodes.map((node) => latest.get(node)?.sequence),
        nodes.map((_node, index) => (index < declarationChunk ? 1 : 2)),
      );
    } finally {
      await watch.stop();
    }
  });
});

/** `bus` whose declarations are published only once the test releases them, counting its calls. */
function heldPublishing(bus: ControlBus): {
  bus: ControlBus;
  published: Promise<void>;
  release: () => void;
  publishes: () => number;
} {
  let publishing: () => void = () => {};
  const published = new Promise<void>((resolve) => (publishing = resolve));
  let release: () => void = () => {};
  const released = new Promise<void>((resolve) => (release = resolve));
  let publishes = 0;
  const held = new Proxy(bus, {
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
  return { bus: held, published, release, publishes: () => publishes };
}

/** Whether `promise` has settled once everything already queued has run (a timer's turn of the event loop). */
async function settledBy(promise: Promise<void>): Promise<boolean> {
  let settled = false;
  void promise.then(() => (settled = true));
  await new Promise((resolve) => setTimeout(resolve, 0));
  return settled;
}
