/**
 * Opening a store takes the migrator's own record as it stands when it names exactly the migrations this code knows:
 * the migrator is not run. A store recorded as migrated further than this code knows, or with a migration it does not
 * know in place of one it does, or missing a migration it knows, goes to the migrator, which refuses the first two,
 * naming the migration, and brings the third up to date.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Kysely, Migrator, PostgresDialect, SqliteDialect } from "kysely";
import pg from "pg";
import { StoreError } from "../../src/errors.js";
import { openStore } from "../../src/store/index.js";
import { knownMigrations, migrationProvider } from "../../src/store/migrations.js";
import type { StoreBackend } from "../support/stores.js";
import { storeBackends } from "../support/stores.js";

const options = { historyLimit: 3 };

/** Runs `work` on a connection of its own to the store at `url`, as another process has one, closed after. */
async function withOther<T>(
  backend: "sqlite" | "postgres",
  url: string,
  work: (db: Kysely<unknown>) => Promise<T>,
): Promise<T> {
  const db = new Kysely<unknown>({
    dialect:
      backend === "sqlite"
        ? new SqliteDialect({ database: new SqliteDatabase(url.slice("sqlite:".length)) })
        : new PostgresDialect({ pool: new pg.Pool({ connectionString: url, max: 1 }) }),
  });
  try {
    return await work(db);
  } finally {
    await db.destroy();
  }
}

/** Runs `work` on a fresh store the code has opened (and migrated) once; removed after. */
async function onMigratedStore(backend: StoreBackend, work: (url: string) => Promise<void>): Promise<void> {
  const location = await backend.fresh();
  try {
    await (await openStore(location.url, options)).close();
    await work(location.url);
  } finally {
    await location.cleanup();
  }
}

/** The migrations the migrator's table records. */
async function recorded(db: Kysely<unknown>): Promise<string[]> {
  const rows = await db
    .selectFrom("kysely_migration" as never)
    .select("name" as never)
    .execute();
  return rows.map((row) => (row as { name: string }).name);
}

/** Opening the store at `url` is refused with a StoreError naming `migration`. */
async function refusedNaming(url: string, migration: string): Promise<void> {
  await assert.rejects(openStore(url, options), (error: unknown) => {
    assert.ok(error instanceof StoreError, String(error));
    assert.ok(error.message.includes(migration), error.message);
    return true;
  });
}

for (const backend of storeBackends) {
  describe(`opening a migrated store (${backend.name})`, () => {
    test("migrations — a store recorded further than this code knows is refused, naming what it does not know", async () => {
      await onMigratedStore(backend, async (url) => {
        await withOther(backend.name, url, (db) =>
          db
            .insertInto("kysely_migration" as never)
            .values({ name: "9999_from_a_newer_version", timestamp: new Date().toISOString() })
            .execute(),
        );
        await refusedNaming(url, "9999_from_a_newer_version");
      });
    });

    test("migrations — a store that has recorded every migration this code knows opens without the migrator", async () => {
      await onMigratedStore(backend, async (url) => {
        // The migrator makes its lock table whenever it runs: gone, it stays gone if the migrator is not run.
        const lockTable = async (db: Kysely<unknown>) =>
          (await db.introspection.getTables({ withInternalKyselyTables: true })).some(
            (table) => table.name === "kysely_migration_lock",
          );
        await withOther(backend.name, url, async (db) => {
          assert.ok(await lockTable(db), "the first open ran the migrator, which made its lock table");
          await db.schema.dropTable("kysely_migration_lock").execute();
        });
        const reopened = await openStore(url, options);
        try {
          assert.deepEqual(await reopened.nodes.list(), []);
        } finally {
          await reopened.close();
        }
        assert.ok(!(await withOther(backend.name, url, lockTable)), "the migrator did not run");
      });
    });

    test("migrations — a store that recorded as many migrations, one of them unknown here, is refused, naming it", async () => {
      await onMigratedStore(backend, async (url) => {
        await withOther(backend.name, url, (db) =>
          db
            .updateTable("kysely_migration" as never)
            .set({ name: "0007_from_another_branch" } as never)
            .where("name" as never, "=", knownMigrations[6] as never)
            .execute(),
        );
        await refusedNaming(url, "0007_from_another_branch");
      });
    });

    test("migrations — a store that lacks a migration this code knows is brought up to date on open", async () => {
      const location = await backend.fresh();
      try {
        const first = await openStore(location.url, options);
        await first.tokens.issue({
          id: "tok_00000000m001",
          node: "kept-1",
          secretHash: "aa",
          createdAt: "2026-12-01T00:00:00.000Z",
          expiresAt: "2026-12-01T01:00:00.000Z",
        });
        await first.close();
        // The newest migration undone, as the release before left the store.
        const newest = knownMigrations.at(-1) ?? "";
        await withOther(backend.name, location.url, async (db) => {
          const migrator = new Migrator({
            db,
            provider: migrationProvider(backend.name, { historyLimit: 50 }),
          });
          const { error } = await migrator.migrateDown();
          assert.equal(error, undefined);
          assert.ok(!(await recorded(db)).includes(newest));
        });
        const reopened = await openStore(location.url, options);
        try {
          assert.equal((await reopened.nodes.get("kept-1"))?.state, "invited");
        } finally {
          await reopened.close();
        }
        const names = await withOther(backend.name, location.url, recorded);
        assert.deepEqual(names.sort(), [...knownMigrations]);
      } finally {
        await location.cleanup();
      }
    });
  });
}
