/**
 * Numbered migrations, applied in order when a store opens. A migration, once shipped, never changes: a new
 * need gets a new number.
 */
import { sql } from "kysely";
import type { Kysely, Migration, MigrationProvider } from "kysely";
import type { Dialect } from "./url.js";

/** What a migration may need of the store's settings besides its dialect. */
export interface MigrationSettings {
  /** How many accounts each node keeps (`StoreOptions.historyLimit`). */
  historyLimit: number;
}

type NumberedMigration = (dialect: Dialect, settings: MigrationSettings) => Migration;

const initial: NumberedMigration = (dialect) => ({
  async up(db: Kysely<unknown>) {
    // An auto-numbered key is spelled differently by each dialect.
    const serial = dialect === "postgres" ? "serial" : "integer";
    const autoKey = (column: string) =>
      dialect === "postgres"
        ? db.schema.createTable(column).addColumn("id", serial, (c) => c.primaryKey())
        : db.schema.createTable(column).addColumn("id", serial, (c) => c.primaryKey().autoIncrement());

    await db.schema
      .createTable("nodes")
      .addColumn("name", "text", (c) => c.primaryKey())
      .addColumn("state", "text", (c) => c.notNull())
      .addColumn("created_at", "text", (c) => c.notNull())
      .addColumn("enrolled_at", "text")
      .addColumn("retired_at", "text")
      .addColumn("last_seen", "text")
      .addColumn("signing_key", "text")
      .addColumn("overlay_key", "text")
      .addColumn("broker_user", "text")
      .addColumn("profile", "text")
      .addColumn("declaration_sequence", "integer", (c) => c.notNull().defaultTo(0))
      .execute();

    await db.schema
      .createTable("tokens")
      .addColumn("id", "text", (c) => c.primaryKey())
      .addColumn("node", "text", (c) => c.notNull().references("nodes.name"))
      .addColumn("secret_hash", "text", (c) => c.notNull())
      .addColumn("created_at", "text", (c) => c.notNull())
      .addColumn("expires_at", "text", (c) => c.notNull())
      .addColumn("spent_at", "text")
      .addColumn("revoked_at", "text")
      .addColumn("broker_credential", "text")
      .execute();
    await db.schema.createIndex("tokens_node").on("tokens").column("node").execute();

    await db.schema
      .createTable("declarations")
      .addColumn("node", "text", (c) => c.notNull().references("nodes.name"))
      .addColumn("sequence", "integer", (c) => c.notNull())
      .addColumn("epoch", "integer", (c) => c.notNull())
      .addColumn("issued_at", "text", (c) => c.notNull())
      .addColumn("digest", "text", (c) => c.notNull())
      .addColumn("envelope", "text", (c) => c.notNull())
      .addPrimaryKeyConstraint("declarations_pk", ["node", "sequence"])
      .execute();
    await db.schema
      .createIndex("declarations_digest")
      .on("declarations")
      .columns(["node", "digest"])
      .execute();

    await autoKey("accounts")
      .addColumn("node", "text", (c) => c.notNull().references("nodes.name"))
      .addColumn("received_at", "text", (c) => c.notNull())
      .addColumn("epoch", "integer")
      .addColumn("sequence", "integer")
      .addColumn("report_sequence", "integer")
      .addColumn("digest", "text", (c) => c.notNull())
      .addColumn("outcome", "text", (c) => c.notNull())
      .addColumn("report", "text", (c) => c.notNull())
      .execute();
    await db.schema.createIndex("accounts_node").on("accounts").columns(["node", "id"]).execute();

    await autoKey("events")
      .addColumn("at", "text", (c) => c.notNull())
      .addColumn("kind", "text", (c) => c.notNull())
      .addColumn("node", "text")
      .addColumn("epoch", "integer")
      .addColumn("detail", "text", (c) => c.notNull())
      .execute();
    await db.schema.createIndex("events_at").on("events").column("at").execute();

    await db.schema
      .createTable("controller_epoch")
      .addColumn("epoch", "integer", (c) => c.primaryKey())
      .addColumn("taken_at", "text", (c) => c.notNull())
      .addColumn("holder", "text", (c) => c.notNull())
      .execute();
  },
  async down(db: Kysely<unknown>) {
    for (const table of ["controller_epoch", "events", "accounts", "declarations", "tokens", "nodes"]) {
      await sql`drop table ${sql.table(table)}`.execute(db);
    }
  },
});

/** Per-node counters of refused messages, shown by `mesh node show`. */
const counters: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("node_counters")
      .addColumn("node", "text", (c) => c.notNull())
      .addColumn("name", "text", (c) => c.notNull())
      .addColumn("value", "integer", (c) => c.notNull())
      .addPrimaryKeyConstraint("node_counters_pk", ["node", "name"])
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropTable("node_counters").execute();
  },
});

/** Broker identities that must stay refused: a node's earlier identity once it enrolled again with a new one. */
const revokedIdentities: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("revoked_identities")
      .addColumn("broker_user", "text", (c) => c.primaryKey())
      .addColumn("node", "text", (c) => c.notNull())
      .addColumn("since", "text", (c) => c.notNull())
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropTable("revoked_identities").execute();
  },
});

/** The lease for deployments without NATS: one row whose revision only ever rises. */
const controllerLease: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("controller_lease")
      .addColumn("name", "text", (c) => c.primaryKey())
      .addColumn("holder", "text")
      .addColumn("revision", "integer", (c) => c.notNull())
      .addColumn("expires_at", "text")
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropTable("controller_lease").execute();
  },
});

/**
 * Controllers running without an epoch (the lease could not be written at all): an urgent condition every command
 * must be able to see, so it is kept where every controller and command can read it.
 */
const controllerNoEpoch: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("controller_no_epoch")
      .addColumn("controller", "text", (c) => c.primaryKey())
      .addColumn("host", "text", (c) => c.notNull())
      .addColumn("pid", "integer", (c) => c.notNull())
      .addColumn("reason", "text", (c) => c.notNull())
      .addColumn("since", "text", (c) => c.notNull())
      .addColumn("seen_at", "text", (c) => c.notNull())
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropTable("controller_no_epoch").execute();
  },
});

/** A node's events found by its name: a fleet's audit trail is far too long to scan for one node. */
const eventsByNode: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema.createIndex("events_node").on("events").columns(["node", "id"]).execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropIndex("events_node").execute();
  },
});

/**
 * A broker identity belongs to exactly one node: enrolment refuses a key another node holds, and the store refuses
 * it too, so two enrolments racing with one key cannot both land (retiring either would revoke the other).
 */
const oneNodePerBrokerUser: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema.createIndex("nodes_broker_user").on("nodes").column("broker_user").unique().execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropIndex("nodes_broker_user").execute();
  },
});

/**
 * Tokens found by their expiry: revocation sync reads only the tokens not yet expired, and the retention deletes
 * those expired long ago, both far fewer than every token ever issued.
 */
const tokensByExpiry: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema.createIndex("tokens_expires_at").on("tokens").column("expires_at").execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropIndex("tokens_expires_at").execute();
  },
});

/**
 * When the control plane could hear, and the gaps when it could not: a node is not out of touch for time nobody
 * listened.
 */
const controlHearing: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("control_hearing")
      .addColumn("key", "text", (c) => c.primaryKey())
      .addColumn("heard_at", "text", (c) => c.notNull())
      .addColumn("since", "text", (c) => c.notNull())
      .execute();
    await db.schema
      .createTable("hearing_gaps")
      .addColumn("from_at", "text", (c) => c.notNull())
      .addColumn("to_at", "text", (c) => c.notNull())
      .execute();
    await db.schema.createIndex("hearing_gaps_to").on("hearing_gaps").column("to_at").execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropTable("hearing_gaps").execute();
    await db.schema.dropTable("control_hearing").execute();
  },
});

/** Every revision of the plan, each written by compare-and-set on the one before it, with its writer's epoch. */
const plans: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("plans")
      .addColumn("revision", "integer", (c) => c.primaryKey())
      .addColumn("plan", "text", (c) => c.notNull())
      .addColumn("written_at", "text", (c) => c.notNull())
      .addColumn("written_by", "text", (c) => c.notNull())
      .addColumn("epoch", "integer", (c) => c.notNull())
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropTable("plans").execute();
  },
});

/**
 * What allot could not place, kept with the epoch that found it; which plan revision the control plane has sent;
 * and, with every declaration, the units it was composed from (what `node list` shows a node holds).
 */
const planRollout: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("plan_conditions")
      .addColumn("unit", "text", (c) => c.primaryKey())
      .addColumn("wanted", "text", (c) => c.notNull())
      .addColumn("placed", "integer", (c) => c.notNull())
      .addColumn("reason", "text", (c) => c.notNull())
      .addColumn("epoch", "integer", (c) => c.notNull())
      .addColumn("since", "text", (c) => c.notNull())
      .execute();
    await db.schema
      .createTable("plan_sent")
      .addColumn("name", "text", (c) => c.primaryKey())
      .addColumn("revision", "integer", (c) => c.notNull())
      .addColumn("epoch", "integer", (c) => c.notNull())
      .addColumn("sent_at", "text", (c) => c.notNull())
      .execute();
    await db.schema
      .alterTable("declarations")
      .addColumn("units", "text", (c) => c.notNull().defaultTo("[]"))
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.alterTable("declarations").dropColumn("units").execute();
    await db.schema.dropTable("plan_sent").execute();
    await db.schema.dropTable("plan_conditions").execute();
  },
});

/** Every overlay address ever given, by node: never given to another node while the node exists. */
const overlayAddresses: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("overlay_addresses")
      .addColumn("node", "text", (c) => c.primaryKey().references("nodes.name"))
      .addColumn("address", "text", (c) => c.notNull().unique())
      .addColumn("since", "text", (c) => c.notNull())
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropTable("overlay_addresses").execute();
  },
});

/**
 * The earliest expiry among tokens that can still be spent, which the token sweep reads each time a token is spent:
 * with the spent ones left out of the index it is one look, not a pass over every spent token still in the store
 * (a fleet joining at once spends thousands).
 */
const validTokensByExpiry: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createIndex("tokens_valid_by_expiry")
      .on("tokens")
      .column("expires_at")
      .where(sql.ref("spent_at"), "is", null)
      .where(sql.ref("revoked_at"), "is", null)
      .where(sql.ref("broker_credential"), "is not", null)
      .execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropIndex("tokens_valid_by_expiry").execute();
  },
});

/**
 * Each composition's items kept once (`declaration_items`), and each declaration as its header, its items' key and
 * its seal: a roll-out to 10,000 nodes of a few compositions wrote each composition's items 10,000 times, a kilobyte
 * or more each, and a node's whole history of them. The envelope column stays for the declarations already kept,
 * and may be empty from now on (SQLite cannot drop a NOT NULL: its table is copied into one without it).
 */
const compositionsApart: NumberedMigration = (dialect) => ({
  async up(db: Kysely<unknown>) {
    await db.schema
      .createTable("declaration_items")
      .addColumn("key", "text", (c) => c.primaryKey())
      .addColumn("items", "text", (c) => c.notNull())
      .addColumn("used_at", "text", (c) => c.notNull())
      .execute();
    if (dialect === "postgres") {
      await db.schema
        .alterTable("declarations")
        .alterColumn("envelope", (c) => c.dropNotNull())
        .execute();
      for (const column of ["items_key", "signature", "signer"]) {
        await db.schema.alterTable("declarations").addColumn(column, "text").execute();
      }
      return;
    }
    // One transaction: a copy stopped part-way leaves the old table as it was.
    await sql`begin`.execute(db);
    try {
      await sql`create table declarations_next (
        node text not null references nodes(name),
        sequence integer not null,
        epoch integer not null,
        issued_at text not null,
        digest text not null,
        envelope text,
        units text not null default '[]',
        items_key text,
        signature text,
        signer text,
        constraint declarations_pk primary key (node, sequence)
      )`.execute(db);
      await sql`insert into declarations_next (node, sequence, epoch, issued_at, digest, envelope, units)
        select node, sequence, epoch, issued_at, digest, envelope, units from declarations`.execute(db);
      await sql`drop table declarations`.execute(db);
      await sql`alter table declarations_next rename to declarations`.execute(db);
      await db.schema
        .createIndex("declarations_digest")
        .on("declarations")
        .columns(["node", "digest"])
        .execute();
      await sql`commit`.execute(db);
    } catch (error) {
      await sql`rollback`.execute(db);
      throw error;
    }
  },
  // No way down: the declarations kept since have no envelope of their own to go back to.
});

/**
 * No index of declarations by node and digest: each roll-out put one entry per node into it, each at a place of its
 * own (a digest falls anywhere among a node's), so a roll-out wrote about one page of it per node. In a harness of a
 * roll-out's inserts on SQLite (10,000 nodes, 30 to 40 declarations each), 190–260 ms of CPU a roll-out with it and
 * 41–49 ms without. The one query by digest (`ordersOfDigests`) reads its nodes' few dozen declarations by the
 * primary key instead.
 */
const noDeclarationsByDigest: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await db.schema.dropIndex("declarations_digest").execute();
  },
  async down(db: Kysely<unknown>) {
    await db.schema
      .createIndex("declarations_digest")
      .on("declarations")
      .columns(["node", "digest"])
      .execute();
  },
});

/**
 * The liveness crossings by node, and nothing else of the audit trail: the liveness watch reads each node's newest
 * crossing when a control plane starts acting. Through `events_node` that read walked every event the store keeps
 * (a million by default) to test its kind: 550–650 ms on SQLite's single thread; 46–50 ms through this index (138 ms
 * with the page cache cold). The kinds are `crossingKinds` in `events.ts`, written out here as they stood.
 */
const crossingsByNode: NumberedMigration = () => ({
  async up(db: Kysely<unknown>) {
    await sql`create index events_crossings on events (node, id)
      where kind in ('node.out_of_touch', 'node.back_in_touch')`.execute(db);
  },
  async down(db: Kysely<unknown>) {
    await db.schema.dropIndex("events_crossings").execute();
  },
});

/**
 * Runs a table's copy as one transaction: PostgreSQL runs each migration in a transaction of its own, SQLite's is
 * made one here, so a copy stopped part-way leaves the old table as it was.
 */
async function asOneCopy(db: Kysely<unknown>, dialect: Dialect, steps: () => Promise<void>): Promise<void> {
  if (dialect === "postgres") return steps();
  await sql`begin`.execute(db);
  try {
    await steps();
    await sql`commit`.execute(db);
  } catch (error) {
    await sql`rollback`.execute(db);
    throw error;
  }
}

/**
 * A node's accounts as a ring: each kept in place of the one `historyLimit` older (its `slot`, the account's number
 * `kept` modulo the limit), its newest's number and slot in `account_heads`. Kept as rows inserted at the end of the
 * table and trimmed, each account also deleted an old row from a page anywhere in it once the node's history was full:
 * in a harness of the store's part (10,000 nodes, full histories) 6.1–6.3 µs an account node by node and 11.3–11.7 µs
 * in turns, against 4.6–4.9 and 7.9–8.3 µs as a ring. Each node's newest `historyLimit` accounts are carried over,
 * numbered from its oldest, by the limit of the process that migrates (`places`); a process with another limit lays
 * each node's ring out again at its next account (`AccountQueries`).
 */
/** What an account holds besides its node and its place, as the table declares it. */
const accountColumns = sql`received_at text not null, epoch integer, sequence integer, report_sequence integer,
  digest text not null, outcome text not null, report text not null`;

const accountsRing: NumberedMigration = (dialect, { historyLimit }) => ({
  async up(db: Kysely<unknown>) {
    const limit = sql.lit(historyLimit);
    const steps = async () => {
      await sql`create table accounts_ring (
        node text not null references nodes(name),
        slot integer not null,
        kept integer not null,
        ${accountColumns},
        primary key (node, slot)
      )`.execute(db);
      await sql`insert into accounts_ring
          (node, slot, kept, received_at, epoch, sequence, report_sequence, digest, outcome, report)
        select node, kept % ${limit}, kept, received_at, epoch, sequence, report_sequence, digest, outcome, report
        from (
          select accounts.*,
            row_number() over (partition by node order by id) as kept,
            row_number() over (partition by node order by id desc) as back
          from accounts
        ) numbered
        where back <= ${limit}`.execute(db);
      await sql`create table account_heads (
        node text primary key references nodes(name),
        kept integer not null,
        slot integer not null,
        places integer not null
      )`.execute(db);
      await sql`insert into account_heads (node, kept, slot, places)
        select node, kept, slot, ${limit} from accounts_ring
        where kept = (select max(newest.kept) from accounts_ring newest where newest.node = accounts_ring.node)`.execute(
        db,
      );
      await sql`drop table accounts`.execute(db);
      await sql`alter table accounts_ring rename to accounts`.execute(db);
    };
    await asOneCopy(db, dialect, steps);
  },
  /** Back to rows in the order kept, numbered as inserted: each node's history as the ring held it. */
  async down(db: Kysely<unknown>) {
    await asOneCopy(db, dialect, async () => {
      const key =
        dialect === "postgres" ? sql`id serial primary key` : sql`id integer primary key autoincrement`;
      await sql`create table accounts_rows (
        ${key},
        node text not null references nodes(name),
        ${accountColumns}
      )`.execute(db);
      await sql`insert into accounts_rows
          (node, received_at, epoch, sequence, report_sequence, digest, outcome, report)
        select node, received_at, epoch, sequence, report_sequence, digest, outcome, report
        from accounts order by kept, node`.execute(db);
      await sql`drop table account_heads`.execute(db);
      await sql`drop table accounts`.execute(db);
      await sql`alter table accounts_rows rename to accounts`.execute(db);
      await db.schema.createIndex("accounts_node").on("accounts").columns(["node", "id"]).execute();
    });
  },
});

/**
 * The audit trail bounded by what it names, not by its rows: each event's `weight` is what it counts for (a
 * roll-out's chunk, `declarations.sent`, the nodes it names; any other event one) and `counted_before` the trail's
 * count before it, given by the retention to the events recorded since its last run (null until then). Counted by
 * rows, a million events could hold a million chunks of 500 nodes each (about 15 KB apiece); counted so, a million
 * events' worth. The retention deletes the events counted before the trail's count less its bound, through
 * `events_counted`; a walk summing each event's weight from the newest read the whole trail (about a second at a
 * million events on SQLite). The events already kept are counted here, in order; a detail whose `nodes` is not a
 * whole number above one counts one, as `eventWeight` counts it. One transaction on SQLite too: the count rewrites
 * every row, and a migration stopped part-way would leave columns the next attempt could not add again.
 */
const eventsCounted: NumberedMigration = (dialect) => ({
  async up(db: Kysely<unknown>) {
    await asOneCopy(db, dialect, async () => {
      await sql`alter table events add column weight bigint not null default 1`.execute(db);
      await sql`alter table events add column counted_before bigint`.execute(db);
      const chunkWeight =
        dialect === "postgres"
          ? sql`case when json_typeof(detail::json -> 'nodes') = 'number'
              and (detail::json ->> 'nodes') ~ '^[0-9]+$' and (detail::json ->> 'nodes')::numeric > 1
              then (detail::json ->> 'nodes')::bigint else 1 end`
          : sql`case when json_type(detail, '$.nodes') = 'integer' and json_extract(detail, '$.nodes') > 1
              then json_extract(detail, '$.nodes') else 1 end`;
      await sql`update events set weight = ${chunkWeight} where kind = 'declarations.sent'`.execute(db);
      await sql`update events set counted_before = counted.total - events.weight
        from (select id, sum(weight) over (order by id) as total from events) counted
        where counted.id = events.id`.execute(db);
      await db.schema.createIndex("events_counted").on("events").column("counted_before").execute();
    });
  },
  async down(db: Kysely<unknown>) {
    await asOneCopy(db, dialect, async () => {
      await db.schema.dropIndex("events_counted").execute();
      await sql`alter table events drop column counted_before`.execute(db);
      await sql`alter table events drop column weight`.execute(db);
    });
  },
});

const numbered: ReadonlyArray<[string, NumberedMigration]> = [
  ["0001_initial", initial],
  ["0002_node_counters", counters],
  ["0003_revoked_identities", revokedIdentities],
  ["0004_controller_lease", controllerLease],
  ["0005_controller_no_epoch", controllerNoEpoch],
  ["0006_events_by_node", eventsByNode],
  ["0007_one_node_per_broker_user", oneNodePerBrokerUser],
  ["0008_tokens_by_expiry", tokensByExpiry],
  ["0009_control_hearing", controlHearing],
  ["0010_plans", plans],
  ["0011_plan_rollout", planRollout],
  ["0012_overlay_addresses", overlayAddresses],
  ["0013_valid_tokens_by_expiry", validTokensByExpiry],
  ["0014_compositions_apart", compositionsApart],
  ["0015_no_declarations_by_digest", noDeclarationsByDigest],
  ["0016_crossings_by_node", crossingsByNode],
  ["0017_accounts_ring", accountsRing],
  ["0018_events_counted", eventsCounted],
];

/** The names of the migrations, oldest first: a store migrated by this code has recorded exactly these. */
export const knownMigrations: readonly string[] = numbered.map(([name]) => name);

export function migrationProvider(dialect: Dialect, settings: MigrationSettings): MigrationProvider {
  return {
    getMigrations() {
      return Promise.resolve(
        Object.fromEntries(numbered.map(([name, make]) => [name, make(dialect, settings)])),
      );
    },
  };
}
