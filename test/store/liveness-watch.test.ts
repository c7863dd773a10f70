/**
 * The liveness watch on a real store (SQLite and PostgreSQL): each crossing of the threshold is told once, and a
 * restarted watch reads where every node last stood from the audit trail, however much the trail has grown since.
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
    const watch = () =>
      new LivenessWatch(
        store,
        createLogger({ write: (line) => lines.push(line), pretty: false }),
        45_000,
        () => clock,
      );
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

    before(async () => {
      location = await backend.fresh();
      store = await openStore(location.url, { historyLimit: 10 });
      for (const node of ["quiet-1", "chatty-1"]) await enrolled(store, node, clock);
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

      // The audit trail grows well past one node's last crossing (a fleet's declarations, say).
      await store.events.recordMany(
        Array.from({ length: 40 }, (_, i) => ({
          at: clock.toISOString(),
          kind: "declaration.sent",
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
      assert.deepEqual(
        [...(await store.events.latestOfKinds(["node.out_of_touch", "node.back_in_touch"]))],
        [["quiet-1", "node.back_in_touch"]],
      );
    });
  });
}
