/**
 * Plan revisions on a real store (SQLite and PostgreSQL): each written by compare-and-set on the one before, every
 * revision kept, and a write whose epoch is below the floor refused by the store itself.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MeshError } from "../../src/errors.js";
import type { Store } from "../../src/store/index.js";
import { freshStoreForSuite, storeBackends } from "../support/stores.js";

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
  });
}
