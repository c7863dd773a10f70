/** The store backends every store test runs against: a SQLite file and a fresh PostgreSQL database. */
import { join } from "node:path";
import { after, before } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Kysely, Migrator, PostgresDialect, SqliteDialect } from "kysely";
import pg from "pg";
import type { NewDeclaration, Store, StoreOptions } from "../../src/store/index.js";
import { keptItems, openStore } from "../../src/store/index.js";
import { migrationProvider } from "../../src/store/migrations.js";
import { scratchDatabase } from "./postgres.js";
import { tempDir } from "./tmp.js";

export interface StoreBackend {
  name: "sqlite" | "postgres";
  /** Makes a fresh, empty store location; `cleanup` removes it. */
  fresh(): Promise<{ url: string; cleanup(): Promise<void> }>;
}

export const storeBackends: readonly StoreBackend[] = [
  {
    name: "sqlite",
    fresh() {
      const dir = tempDir("mesh-store-");
      return Promise.resolve({
        url: `sqlite:${join(dir.path, "mesh.db")}`,
        cleanup: () => Promise.resolve(dir.remove()),
      });
    },
  },
  {
    name: "postgres",
    async fresh() {
      const database = await scratchDatabase();
      return { url: database.url, cleanup: () => database.drop() };
    },
  },
];

/** The store's own tables at `url`, past the store: for tests of its layout and of its migrations. */
export function rawStoreDb(url: string): Kysely<unknown> {
  return new Kysely<unknown>({
    dialect: url.startsWith("sqlite:")
      ? new SqliteDialect({ database: new SqliteDatabase(url.slice("sqlite:".length)) })
      : new PostgresDialect({ pool: new pg.Pool({ connectionString: url }) }),
  });
}

/**
 * Migrates the store `db` holds up to `migration` and no further, as the release that ended with it left it; its
 * `historyLimit` is the one the migrations are given.
 */
export async function migrateStoreTo(
  db: Kysely<unknown>,
  backend: StoreBackend["name"],
  migration: string,
  historyLimit = 50,
): Promise<void> {
  const migrator = new Migrator({ db, provider: migrationProvider(backend, { historyLimit }) });
  const { error } = await migrator.migrateTo(migration);
  if (error !== undefined) throw new Error(`the store did not migrate to ${migration}`, { cause: error });
}

/** Invites `node` with a token of its own and enrols it at `at`, as an answered enrolment leaves the store. */
export async function enrolled(store: Store, node: string, at: Date, profile = "{}"): Promise<void> {
  await store.tokens.issue({
    id: `tok_${Buffer.from(node).toString("hex").padEnd(12, "0").slice(0, 12)}`,
    node,
    secretHash: "00",
    createdAt: at.toISOString(),
    expiresAt: new Date(at.getTime() + 60_000).toISOString(),
  });
  await store.nodes.enrol(node, {
    signingKey: "s",
    overlayKey: "o",
    brokerUser: `U-${node}`,
    profile,
    at: at.toISOString(),
  });
}

/**
 * A fresh store of `backend` for one suite: opened before its tests (handed to `opened`, with its location's URL),
 * closed and removed after them.
 */
export function freshStoreForSuite(
  backend: StoreBackend,
  options: StoreOptions,
  opened: (store: Store, url: string) => void,
): void {
  let location: { url: string; cleanup(): Promise<void> } | undefined;
  let store: Store | undefined;
  before(async () => {
    location = await backend.fresh();
    store = await openStore(location.url, options);
    opened(store, location.url);
  });
  after(async () => {
    await store?.close();
    await location?.cleanup();
  });
}

/**
 * What a recorded declaration keeps besides its header, for store tests that do not sign: its items' text (by
 * default none) and a seal no node is shown. A declaration read back has its envelope rebuilt from these.
 */
export function keptParts(itemsText = "[]"): Pick<NewDeclaration, "items" | "signature" | "signer"> {
  return {
    items: keptItems(itemsText),
    signature: Buffer.alloc(64).toString("base64"),
    signer: `SHA256:${"A".repeat(43)}`,
  };
}
