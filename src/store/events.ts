/** The audit trail: one row per decision the mesh made. */
import type { Kysely, Selectable } from "kysely";
import { sql } from "kysely";
import { z } from "zod";
import { StoreError } from "../errors.js";
import type { Database, EventTable } from "./schema.js";
import { rowValues, StatementTexts } from "./statements.js";
import { inTransaction, slices } from "./transaction.js";

export interface MeshEvent {
  at: string;
  kind: string;
  node: string | null;
  epoch: number | null;
  detail: Record<string, unknown>;
}

export interface StoredEvent extends MeshEvent {
  id: number;
}

/**
 * The kinds of event a liveness crossing is, as the partial index `events_crossings` names them (migration 0016): a
 * change here needs a migration of that index; its test fails while the two name different kinds.
 */
export const crossingKinds = ["node.out_of_touch", "node.back_in_touch"] as const;
export type CrossingKind = (typeof crossingKinds)[number];

function isCrossing(kind: string): kind is CrossingKind {
  return (crossingKinds as readonly string[]).includes(kind);
}

/**
 * The newest crossing of each node. The kinds are written into the statement, not bound: SQLite uses a partial
 * index only for a statement whose own condition shows that it holds (PostgreSQL plans with the values bound too).
 * Read through the whole audit trail instead, at the default million events, this took over half a second on
 * SQLite, on the thread that also renews the lease.
 */
export function newestCrossings(db: Kysely<Database>) {
  const kinds = crossingKinds.map((kind) => sql.lit(kind));
  return db
    .selectFrom("events")
    .select(["node", "kind"])
    .where("id", "in", (eb) =>
      eb
        .selectFrom("events")
        .select((inner) => inner.fn.max("id").as("id"))
        .where("kind", "in", kinds)
        .where("node", "is not", null)
        .groupBy("node"),
    );
}

/**
 * A roll-out's chunk as the audit trail keeps it: one event (no node of its own) naming each node sent and the
 * sequence it was sent, by composition. With an event a node, a roll-out to 10,000 nodes wrote 10,000 rows: a
 * hundred roll-outs filled the retention's million with sendings (the ordinary case), and each wrote into every
 * node's place in `events_node`. A node's own declarations are its history in `declarations`.
 */
export const declarationsSentKind = "declarations.sent";

/** One node's sending, as a `declarations.sent` event names it. */
export interface SentInChunk {
  node: string;
  sequence: number;
  digest: string;
  /** How many items the declaration holds. */
  items: number;
}

export function declarationsSentEvent(at: string, epoch: number, sent: readonly SentInChunk[]): MeshEvent {
  const byDigest = new Map<string, { items: number; nodes: Array<[string, number]> }>();
  for (const { node, sequence, digest, items } of sent) {
    let group = byDigest.get(digest);
    if (group === undefined) {
      group = { items, nodes: [] };
      byDigest.set(digest, group);
    }
    group.nodes.push([node, sequence]);
  }
  const digests = Object.fromEntries(
    [...byDigest].map(([digest, { items, nodes }]) => [digest, { items, nodes: Object.fromEntries(nodes) }]),
  );
  return { at, kind: declarationsSentKind, node: null, epoch, detail: { nodes: sent.length, digests } };
}

const sentDetailSchema = z.strictObject({
  nodes: z.number().int().nonnegative(),
  digests: z.record(
    z.string(),
    z.strictObject({
      items: z.number().int().nonnegative(),
      nodes: z.record(z.string(), z.number().int().positive()),
    }),
  ),
});

/** The sendings a `declarations.sent` event names; anything else, or a detail not of that shape, is refused. */
export function declarationsSentIn(event: MeshEvent): SentInChunk[] {
  if (event.kind !== declarationsSentKind) {
    throw new StoreError(`a ${event.kind} event names no declarations sent`);
  }
  const result = sentDetailSchema.safeParse(event.detail);
  if (!result.success) throw new StoreError(`a ${declarationsSentKind} event's detail is not as written`);
  const sent = Object.entries(result.data.digests).flatMap(([digest, { items, nodes }]) =>
    Object.entries(nodes).map(([node, sequence]) => ({ node, sequence, digest, items })),
  );
  if (sent.length !== result.data.nodes) {
    throw new StoreError(
      `a ${declarationsSentKind} event counts ${result.data.nodes} nodes and names ${sent.length}`,
    );
  }
  return sent;
}

/**
 * What an event counts for in the retention's bound: a roll-out's chunk the nodes it names, any other event one.
 * A chunk's detail takes some 30 bytes a node (about 15 KB for 500 nodes and 60 compositions), no more than an event
 * of its own: counted so, the bound holds the trail to about the size of as many events of their own.
 */
export function eventWeight(event: MeshEvent): number {
  if (event.kind !== declarationsSentKind) return 1;
  const nodes = event.detail.nodes;
  return typeof nodes === "number" && Number.isSafeInteger(nodes) && nodes > 1 ? nodes : 1;
}

/** The event counted last (its count before it and its weight), through `events_counted`. */
export function newestCounted(db: Kysely<Database>) {
  return db
    .selectFrom("events")
    .select(["counted_before", "weight"])
    .where("counted_before", "is not", null)
    .orderBy("counted_before", "desc")
    .limit(1);
}

/**
 * Counts the events recorded since the retention last ran (`counted_before` null, found through `events_counted`):
 * each is given the trail's count before it, in the order of their ids, on from `start`.
 */
export function countRecorded(start: number) {
  return sql`update events set counted_before = ${start} + counted.before
    from (select id, sum(weight) over (order by id) - weight as before
      from events where counted_before is null) counted
    where counted.id = events.id`;
}

/** The trail's count after the event counted last, and that event's count before it. */
async function trailCount(db: Kysely<Database>): Promise<{ total: number; newest: number } | undefined> {
  const row = await newestCounted(db).executeTakeFirst();
  if (row === undefined) return undefined;
  const newest = Number(row.counted_before);
  return { total: newest + Number(row.weight), newest };
}

export class EventQueries {
  constructor(
    private readonly db: Kysely<Database>,
    private readonly statements = new StatementTexts(),
  ) {}

  async record(event: MeshEvent): Promise<void> {
    await this.recordMany([event]);
  }

  /** Records events in one statement, each with its weight (`eventWeight`); the retention counts them (`prune`). */
  async recordMany(events: readonly MeshEvent[]): Promise<void> {
    if (events.length === 0) return;
    await inTransaction(this.db, async (trx) => {
      for (const slice of slices(events)) {
        const rows = slice.map((event) => ({
          at: event.at,
          kind: event.kind,
          node: event.node,
          epoch: event.epoch,
          detail: JSON.stringify(event.detail),
          weight: eventWeight(event),
        }));
        await this.statements.run(trx, `events.insert.${rows.length}`, rowValues(rows), () =>
          trx.insertInto("events").values(rows),
        );
      }
    });
  }

  /**
   * Each node's newest liveness crossing (`node.out_of_touch` or `node.back_in_touch`), for every node that has one:
   * one statement for a whole fleet (the liveness watch reads where each node last stood when it starts). It reads
   * the crossings alone, through their own index (`events_crossings`), not the whole audit trail.
   */
  async latestCrossings(): Promise<Map<string, CrossingKind>> {
    const rows = await newestCrossings(this.db).execute();
    return new Map(
      rows.flatMap(({ node, kind }) => (node === null || !isCrossing(kind) ? [] : [[node, kind] as const])),
    );
  }

  /**
   * The retention of the audit trail: deletes the events recorded before `before`; counts the events recorded since
   * its last run (each given the trail's count before it, in the order of their ids, on from the newest counted); and
   * deletes every event counted before the trail's count less `keepAtMost`, so what is kept counts at most
   * `keepAtMost` (a roll-out's chunk counts the nodes it names: `eventWeight`) — save the newest, kept whatever it
   * counts. Counted here rather than as each is recorded, the count is exact on PostgreSQL too: an event recorded
   * beside another, in a transaction of its own, is counted once it is committed, after those counted before it.
   * Returns how many went.
   */
  async prune(retention: { before: string; keepAtMost: number }): Promise<number> {
    return inTransaction(this.db, async (trx) => {
      const old = await trx.deleteFrom("events").where("at", "<", retention.before).executeTakeFirst();
      await countRecorded((await trailCount(trx))?.total ?? 0).execute(trx);
      const count = await trailCount(trx);
      if (count === undefined) return Number(old.numDeletedRows);
      const surplus = await trx
        .deleteFrom("events")
        .where("counted_before", "<", Math.min(count.total - retention.keepAtMost, count.newest))
        .executeTakeFirst();
      return Number(old.numDeletedRows) + Number(surplus.numDeletedRows);
    });
  }

  /**
   * The newest `limit` events, oldest first, optionally of one node. A roll-out's sendings are not a node's events:
   * each chunk's names its nodes in its detail (`declarationsSentIn`).
   */
  async list(options: { limit: number; node?: string }): Promise<StoredEvent[]> {
    let query = this.db.selectFrom("events").selectAll().orderBy("id", "desc").limit(options.limit);
    if (options.node !== undefined) query = query.where("node", "=", options.node);
    const rows = await query.execute();
    return rows.reverse().map(toEvent);
  }
}

function toEvent(row: Selectable<EventTable>): StoredEvent {
  return {
    id: row.id,
    at: row.at,
    kind: row.kind,
    node: row.node,
    epoch: row.epoch,
    detail: detailOf(row),
  };
}

/** An event's detail as written: a JSON object. Anything else in the row is reported, naming the event. */
const detailSchema = z.record(z.string(), z.unknown());

function detailOf(row: Selectable<EventTable>): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(row.detail);
  } catch (error) {
    throw new StoreError(`event ${row.id}: its detail is not JSON`, { cause: error });
  }
  const result = detailSchema.safeParse(value);
  if (!result.success) throw new StoreError(`event ${row.id}: its detail is not a JSON object`);
  return result.data;
}
