/**
 * Plan revisions on a real store (SQLite and PostgreSQL): each written by compare-and-set on the one before, every
 * revision kept, and a write whose epoch is below the floor refused by the store itself.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MeshError } from "../../src/errors.js";
import type { Store } from "../../src/store/index.js";
import { allocate } from "../../src/control/overlay.js";
import { enrolled, freshStoreForSuite, storeBackends } from "../support/stores.js";

const at = (second: number) => new Date(Date.UTC(2026, 10, 30, 12, 0, second)).toISOString();

const refusedWith = (code: string, message: RegExp) => (error: unknown) =>
  error instanceof MeshError && error.code === code && message.test(error.message);

for (const backend of storeBackends) {
  describe(`plans (${backend.name})`, () => {
    let store: Store;
    freshStoreForSuite(backend, { historyLimit: 5 }, (opened) => (store = opened));

    test("store — revisions by compare-and-set: the next one lands, one based on an older revision is refused", async () => {
      await store.epochs.record(3, "holder-a", at(0));
      assert.equal(await store.plans.current(), undefined);
      assert.equal(
        await store.plans.write({ expected: 0, plan: '{"units":[]}', at: at(1), by: "a", epoch: 3 }),
        1,
      );
      assert.equal(
        await store.plans.write({ expected: 1, plan: '{"units":[1]}', at: at(2), by: "a", epoch: 3 }),
        2,
      );
      await assert.rejects(
        store.plans.write({ expected: 1, plan: '{"units":[2]}', at: at(3), by: "b", epoch: 3 }),
        refusedWith("plan_changed", /^plan changed since revision 1$/),
      );
      // Two writers on the same revision at once: exactly one lands.
      const raced = await Promise.allSettled(
        ["x", "y"].map((by) =>
          store.plans.write({ expected: 2, plan: `{"by":"${by}"}`, at: at(4), by, epoch: 3 }),
        ),
      );
      assert.deepEqual(raced.map((outcome) => outcome.status).sort(), ["fulfilled", "rejected"]);
      const current = await store.plans.current();
      assert.equal(current?.revision, 3);
      assert.deepEqual(
        (await store.plans.history()).map((revision) => revision.revision),
        [3, 2, 1],
      );
      assert.equal((await store.plans.at(1))?.plan, '{"units":[]}');
    });

    test("store — a plan written with an epoch below the floor is refused by the store, and nothing is kept", async () => {
      const before = await store.plans.current();
      const expected = before?.revision ?? 0;
      // Another controller took the lease: its epoch is the floor now.
      await store.epochs.record(9, "holder-b", at(10));
      await assert.rejects(
        store.plans.write({ expected, plan: '{"stale":true}', at: at(11), by: "old holder", epoch: 3 }),
        refusedWith("fenced", /epoch 3 is below the floor 9/),
      );
      assert.equal((await store.plans.current())?.revision, expected, "nothing written");
      assert.equal(
        await store.plans.write({ expected, plan: '{"fresh":true}', at: at(12), by: "new holder", epoch: 9 }),
        expected + 1,
      );
    });

    test("store — conditions are replaced as a whole, keep their first sighting, and are refused below the floor", async () => {
      await store.epochs.record(20, "holder-c", at(20));
      const web = {
        unit: "web",
        wanted: 3,
        placed: 2,
        reason: "web: 3 wanted, 2 placed: only 2 nodes match",
      };
      await store.plans.writeConditions([web], 20, at(21));
      await store.plans.writeConditions(
        [web, { unit: "db", wanted: "every", placed: 0, reason: "db: no node matches" }],
        20,
        at(22),
      );
      assert.deepEqual(await store.plans.conditions(), [
        { unit: "db", wanted: "every", placed: 0, reason: "db: no node matches", epoch: 20, since: at(22) },
        { ...web, epoch: 20, since: at(21) },
      ]);
      await store.epochs.record(21, "holder-d", at(23));
      await assert.rejects(
        store.plans.writeConditions([], 20, at(24)),
        refusedWith("fenced", /conditions were not written: epoch 20 is below the floor 21/),
      );
      assert.equal((await store.plans.conditions()).length, 2, "the stale holder cleared nothing");
      await store.plans.writeConditions([], 21, at(25));
      assert.deepEqual(await store.plans.conditions(), [], "cleared when resolved");
    });

    test("store — the revision sent is marked under the epoch, never below the floor", async () => {
      await store.epochs.record(30, "holder-e", at(30));
      await store.plans.markSent(4, 30, at(31));
      assert.deepEqual(await store.plans.sent(), { revision: 4, epoch: 30, sentAt: at(31) });
      await store.plans.markSent(5, 30, at(32));
      assert.equal((await store.plans.sent())?.revision, 5);
      await assert.rejects(
        store.plans.markSent(6, 29, at(33)),
        refusedWith("fenced", /revision 6 was not marked sent: epoch 29 is below the floor 30/),
      );
      assert.equal((await store.plans.sent())?.revision, 5);
    });

    test("store — overlay addresses: given once in a transaction, kept by a retired node, never given again", async () => {
      for (const name of ["ov-1", "ov-2", "ov-3"]) await enrolled(store, name, new Date());
      const pick = (taken: ReadonlySet<string>, nodes: readonly string[]) =>
        allocate("10.99.0.0/24", taken, nodes).given;
      const first = await store.overlay.give(["ov-1", "ov-2"], pick, at(40));
      assert.deepEqual(Object.fromEntries(first), { "ov-1": "10.99.0.1", "ov-2": "10.99.0.2" });
      await store.nodes.retire("ov-1", at(41));
      const later = await store.overlay.give(["ov-3"], pick, at(42));
      assert.equal(later.get("ov-3"), "10.99.0.3", "the retired node's address is not given again");
      assert.equal((await store.overlay.addresses()).get("ov-1"), "10.99.0.1");
    });
  });
}
