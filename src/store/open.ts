/**
 * Opening the store: SQLite (one file, zero set-up) or PostgreSQL (several controllers), migrated on open.
 * Driver errors are turned into StoreError here, with the driver's error as the cause.
 */
import { closeSync, mkdirSync, openSync } from "node:fs";
import { dirname } from "node:path";
import SqliteDatabase from "better-sqlite3";
import {
  CompiledQuery,
  DEFAULT_MIGRATION_TABLE as migrationTable,
  Kysely,
  Migrator,
  PostgresDialect,
  SqliteDialect,
  sql,
} from "kysely";
import type { DatabaseConnection, Driver } from "kysely";
import { StoreError } from "../errors.js";
import { AccountQueries } from "./accounts.js";
import { autocheckpointPages, backstopPages, Checkpointer, logKeptBytes } from "./checkpoints.js";
import { CounterQueries } from "./counters.js";
import { SqlLease } from "./lease.js";
import { HearingQueries } from "./hearing.js";
import { OverlayQueries } from "./overlay.js";
import { PlanQueries } from "./plans.js";
import { StatementTexts } from "./statements.js";
import { RevokedIdentityQueries } from "./revoked-identities.js";
import { DeclarationQueries } from "./declarations.js";
import { EpochQueries } from "./epochs.js";
import { EventQueries } from "./events.js";
import type { MigrationSettings } from "./migrations.js";
import { knownMigrations, migrationProvider } from "./migrations.js";
import { NodeQueries } from "./nodes.js";
import { NoEpochQueries } from "./no-epoch.js";
import type { Database } from "./schema.js";
import { TokenQueries } from "./tokens.js";
import { inTransaction } from "./transaction.js";
import type { Dialect, StoreLocation } from "./url.js";
import { parseStoreUrl, redact } from "./url.js";

export interface StoreOptions {
  /** How many declarations and accounts to keep per node behind the latest. */
  historyLimit: number;
  /**
   * SQLite: checkpoint on a thread of its own (`checkpoints.ts`), for a long-running control plane; what goes wrong
   * with that thread is told here. Commands leave it out: their few commits checkpoint as SQLite does by default.
   */
  checkpointsApart?: {
    failed: (reason: string) => void;
    recovered: () => void;
  };
}

export class Store {
  readonly tokens: TokenQueries;
  readonly nodes: NodeQueries;
  readonly declarations: DeclarationQueries;
  readonly accounts: AccountQueries;
  readonly events: EventQueries;
  readonly epochs: EpochQueries;
  readonly counters: CounterQueries;
  readonly revokedIdentities: RevokedIdentityQueries;
  readonly noEpoch: NoEpochQueries;
  readonly hearing: HearingQueries;
  readonly plans: PlanQueries;
  readonly overlay: OverlayQueries;

  constructor(
    readonly dialect: Dialect,
    private readonly db: Kysely<Database>,
    private readonly options: StoreOptions,
    /** Statement texts built once, shared with the store handed to each transaction. */
    private readonly statements = new StatementTexts(),
    /** The checkpoint thread, when the store has one; the store a transaction is given has none. */
    private readonly checkpointer?: Checkpointer,
  ) {
    this.tokens = new TokenQueries(db);
    this.nodes = new NodeQueries(db, statements);
    this.declarations = new DeclarationQueries(db, options.historyLimit, statements);
    this.accounts = new AccountQueries(db, options.historyLimit, statements);
    this.events = new EventQueries(db, statements);
    this.epochs = new EpochQueries(db);
    this.counters = new CounterQueries(db);
    this.revokedIdentities = new RevokedIdentityQueries(db);
    this.noEpoch = new NoEpochQueries(db);
    this.hearing = new HearingQueries(db);
    this.plans = new PlanQueries(db);
    this.overlay = new OverlayQueries(db);
  }

  /**
   * Runs `work` in one transaction: everything it does through the store it is given commits together, or not
   * at all. A transaction inside it is this one.
   */
  async transaction<T>(work: (store: Store) => Promise<T>): Promise<T> {
    return inTransaction(this.db, (trx) => work(new Store(this.dialect, trx, this.options, this.statements)));
  }

  /** The lease kept in this store (for deployments without NATS). */
  lease(ttlMs: number, now?: () => Date): SqlLease {
    return new SqlLease(this.db, ttlMs, now);
  }

  async close(): Promise<void> {
    // The thread's connection first: a store closed while it checkpoints would leave the log behind.
    await this.checkpointer?.stop();
    await this.db.destroy();
  }
}

export async function openStore(url: string, options: StoreOptions): Promise<Store> {
  const location = parseStoreUrl(url);
  const { db, file } = await connect(location, url);
  let checkpointer: Checkpointer | undefined;
  try {
    if (location.dialect === "postgres" && location.schema !== undefined) {
      await sql`create schema if not exists ${sql.id(location.schema)}`.execute(db);
    }
    await migrate(db, location, { historyLimit: options.historyLimit });
    const apart = options.checkpointsApart;
    if (
      apart !== undefined &&
      file !== undefined &&
      location.dialect === "sqlite" &&
      location.path !== ":memory:"
    )
      checkpointer = checkpointApart(file, location.path, apart);
  } catch (error) {
    await db.destroy();
    if (error instanceof StoreError) throw error;
    throw new StoreError(`cannot open the store at ${redact(url)}: ${describe(error)}`, { cause: error });
  }
  return new Store(location.dialect, db, options, undefined, checkpointer);
}

/** Moves the store's checkpoints to a thread of their own; should it end, the commits checkpoint again. */
function checkpointApart(
  file: SqliteDatabase.Database,
  path: string,
  told: NonNullable<StoreOptions["checkpointsApart"]>,
): Checkpointer {
  file.pragma(`wal_autocheckpoint = ${backstopPages}`);
  file.pragma(`journal_size_limit = ${logKeptBytes}`);
  return new Checkpointer(path, {
    failed: told.failed,
    recovered: told.recovered,
    gone: (reason) => {
      try {
        file.pragma(`wal_autocheckpoint = ${autocheckpointPages}`);
        told.failed(`${reason}; the store's commits checkpoint again`);
      } catch (error) {
        told.failed(
          `${reason}; the store's commits could not be set to checkpoint again: ${describe(error)}`,
        );
      }
    },
  });
}

async function connect(
  location: StoreLocation,
  url: string,
): Promise<{ db: Kysely<Database>; file?: SqliteDatabase.Database }> {
  switch (location.dialect) {
    case "sqlite": {
      let file: SqliteDatabase.Database;
      try {
        if (location.path !== ":memory:") createPrivately(location.path);
        file = new SqliteDatabase(location.path);
      } catch (error) {
        throw new StoreError(`cannot open the store at ${url}: ${describe(error)}`, { cause: error });
      }
      // WAL lets readers (the CLI) work beside the control plane; NORMAL sync is durable in WAL but for the
      // last commits before a power cut. The busy timeout makes concurrent writers wait instead of failing.
      file.pragma("journal_mode = WAL");
      file.pragma("synchronous = NORMAL");
      file.pragma("busy_timeout = 5000");
      file.pragma("foreign_keys = ON");
      // What SQLite keeps aside while a statement runs (a statement journal, an IN list's or a sort's temporary
      // table) stays in memory: on file it was a temporary file made, written and deleted for most batches of
      // reports kept, on the thread that consumes them. What one statement sets aside here is a few hundred pages.
      file.pragma("temp_store = MEMORY");
      return {
        db: new Kysely<Database>({
          dialect: new ImmediateSqliteDialect({ database: withStatementCache(file) }),
        }),
        file,
      };
    }
    case "postgres": {
      // Loaded only for PostgreSQL: most commands run on SQLite, and loading the driver is a good part of a
      // command's start.
      const { default: pg } = await import("pg").catch((error: unknown) => {
        throw new StoreError(`cannot load the PostgreSQL driver: ${describe(error)}`, { cause: error });
      });
      const pool = new pg.Pool({
        connectionString: location.connectionString,
        max: 10,
        ...(location.schema === undefined ? {} : { options: `-c search_path=${location.schema}` }),
      });
      // An idle connection that the server closes (a restart, an administrator) is dropped from the pool and
      // replaced on next use; without a listener the pool's error event would end the whole process.
      pool.on("error", (error) => {
        process.stderr.write(`store: an idle PostgreSQL connection closed: ${describe(error)}\n`);
      });
      // A connection in use whose socket dies fails its query, which the caller sees and handles (the store is
      // unreachable); the client also emits the error, and the pool listens only while the client is idle: without
      // this listener that second telling would end the whole process. The pool drops the broken client on release.
      pool.on("connect", (client) => {
        client.on("error", (error) => {
          process.stderr.write(`store: a PostgreSQL connection in use closed: ${describe(error)}\n`);
        });
      });
      return { db: new Kysely<Database>({ dialect: new PostgresDialect({ pool }) }) };
    }
    default: {
      const unknown: never = location;
      throw new StoreError(`unknown store location ${JSON.stringify(unknown)}`);
    }
  }
}

async function migrate(
  db: Kysely<Database>,
  location: StoreLocation,
  settings: MigrationSettings,
): Promise<void> {
  if (await migrated(db, location)) return;
  const migrator = new Migrator({
    db,
    provider: migrationProvider(location.dialect, settings),
    ...(location.dialect === "postgres" && location.schema !== undefined
      ? { migrationTableSchema: location.schema }
      : {}),
  });
  const { error, results } = await migrator.migrateToLatest();
  if (error !== undefined) {
    const failed = results?.find((result) => result.status === "Error")?.migrationName ?? "unknown";
    throw new StoreError(`store migration ${failed} failed: ${describe(error)}`, { cause: error });
  }
}

/**
 * Whether the store has recorded exactly the migrations this code knows, as the migrator's own table lists them: a
 * command then opens the store with two reads. The migrator itself makes its tables if they are missing, reads them,
 * and sorts the names with `localeCompare`, whose first call loads the locale's collation: 14 ms of each command's
 * start here. Anything else (a new store, one to bring up to date, one a newer version wrote) goes to the migrator,
 * which says what it finds.
 */
async function migrated(db: Kysely<Database>, location: StoreLocation): Promise<boolean> {
  // Where the migrator keeps it: the URL's schema, else (PostgreSQL) the first of the search path, as it resolves.
  const name =
    location.dialect === "postgres" && location.schema !== undefined
      ? `${location.schema}.${migrationTable}`
      : migrationTable;
  const { rows: tables } =
    location.dialect === "sqlite"
      ? await sql<{ found: number }>`select count(*) as found from sqlite_master
          where type = 'table' and name = ${name}`.execute(db)
      : await sql<{ found: number }>`select count(*)::int as found
          where to_regclass(${name}) is not null`.execute(db);
  if (Number(tables[0]?.found ?? 0) !== 1) return false;
  const { rows } = await sql<{ name: string }>`select name from ${sql.table(name)} order by name`.execute(db);
  return rows.length === knownMigrations.length && rows.every((row, i) => row.name === knownMigrations[i]);
}

/**
 * The store holds declarations' content: its file is created 0600 (its directory 0700 when made here) before SQLite
 * opens it, whatever the directory's mode and the umask. SQLite gives the `-wal` and `-shm` files the mode of the
 * main file. A file already there keeps the mode it has.
 */
function createPrivately(path: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  // "a": created with the mode if absent, opened untouched (neither truncated nor re-moded) if present.
  closeSync(openSync(path, "a", 0o600));
}

function describe(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) return describe(error.errors[0]);
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return typeof code === "string" && code !== "" ? `${error.message} (${code})` : error.message;
  }
  return String(error);
}

/** How many prepared statements the SQLite store keeps. */
export const statementsKept = 1000;

/**
 * Kysely prepares every query anew; preparing is a good part of a small query's cost in better-sqlite3. The same
 * SQL text gets the same prepared statement. The texts are the code's shapes, but a shape of many rows or a long
 * `in` list has a text per length, so the hot paths make hundreds: the least recently used is dropped when more
 * than `kept` are held. Keeping only the first ones would leave a control plane that has run for days preparing its
 * hot statements again at every batch.
 */
export function withStatementCache(
  file: SqliteDatabase.Database,
  kept = statementsKept,
): SqliteDatabase.Database {
  const statements = new Map<string, SqliteDatabase.Statement>();
  return new Proxy(file, {
    get(target, property, receiver) {
      if (property === "prepare") {
        return (sql: string) => {
          let statement = statements.get(sql);
          if (statement === undefined) {
            statement = target.prepare(sql);
            if (statements.size >= kept) statements.delete(statements.keys().next().value as string);
          } else {
            // Moved to the newest end: a Map iterates in insertion order, so its first key is the least recent.
            statements.delete(sql);
          }
          statements.set(sql, statement);
          return statement;
        };
      }
      const value: unknown = Reflect.get(target, property, receiver);
      return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}

/**
 * SQLite transactions that take the write lock when they begin. A deferred one (SQLite's default) that reads and
 * then writes while another process writes fails at once with SQLITE_BUSY — the busy timeout cannot help a read lock
 * that must become a write lock — and every transaction of the mesh writes.
 */
class ImmediateSqliteDialect extends SqliteDialect {
  override createDriver(): Driver {
    const driver = super.createDriver();
    driver.beginTransaction = async (connection: DatabaseConnection): Promise<void> => {
      await connection.executeQuery(CompiledQuery.raw("begin immediate"));
    };
    return driver;
  }
}
