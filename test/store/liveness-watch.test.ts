/**
 * The liveness watch on a real store (SQLite and PostgreSQL): each crossing of the threshold is told once, and a
 * restarted watch reads where every node last stood from the audit trail, however much the trail has grown since.
 * A silence that crossed the threshold between two checks is told too; one that crossed it only over time nobody
 * listened is not.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { LivenessWatch } from "../../src/control/liveness-watch.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { enrolled, storeBackends } from "../support/stores.js";

for (const backend of storeBackends) {
  describe(`liveness watch (${backend.name})`, () => {
    let location: { url: string; cleanup(): Promise<void> };
    let store: Store;
    const lines: string[] = [];
    let clock = new Date("2026-06-01T12:00:00.000Z");
    const watchOn = (watched: Store) =>
      new LivenessWatch(
        watched,
        createLogger({ write: (line) => lines.push(line), pretty: false }),
        45_000,
        () => clock,
      );
    const watch = () => watchOn(store);
    /**
     * A store of its own, for a test whose nodes the other tests' looks would tell, or whose hearing would cut short
     * their silences.
     */
    const onOwnStore = async (work: (own: Store) => Promise<void>) => {
      const location = await backend.fresh();
      const own = await openStore(location.url, { historyLimit: 10 });
      try {
        await work(own);
      } finally {
        await own.close();
        await location.cleanup();
      }
    };
    /** A watch started afresh (as after a restart) and checked twice: a crossing is told once at most. */
    const checkedTwice = async () => {
      const started = watch();
      await started.check();
      await started.check();
    };
    const told = (event: string) =>
      lines
        .filter((line) => (JSON.parse(line) as { event: string }).event === event)
        .map((line) => (JSON.parse(line) as { node: string }).node);
    const toldOf = (node: string) =>
      lines
        .map((line) => JSON.parse(line) as { event: string; node?: string; silent_for_s?: number })
        .filter((line) => line.node === node);
    const later = (ms: number) => (clock = new Date(clock.getTime() + ms));

    before(async () => {
      location = await backend.fresh();
      store = await openStore(location.url, { historyLimit: 10 });
      for (const node of ["quiet-1", "chatty-1", "brief-1"]) await enrolled(store, node, clock);
    });
    after(async () => {
      await store.close();
      await location.cleanup();
    });

    test("liveness watch — a node going quiet is told once, and a restarted watch does not tell it again", async () => {
      await store.nodes.touch(
        new Map([
          ["quiet-1", clock.toISOString()],
          ["chatty-1", clock.toISOString()],
        ]),
      );
      clock = new Date(clock.getTime() + 60_000);
      await store.nodes.touch(new Map([["chatty-1", clock.toISOString()]]));
      await checkedTwice();
      assert.deepEqual(told("node.out_of_touch"), ["quiet-1"]);

      // The audit trail grows well past one node's last crossing (the node's drift, say).
      await store.events.recordMany(
        Array.from({ length: 40 }, (_, i) => ({
          at: clock.toISOString(),
          kind: "node.drift",
          node: "quiet-1",
          epoch: 1,
          detail: { sequence: i + 1 },
        })),
      );
      await watch().check();
      assert.deepEqual(told("node.out_of_touch"), ["quiet-1"], "the restarted watch knew where it stood");

      clock = new Date(clock.getTime() + 1000);
      await store.nodes.touch(new Map([["quiet-1", clock.toISOString()]]));
      await checkedTwice();
      assert.deepEqual(told("node.back_in_touch"), ["quiet-1"]);
      assert.deepEqual([...(await store.events.latestCrossings())], [["quiet-1", "node.back_in_touch"]]);
    });

    test("liveness watch — a node silent past the threshold and back between two checks is told gone and back", async () => {
      const watching = watch();
      await store.nodes.touch(new Map([["brief-1", clock.toISOString()]]));
      await watching.check();
      assert.deepEqual(toldOf("brief-1"), [], "heard just now: nothing to tell");

      // Silent for 60 s against a threshold of 45 s, heard again before the watch looked.
      later(60_000);
      await store.nodes.touch(new Map([["brief-1", clock.toISOString()]]));
      // A look asked for during another is that one, never a second on older readings beside it.
      const looks = [watching.check(), watching.check()];
      assert.equal(looks[0], looks[1]);
      await Promise.all(looks);
      await watching.check();
      assert.deepEqual(
        toldOf("brief-1").map(({ event, silent_for_s }) => [event, silent_for_s]),
        [
          ["node.out_of_touch", 60],
          ["node.back_in_touch", undefined],
        ],
      );
      assert.equal(
        (await store.events.latestCrossings()).get("brief-1"),
        "node.back_in_touch",
        "the trail ends with it back",
      );

      // A silence just under the threshold is no crossing.
      later(44_000);
      await store.nodes.touch(new Map([["brief-1", clock.toISOString()]]));
      await watching.check();
      assert.equal(toldOf("brief-1").length, 2);

      // Out of touch at one look, heard once, and out of touch again at the next: back, then gone again.
      later(60_000);
      await watching.check();
      later(1000);
      await store.nodes.touch(new Map([["brief-1", clock.toISOString()]]));
      later(60_000);
      await watching.check();
      await watching.check();
      assert.deepEqual(
        toldOf("brief-1")
          .slice(2)
          .map(({ event, silent_for_s }) => [event, silent_for_s]),
        [
          ["node.out_of_touch", 60],
          ["node.back_in_touch", undefined],
          ["node.out_of_touch", 60],
        ],
      );
    });

    test("liveness watch — a silence past the threshold only counting time nobody listened is no crossing", async () => {
      await onOwnStore(async (deafStore) => {
        await enrolled(deafStore, "deafened-1", clock);
        const watching = watchOn(deafStore);
        const start = clock;
        await deafStore.nodes.touch(new Map([["deafened-1", start.toISOString()]]));
        await deafStore.hearing.begin(start.toISOString());
        await watching.check();
        // Heard for 10 s, deaf for 40 s, heard again for 10 s: 60 s of silence, at most 10 s of it listened to.
        await deafStore.hearing.heard(later(10_000).toISOString(), start.toISOString());
        await deafStore.hearing.begin(later(40_000).toISOString());
        const since = clock;
        later(10_000);
        await deafStore.hearing.heard(clock.toISOString(), since.toISOString());
        await deafStore.nodes.touch(new Map([["deafened-1", clock.toISOString()]]));
        await watching.check();
        assert.deepEqual(toldOf("deafened-1"), []);

        // The same silence, all of it listened to, is told.
        later(50_000);
        await deafStore.hearing.heard(clock.toISOString(), since.toISOString());
        await deafStore.nodes.touch(new Map([["deafened-1", clock.toISOString()]]));
        await watching.check();
        assert.deepEqual(
          toldOf("deafened-1").map(({ event }) => event),
          ["node.out_of_touch", "node.back_in_touch"],
        );
      });
    });

    test("liveness watch — a node out of touch whose old messages are taken late is not told back and gone at each look", async () => {
      const events = () => toldOf("s1").map(({ event }) => event);
      await onOwnStore(async (lateStore) => {
        const watching = watchOn(lateStore);
        await enrolled(lateStore, "s1", clock);
        const spoke = clock;
        await lateStore.nodes.touch(new Map([["s1", spoke.toISOString()]]));
        await watching.check();
        later(60_000);
        await watching.check();
        assert.deepEqual(events(), ["node.out_of_touch"]);

        // A backlog from before the outage is taken now: the broker had each message 50 to 58 s before this look,
        // already past the threshold at the look before it. The node was never back.
        for (const ago of [58_000, 54_000, 50_000]) {
          await lateStore.nodes.touch(new Map([["s1", new Date(clock.getTime() - ago).toISOString()]]));
          later(1000);
          await watching.check();
        }
        assert.deepEqual(events(), ["node.out_of_touch"], "nothing told while its old messages were taken");

        // A message the broker had within the threshold of the last look: the node was back, and went again.
        await lateStore.nodes.touch(new Map([["s1", new Date(clock.getTime() - 44_000).toISOString()]]));
        later(2000);
        await watching.check();
        assert.deepEqual(events(), ["node.out_of_touch", "node.back_in_touch", "node.out_of_touch"]);

        // Heard just now: back.
        await lateStore.nodes.touch(new Map([["s1", clock.toISOString()]]));
        await watching.check();
        assert.deepEqual(events(), [
          "node.out_of_touch",
          "node.back_in_touch",
          "node.out_of_touch",
          "node.back_in_touch",
        ]);
      });
    });

    test("liveness watch — a fleet going out of touch together is kept in one write; crossings not kept are told at the next look", async () => {
      await onOwnStore(async (fleetStore) => {
        const flock = ["f1", "f2", "f3"];
        const writes: number[] = [];
        let refuseNext = false;
        // The real store, whose events refuse one write when told to, as a store that went away would.
        const events = new Proxy(fleetStore.events, {
          get(target, property, receiver) {
            if (property !== "recordMany") return Reflect.get(target, property, receiver) as unknown;
            return async (written: Parameters<Store["events"]["recordMany"]>[0]) => {
              writes.push(written.length);
              if (refuseNext) {
                refuseNext = false;
                throw new Error("the store refused the write");
              }
              await target.recordMany(written);
            };
          },
        });
        const watched = new Proxy(fleetStore, {
          get: (target, property, receiver) =>
            property === "events" ? events : (Reflect.get(target, property, receiver) as unknown),
        });
        const watching = watchOn(watched);
        const toldOfFlock = () =>
          flock.flatMap((node) => toldOf(node).map(({ event }) => `${node} ${event}`));
        for (const node of flock) await enrolled(fleetStore, node, clock);
        await fleetStore.nodes.touch(new Map(flock.map((node) => [node, clock.toISOString()])));
        await watching.check();
        assert.deepEqual(writes, [], "nobody crossed: nothing written");

        later(60_000);
        refuseNext = true;
        await assert.rejects(watching.check(), /the store refused the write/);
        assert.deepEqual(writes, [3], "the three crossings were one write");
        assert.deepEqual(toldOfFlock(), [], "nothing told that the audit trail does not hold");
        assert.equal((await fleetStore.events.latestCrossings()).size, 0);

        await watching.check();
        assert.deepEqual(writes, [3, 3], "the next look wrote the same three, again in one write");
        assert.deepEqual(
          toldOfFlock(),
          flock.map((node) => `${node} node.out_of_touch`),
        );
        assert.deepEqual(
          [...(await fleetStore.events.latestCrossings())].sort(),
          flock.map((node) => [node, "node.out_of_touch"]),
        );

        await watching.check();
        assert.deepEqual(writes, [3, 3], "told once");
      });
    });
  });
}
