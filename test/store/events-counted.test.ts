/**
 * The audit trail is bounded by what it names, not by its rows: a roll-out's chunk (`declarations.sent`) counts the
 * nodes it names, any other event one, and the retention keeps at most its bound's worth, newest first. On both
 * stores; and a store of the release before has its events counted, in order, when it is migrated.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Kysely, Migrator, PostgresDialect, SqliteDialect, sql } from "kysely";
import pg from "pg";
import type { MeshEvent, SentInChunk } from "../../src/store/index.js";
import { declarationsSentEvent, eventWeight, openStore } from "../../src/store/index.js";
import { migrationProvider } from "../../src/store/migrations.js";
import { storeBackends } from "../support/stores.js";

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
async function countsOf(url: string): Promise<Array<[string, number, number]>> {
  const db = new Kysely<unknown>({
    dialect: url.startsWith("sqlite:")
      ? new SqliteDialect({ database: new SqliteDatabase(url.slice("sqlite:".length)) })
      : new PostgresDialect({ pool: new pg.Pool({ connectionString: url, max: 1 }) }),
  });
  try {
    const { rows } = await sql<{
      kind: string;
      weight: number | string;
      counted_before: number | string;
    }>`select kind, weight, counted_before from events order by id`.execute(db);
    return rows.map((row) => [row.kind, Number(row.weight), Number(row.counted_before)]);
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

for (const backend of storeBackends) {
  describe(`events — the retention counts what the trail names (${backend.name})`, () => {
    test("keeps at most its bound's worth, newest first: a chunk of five goes when five no longer fit", async () => {
      const location = await backend.fresh();
      try {
        const store = await openStore(location.url, { historyLimit: 50 });
        try {
          for (const kind of ["old.1", "old.2", "old.3"]) await store.events.record(plain(kind));
          await store.events.record(chunk(["n1", "n2", "n3", "n4", "n5"]));
          await store.events.recordMany([plain("new.1"), plain("new.2")]);
          assert.deepEqual(await countsOf(location.url), [
            ["old.1", 1, 0],
            ["old.2", 1, 1],
            ["old.3", 1, 2],
            ["declarations.sent", 5, 3],
            ["new.1", 1, 8],
            ["new.2", 1, 9],
          ]);
          assert.equal(
            await store.events.prune({ before: at(0), keepAtMost: 10 }),
            0,
            "exactly ten, all kept",
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
        } finally {
          await store.close();
        }
      } finally {
        await location.cleanup();
      }
    });

    test("a transaction rolled back counts nothing: the next event is counted from the newest kept", async () => {
      const location = await backend.fresh();
      try {
        const store = await openStore(location.url, { historyLimit: 50 });
        try {
          await store.events.record(plain("first"));
          await assert.rejects(
            store.transaction(async (tx) => {
              await tx.events.record(chunk(["a", "b", "c", "d"]));
              throw new Error("stopped part-way");
            }),
            /stopped part-way/,
          );
          await store.events.record(plain("second"));
          assert.deepEqual(await countsOf(location.url), [
            ["first", 1, 0],
            ["second", 1, 1],
          ]);
        } finally {
          await store.close();
        }
      } finally {
        await location.cleanup();
      }
    });

    if (backend.name === "postgres") {
      test("two recording at once: the count falls behind, never ahead, so the retention keeps more", async () => {
        const location = await backend.fresh();
        try {
          const store = await openStore(location.url, { historyLimit: 50 });
          try {
            // The first records its chunk and waits while the second records inside its own transaction: the
            // second reads the trail's count without the first's uncommitted chunk.
            let firstRecorded!: () => void;
            const recordedFirst = new Promise<void>((resolve) => (firstRecorded = resolve));
            let secondRecorded!: () => void;
            const recordedSecond = new Promise<void>((resolve) => (secondRecorded = resolve));
            await Promise.all([
              store.transaction(async (tx) => {
                await tx.events.record(chunk(["a", "b", "c", "d", "e"]));
                firstRecorded();
                await recordedSecond;
              }),
              store.transaction(async (tx) => {
                await recordedFirst;
                await tx.events.record(plain("beside"));
                secondRecorded();
              }),
            ]);
            await store.events.record(plain("after"));
            const counts = await countsOf(location.url);
            assert.deepEqual(
              counts.slice(0, 2).map(([, , before]) => before),
              [0, 0],
              "both counted from the same count",
            );
            // Counted exactly, the newest six are "after" and "beside" (the chunk's five do not fit): the retention
            // keeps at least those.
            await store.events.prune({ before: at(0), keepAtMost: 6 });
            const kept = kinds(await store.events.list({ limit: 100 }));
            assert.ok(kept.includes("after") && kept.includes("beside"), kept.join(", "));
            // And one: "after" alone.
            await store.events.prune({ before: at(0), keepAtMost: 1 });
            assert.deepEqual(kinds(await store.events.list({ limit: 100 })), ["after"]);
          } finally {
            await store.close();
          }
        } finally {
          await location.cleanup();
        }
      });
    }

    test("a store of the release before: its events counted in order when migrated, and counted on after", async () => {
      const location = await backend.fresh();
      try {
        const db = new Kysely<unknown>({
          dialect:
            backend.name === "sqlite"
              ? new SqliteDialect({ database: new SqliteDatabase(location.url.slice("sqlite:".length)) })
              : new PostgresDialect({ pool: new pg.Pool({ connectionString: location.url, max: 1 }) }),
        });
        try {
          const migrator = new Migrator({
            db,
            provider: migrationProvider(backend.name, { historyLimit: 50 }),
          });
          const { error } = await migrator.migrateTo("0017_accounts_ring");
          assert.equal(error, undefined);
          for (const event of [plain("old.1"), chunk(["a", "b", "c"]), plain("old.2"), chunk(["d"])]) {
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
          ]);
          await store.events.record(plain("new.1"));
          assert.deepEqual((await countsOf(location.url)).at(-1), ["new.1", 1, 6]);
          assert.equal(await store.events.prune({ before: at(0), keepAtMost: 3 }), 2);
          assert.deepEqual(kinds(await store.events.list({ limit: 100 })), [
            "old.2",
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
