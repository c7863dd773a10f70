/**
 * The audit trail is bounded by what it names, not by its rows: a roll-out's chunk (`declarations.sent`) counts the
 * nodes it names, any other event one, and the retention counts what was recorded since its last run and keeps at
 * most its bound's worth, newest first. On both stores, counted in the table itself; a store of the release before
 * has its events counted, in order, when it is migrated; and on SQLite each of the retention's statements goes
 * through `events_counted`, not over the whole trail.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Kysely, SqliteDialect, sql } from "kysely";
import { countRecorded, newestCounted } from "../../src/store/events.js";
import type { MeshEvent, SentInChunk, Store } from "../../src/store/index.js";
import { declarationsSentEvent, eventWeight, openStore } from "../../src/store/index.js";
import type { Database } from "../../src/store/schema.js";
import type { StoreBackend } from "../support/stores.js";
import { migrateStoreTo, rawStoreDb, storeBackends } from "../support/stores.js";

const at = (second: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, second)).toISOString();

function plain(kind: string, second = 0): MeshEvent {
  return { at: at(second), kind, node: null, epoch: null, detail: {} };
}

function chunk(names: readonly string[], second = 0): MeshEvent {
  const sent: SentInChunk[] = names.map((node, i) => ({
    node,
    sequence: i + 1,
    digest: "sha256:aa",
    items: 2,
  }));
  return declarationsSentEvent(at(second), 1, sent);
}

const kinds = (events: readonly MeshEvent[]) => events.map((event) => event.kind);

/** Each event's weight and count before it, oldest first, read past the store. */
async function countsOf(url: string): Promise<Array<[string, number, number | null]>> {
  const db = rawStoreDb(url);
  try {
    const { rows } = await sql<{
      kind: string;
      weight: number | string;
      counted_before: number | string | null;
    }>`select kind, weight, counted_before from events order by id`.execute(db);
    return rows.map((row) => [
      row.kind,
      Number(row.weight),
      row.counted_before === null ? null : Number(row.counted_before),
    ]);
  } finally {
    await db.destroy();
  }
}

describe("events — what each counts for", () => {
  test("a roll-out's chunk counts the nodes it names; any other event, and a chunk of one node, one", () => {
    assert.equal(eventWeight(chunk(["a", "b", "c"])), 3);
    assert.equal(eventWeight(chunk(["a"])), 1);
    assert.equal(eventWeight(plain("node.enrolled")), 1);
    assert.equal(
      eventWeight({ ...plain("node.enrolled"), detail: { nodes: 40 } }),
      1,
      "only a chunk counts nodes",
    );
    assert.equal(eventWeight({ ...chunk(["a", "b"]), detail: { nodes: "2" } }), 1, "a count not a number");
  });
});

/** A store of its own on `backend`, open for `work`, closed and removed after. */
async function withStore(
  backend: StoreBackend,
  work: (store: Store, url: string) => Promise<void>,
): Promise<void> {
  const location = await backend.fresh();
  try {
    const store = await openStore(location.url, { historyLimit: 50 });
    try {
      await work(store, location.url);
    } finally {
      await store.close();
    }
  } finally {
    await location.cleanup();
  }
}

const everything = { before: at(0), keepAtMost: 1_000_000 };

for (const backend of storeBackends) {
  describe(`events — the retention counts what the trail names (${backend.name})`, () => {
    test("keeps at most its bound's worth, newest first: a chunk of five goes when five no longer fit", async () => {
      await withStore(backend, async (store, url) => {
        for (const kind of ["old.1", "old.2", "old.3"]) await store.events.record(plain(kind));
        await store.events.record(chunk(["n1", "n2", "n3", "n4", "n5"]));
        await store.events.recordMany([plain("new.1"), plain("new.2")]);
        assert.deepEqual(
          await countsOf(url),
          [
            ["old.1", 1, null],
            ["old.2", 1, null],
            ["old.3", 1, null],
            ["declarations.sent", 5, null],
            ["new.1", 1, null],
            ["new.2", 1, null],
          ],
          "recorded, not yet counted",
        );
        assert.equal(await store.events.prune({ before: at(0), keepAtMost: 10 }), 0, "exactly ten, all kept");
        assert.deepEqual(
          (await countsOf(url)).map(([, , before]) => before),
          [0, 1, 2, 3, 8, 9],
        );
        assert.equal(await store.events.prune({ before: at(0), keepAtMost: 7 }), 3);
        assert.deepEqual(kinds(await store.events.list({ limit: 100 })), [
          "declarations.sent",
          "new.1",
          "new.2",
        ]);
        // Six: the chunk and the two after it count seven.
        assert.equal(await store.events.prune({ before: at(0), keepAtMost: 6 }), 1);
        assert.deepEqual(kinds(await store.events.list({ limit: 100 })), ["new.1", "new.2"]);
        assert.equal(await store.events.prune({ before: at(0), keepAtMost: 6 }), 0);
      });
    });

    test("what is recorded after a run is counted on from the newest counted, at the next", async () => {
      await withStore(backend, async (store, url) => {
        await store.events.record(plain("first"));
        await store.events.prune(everything);
        await assert.rejects(
          store.transaction(async (tx) => {
            await tx.events.record(chunk(["x", "y"]));
            throw new Error("stopped part-way");
          }),
          /stopped part-way/,
        );
        await store.events.recordMany([chunk(["a", "b", "c"]), plain("second")]);
        await store.events.prune(everything);
        assert.deepEqual(await countsOf(url), [
          ["first", 1, 0],
          ["declarations.sent", 3, 1],
          ["second", 1, 4],
        ]);
      });
    });

    test("the newest event stays, whatever it counts: a chunk heavier than the bound", async () => {
      await withStore(backend, async (store) => {
        await store.events.recordMany([plain("before"), chunk(["a", "b", "c", "d", "e"])]);
        assert.equal(await store.events.prune({ before: at(0), keepAtMost: 2 }), 1);
        assert.deepEqual(kinds(await store.events.list({ limit: 100 })), ["declarations.sent"]);
      });
    });

    if (backend.name === "postgres") {
      test("two recording at once: each counted once it is committed, after those counted before it", async () => {
        await withStore(backend, async (store, url) => {
          // The first records its chunk and stays open while the second records and commits, and the retention
          // runs: it sees the second's event alone (the first's is not committed), and counts it.
          let firstRecorded!: () => void;
          const recordedFirst = new Promise<void>((resolve) => (firstRecorded = resolve));
          let commitFirst!: () => void;
          const firstMayCommit = new Promise<void>((resolve) => (commitFirst = resolve));
          const first = store.transaction(async (tx) => {
            await tx.events.record(chunk(["a", "b", "c", "d", "e"]));
            firstRecorded();
            await firstMayCommit;
          });
          await recordedFirst;
          await store.transaction((tx) => tx.events.record(plain("beside")));
          await store.events.prune(everything);
          commitFirst();
          await first;
          await store.events.record(plain("after"));
          await store.events.prune(everything);
          // In the order of ids, the chunk comes first; it is counted after "beside", which was committed first.
          assert.deepEqual(await countsOf(url), [
            ["declarations.sent", 5, 1],
            ["beside", 1, 0],
            ["after", 1, 6],
          ]);
          assert.equal(await store.events.prune({ before: at(0), keepAtMost: 6 }), 1);
          assert.deepEqual(kinds(await store.events.list({ limit: 100 })), ["declarations.sent", "after"]);
        });
      });
    }

    test("a store of the release before: its events counted in order when migrated, and counted on after", async () => {
      const location = await backend.fresh();
      try {
        const db = rawStoreDb(location.url);
        try {
          await migrateStoreTo(db, backend.name, "0017_accounts_ring");
          const odd = (nodes: unknown): MeshEvent => ({ ...chunk(["p", "q"]), detail: { nodes } });
          for (const event of [
            plain("old.1"),
            chunk(["a", "b", "c"]),
            plain("old.2"),
            chunk(["d"]),
            // Not as a chunk is written: each counts one.
            odd("7"),
            odd(2.5),
            odd(null),
          ]) {
            await db
              .insertInto("events" as never)
              .values({ ...event, detail: JSON.stringify(event.detail) })
              .execute();
          }
        } finally {
          await db.destroy();
        }
        const store = await openStore(location.url, { historyLimit: 50 });
        try {
          assert.deepEqual(await countsOf(location.url), [
            ["old.1", 1, 0],
            ["declarations.sent", 3, 1],
            ["old.2", 1, 4],
            ["declarations.sent", 1, 5],
            ["declarations.sent", 1, 6],
            ["declarations.sent", 1, 7],
            ["declarations.sent", 1, 8],
          ]);
          await store.events.record(plain("new.1"));
          assert.deepEqual((await countsOf(location.url)).at(-1), ["new.1", 1, null]);
          assert.equal(await store.events.prune({ before: at(0), keepAtMost: 6 }), 2);
          assert.deepEqual((await countsOf(location.url)).at(-1), ["new.1", 1, 9]);
          assert.deepEqual(kinds(await store.events.list({ limit: 100 })), [
            "old.2",
            "declarations.sent",
            "declarations.sent",
            "declarations.sent",
            "declarations.sent",
            "new.1",
          ]);
        } finally {
          await store.close();
        }
      } finally {
        await location.cleanup();
      }
    });
  });
}

test("events — on SQLite the retention's statements go through events_counted, not over the whole trail", async () => {
  await withStore(storeBackends[0] as StoreBackend, async (_store, url) => {
    const file = new SqliteDatabase(url.slice("sqlite:".length), { readonly: true });
    const db = new Kysely<Database>({ dialect: new SqliteDialect({ database: file }) });
    try {
      const statements = [
        newestCounted(db).compile(),
        countRecorded(0).compile(db),
        db.deleteFrom("events").where("counted_before", "<", 0).compile(),
      ];
      for (const { sql: text, parameters } of statements) {
        const plan = file
          .prepare(`explain query plan ${text}`)
          .all(...(parameters as unknown[]))
          .map((row) => (row as { detail: string }).detail);
        assert.ok(
          plan.some((step) => /USING (COVERING )?INDEX events_counted\b/.test(step)),
          `${text}: through events_counted: ${plan.join(" | ")}`,
        );
        assert.ok(
          !plan.some((step) => /^SCAN (TABLE )?events\b/.test(step) && !/INDEX/.test(step)),
          `${text}: no pass over the whole trail: ${plan.join(" | ")}`,
        );
      }
    } finally {
      await db.destroy();
    }
  });
});
