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
import { storeBackends } from "../support/stores.js";

const options = { historyLimit: 3 };

/** A connection of its own to the store at `url`, as another process has one. */
function otherConnection(backend: "sqlite" | "postgres", url: string): Kysely<unknown> {
  return new Kysely<unknown>({
    dialect:
      backend === "sqlite"
        ? new SqliteDialect({ database: new SqliteDatabase(url.slice("sqlite:".length)) })
        : new PostgresDialect({ pool: new pg.Pool({ connectionString: url, max: 1 }) }),
  });
}

for (const backend of storeBackends) {
  describe(`opening a migrated store (${backend.name})`, () => {
    test("migrations — a store recorded further than this code knows is refused, naming what it does not know", async () => {
      const location = await backend.fresh();
      try {
        await (await openStore(location.url, options)).close();
        const db = otherConnection(backend.name, location.url);
        try {
          await db
            .insertInto("kysely_migration" as never)
            .values({ name: "9999_from_a_newer_version", timestamp: new Date().toISOString() })
            .execute();
        } finally {
          await db.destroy();
        }
        await assert.rejects(openStore(location.url, options), (error: unknown) => {
          assert.ok(error instanceof StoreError, String(error));
          assert.match(error.message, /9999_from_a_newer_version/);
          return true;
        });
      } finally {
        await location.cleanup();
      }
    });

    test("migrations — a store that has recorded every migration this code knows opens without the migrator", async () => {
      const location = await backend.fresh();
      try {
        await (await openStore(location.url, options)).close();
        // The migrator makes its lock table whenever it runs: gone, it stays gone if the migrator is not run.
        const lockTable = async (db: Kysely<unknown>) =>
          (await db.introspection.getTables({ withInternalKyselyTables: true })).some(
            (table) => table.name === "kysely_migration_lock",
          );
        const db = otherConnection(backend.name, location.url);
        try {
          assert.ok(await lockTable(db), "the first open ran the migrator, which made its lock table");
          await db.schema.dropTable("kysely_migration_lock").execute();
        } finally {
          await db.destroy();
        }
        const reopened = await openStore(location.url, options);
        try {
          assert.deepEqual(await reopened.nodes.list(), []);
        } finally {
          await reopened.close();
        }
        const check = otherConnection(backend.name, location.url);
        try {
          assert.ok(!(await lockTable(check)), "the migrator did not run");
        } finally {
          await check.destroy();
        }
      } finally {
        await location.cleanup();
      }
    });

    test("migrations — a store that recorded as many migrations, one of them unknown here, is refused, naming it", async () => {
      const location = await backend.fresh();
      try {
        await (await openStore(location.url, options)).close();
        const db = otherConnection(backend.name, location.url);
        try {
          await db
            .updateTable("kysely_migration" as never)
            .set({ name: "0007_from_another_branch" } as never)
            .where("name" as never, "=", knownMigrations[6] as never)
            .execute();
        } finally {
          await db.destroy();
        }
        await assert.rejects(openStore(location.url, options), (error: unknown) => {
          assert.ok(error instanceof StoreError, String(error));
          assert.match(error.message, /0007_from_another_branch/);
          return true;
        });
      } finally {
        await location.cleanup();
      }
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
        const db = otherConnection(backend.name, location.url);
        try {
          const migrator = new Migrator({ db, provider: migrationProvider(backend.name) });
          const { error } = await migrator.migrateDown();
          assert.equal(error, undefined);
          const recorded = await db
            .selectFrom("kysely_migration" as never)
            .select("name" as never)
            .execute();
          assert.ok(!recorded.some((row) => (row as { name: string }).name === newest));
        } finally {
          await db.destroy();
        }
        const reopened = await openStore(location.url, options);
        try {
          assert.equal((await reopened.nodes.get("kept-1"))?.state, "invited");
        } finally {
          await reopened.close();
        }
        const check = otherConnection(backend.name, location.url);
        try {
          const names = (
            await check
              .selectFrom("kysely_migration" as never)
              .select("name" as never)
              .execute()
          ).map((row) => (row as { name: string }).name);
          assert.deepEqual(names.sort(), [...knownMigrations]);
        } finally {
          await check.destroy();
        }
      } finally {
        await location.cleanup();
      }
    });
  });
}
