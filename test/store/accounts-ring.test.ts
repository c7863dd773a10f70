/**
 * A node's accounts are a ring of `historyLimit` places: each is kept in place of the one that many older, so the
 * table never holds more than the history a node, the history reads the newest first, and the recovery copy is the
 * newest whatever the history holds. On both stores, counted in the tables themselves; and a store migrated from
 * the release before (accounts inserted and trimmed) carries each node's newest accounts over in order.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { sql } from "kysely";
import type { AccountRecord } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { enrolled, migrateStoreTo, rawStoreDb, storeBackends } from "../support/stores.js";

function account(node: string, n: number): AccountRecord {
  return {
    node,
    receivedAt: new Date(Date.UTC(2026, 0, 1, 0, 0, n)).toISOString(),
    epoch: 1,
    sequence: 1,
    reportSequence: n,
    digest: "sha256:aa",
    outcome: "applied",
    report: JSON.stringify({ n }),
  };
}

async function rowsOf(url: string, node: string): Promise<number> {
  const db = rawStoreDb(url);
  try {
    const { rows } = await sql<{
      n: number | string;
    }>`select count(*) as n from accounts where node = ${node}`.execute(db);
    return Number(rows[0]?.n);
  } finally {
    await db.destroy();
  }
}

const sequences = (accounts: readonly AccountRecord[]) => accounts.map((kept) => kept.reportSequence);

for (const backend of storeBackends) {
  describe(`accounts — a ring of the history's places (${backend.name})`, () => {
    test("never more rows than the history; the history newest first; the recovery copy the newest", async () => {
      const location = await backend.fresh();
      try {
        const store = await openStore(location.url, { historyLimit: 3 });
        try {
          await enrolled(store, "ring-one", new Date());
          await enrolled(store, "ring-many", new Date());
          await enrolled(store, "ring-quiet", new Date());
          const counts: number[] = [];
          for (let n = 1; n <= 8; n++) {
            await store.accounts.keep(account("ring-one", n));
            counts.push(await rowsOf(location.url, "ring-one"));
            assert.deepEqual(
              sequences(await store.accounts.history("ring-one")),
              [n, n - 1, n - 2].filter((sequence) => sequence >= 1),
            );
            assert.equal((await store.accounts.recoveryCopy("ring-one"))?.reportSequence, n);
          }
          assert.deepEqual(counts, [1, 2, 3, 3, 3, 3, 3, 3]);

          // Many of one node's accounts in one batch: the newest three kept, numbered on from the node's newest.
          await store.accounts.keepMany([
            ...Array.from({ length: 25 }, (_, i) => account("ring-many", i + 1)),
            account("ring-one", 9),
          ]);
          assert.deepEqual(sequences(await store.accounts.history("ring-many")), [25, 24, 23]);
          assert.equal(await rowsOf(location.url, "ring-many"), 3);
          await store.accounts.keepMany(Array.from({ length: 2 }, (_, i) => account("ring-many", 26 + i)));
          assert.deepEqual(sequences(await store.accounts.history("ring-many")), [27, 26, 25]);

          const copies = await store.accounts.recoveryCopies([
            "ring-one",
            "ring-many",
            "ring-quiet",
            "ring-one",
          ]);
          assert.deepEqual(
            [...copies].map(([node, copy]) => [node, copy.reportSequence]).sort(),
            [
              ["ring-many", 27],
              ["ring-one", 9],
            ],
            "a node that never reported has no recovery copy",
          );

          // A batch that fails half-way keeps nothing, and the next numbers on from what was kept.
          await assert.rejects(
            store.transaction(async (tx) => {
              await tx.accounts.keep(account("ring-one", 10));
              throw new Error("the batch failed half-way");
            }),
            /half-way/,
          );
          assert.deepEqual(sequences(await store.accounts.history("ring-one")), [9, 8, 7]);
          await store.accounts.keep(account("ring-one", 11));
          assert.deepEqual(sequences(await store.accounts.history("ring-one")), [11, 9, 8]);
        } finally {
          await store.close();
        }

        // Another process with a shorter history lays the node's ring out again at its next account: exactly the
        // newest two, the rest deleted.
        const shorter = await openStore(location.url, { historyLimit: 2 });
        try {
          await shorter.accounts.keep(account("ring-one", 12));
          assert.deepEqual(sequences(await shorter.accounts.history("ring-one")), [12, 11]);
          assert.equal((await shorter.accounts.recoveryCopy("ring-one"))?.reportSequence, 12);
          assert.equal(await rowsOf(location.url, "ring-one"), 2);
          // A node it has not kept an account for yet reads as it was laid out.
          assert.deepEqual(sequences(await shorter.accounts.history("ring-many")), [27, 26]);
        } finally {
          await shorter.close();
        }
        // And a longer one: none of the newest overwritten while the history grows back to five.
        const longer = await openStore(location.url, { historyLimit: 5 });
        try {
          const histories: Array<Array<number | null>> = [];
          for (let n = 13; n <= 16; n++) {
            await longer.accounts.keep(account("ring-one", n));
            histories.push(sequences(await longer.accounts.history("ring-one")));
            assert.equal((await longer.accounts.recoveryCopy("ring-one"))?.reportSequence, n);
          }
          assert.deepEqual(histories, [
            [13, 12, 11],
            [14, 13, 12, 11],
            [15, 14, 13, 12, 11],
            [16, 15, 14, 13, 12],
          ]);
          assert.equal(await rowsOf(location.url, "ring-one"), 5);
        } finally {
          await longer.close();
        }
      } finally {
        await location.cleanup();
      }
    });

    test("a store of the release before: each node's newest accounts carried over in order, numbered on after", async () => {
      const location = await backend.fresh();
      try {
        const db = rawStoreDb(location.url);
        try {
          await migrateStoreTo(db, backend.name, "0016_crossings_by_node", 3);
          for (const name of ["old-1", "old-2", "old-3"]) {
            await db
              .insertInto("nodes" as never)
              .values({ name, state: "enrolled", created_at: "2026-11-01T00:00:00.000Z" })
              .execute();
          }
          // Interleaved, as a fleet's reports come: old-1 five accounts, old-2 two, old-3 none.
          for (const [node, n] of [
            ["old-1", 1],
            ["old-2", 1],
            ["old-1", 2],
            ["old-1", 3],
            ["old-2", 2],
            ["old-1", 4],
            ["old-1", 5],
          ] as const) {
            const { node: _node, receivedAt, reportSequence, ...rest } = account(node, n);
            await db
              .insertInto("accounts" as never)
              .values({
                node,
                received_at: receivedAt,
                report_sequence: reportSequence,
                epoch: rest.epoch,
                sequence: rest.sequence,
                digest: rest.digest,
                outcome: rest.outcome,
                report: rest.report,
              })
              .execute();
          }
        } finally {
          await db.destroy();
        }
        const store = await openStore(location.url, { historyLimit: 3 });
        try {
          assert.deepEqual(sequences(await store.accounts.history("old-1")), [5, 4, 3]);
          assert.deepEqual(sequences(await store.accounts.history("old-2")), [2, 1]);
          assert.deepEqual(await store.accounts.history("old-3"), []);
          const copies = await store.accounts.recoveryCopies(["old-1", "old-2", "old-3"]);
          assert.deepEqual([...copies].map(([node, copy]) => [node, copy.reportSequence]).sort(), [
            ["old-1", 5],
            ["old-2", 2],
          ]);
          assert.equal(await rowsOf(location.url, "old-1"), 3, "the older than the history are gone");
          await store.accounts.keepMany([account("old-1", 6), account("old-2", 3), account("old-3", 1)]);
          assert.deepEqual(sequences(await store.accounts.history("old-1")), [6, 5, 4]);
          assert.deepEqual(sequences(await store.accounts.history("old-2")), [3, 2, 1]);
          assert.deepEqual(sequences(await store.accounts.history("old-3")), [1]);
        } finally {
          await store.close();
        }
      } finally {
        await location.cleanup();
      }
    });
  });
}
