/** Declarations as sent: the latest per node and a bounded history behind it. */
import type { Kysely, Selectable } from "kysely";
import type { Database, DeclarationTable } from "./schema.js";
import { MeshError } from "../errors.js";
import { rowValues, StatementTexts } from "./statements.js";
import { inTransaction, slices } from "./transaction.js";

export interface DeclarationRecord {
  node: string;
  sequence: number;
  epoch: number;
  issuedAt: string;
  digest: string;
  envelope: string;
  /** The plan's units it was composed from, by name (none for a declaration from before plans). */
  units?: readonly string[];
}

/** What a node was last sent, without the envelope: what compose compares with and `node list` shows. */
export interface LatestSent {
  sequence: number;
  epoch: number;
  digest: string;
  units: string[];
}

export class DeclarationQueries {
  constructor(
    private readonly db: Kysely<Database>,
    private readonly historyLimit: number,
    private readonly statements = new StatementTexts(),
  ) {}

  /** Records a declaration and drops the ones that fell out of the node's bounded history. */
  async record(declaration: DeclarationRecord): Promise<void> {
    await this.recordMany([declaration]);
  }

  /** Records declarations of many nodes in one transaction, each node's history bounded as for one. */
  async recordMany(declarations: readonly DeclarationRecord[]): Promise<void> {
    if (declarations.length === 0) return;
    await inTransaction(this.db, async (trx) => {
      for (const slice of slices(declarations)) {
        const rows = slice.map((declaration) => ({
          node: declaration.node,
          sequence: declaration.sequence,
          epoch: declaration.epoch,
          issued_at: declaration.issuedAt,
          digest: declaration.digest,
          envelope: declaration.envelope,
          units: JSON.stringify(declaration.units ?? []),
        }));
        await this.statements.run(trx, `declarations.insert.${rows.length}`, rowValues(rows), () =>
          trx.insertInto("declarations").values(rows),
        );
      }
      for (const { node, sequence } of declarations) {
        // A node with no more declarations than the history holds has nothing to drop (most of a fleet, most days).
        if (sequence <= this.historyLimit) continue;
        // Everything older than the node's newest `historyLimit` declarations.
        await this.statements.run(trx, "declarations.trim", [node, node, 1, this.historyLimit - 1], () =>
          trx
            .deleteFrom("declarations")
            .where("node", "=", node)
            .where("sequence", "<", (eb) =>
              eb
                .selectFrom("declarations as kept")
                .select("kept.sequence")
                .where("kept.node", "=", node)
                .orderBy("kept.sequence", "desc")
                .limit(1)
                .offset(this.historyLimit - 1),
            ),
        );
      }
    });
  }

  async latest(node: string): Promise<DeclarationRecord | undefined> {
    const row = await this.db
      .selectFrom("declarations")
      .selectAll()
      .where("node", "=", node)
      .orderBy("sequence", "desc")
      .limit(1)
      .executeTakeFirst();
    return row === undefined ? undefined : toRecord(row);
  }

  /** Newest first. */
  async history(node: string): Promise<DeclarationRecord[]> {
    const rows = await this.db
      .selectFrom("declarations")
      .selectAll()
      .where("node", "=", node)
      .orderBy("sequence", "desc")
      .execute();
    return rows.map(toRecord);
  }

  /**
   * The (epoch, sequence) of each kept declaration with one of these digests, by node and digest: the ordering
   * fallback for many reports at once. Where a node holds a digest twice, the newer counts.
   */
  async ordersOfDigests(
    wanted: readonly { node: string; digest: string }[],
  ): Promise<Map<string, { epoch: number; sequence: number }>> {
    const orders = new Map<string, { epoch: number; sequence: number }>();
    const keys = new Set(wanted.map(({ node, digest }) => digestKey(node, digest)));
    for (const slice of slices([...new Set(wanted.map(({ node }) => node))])) {
      const inSlice = new Set(slice);
      const digests = [...new Set(wanted.filter(({ node }) => inSlice.has(node)).map((w) => w.digest))];
      const { rows } = await this.statements.run(
        this.db,
        `declarations.orders.${slice.length}.${digests.length}`,
        [...slice, ...digests],
        () =>
          this.db
            .selectFrom("declarations")
            .select(["node", "digest", "epoch", "sequence"])
            .where("node", "in", slice)
            .where("digest", "in", digests),
      );
      for (const row of rows) {
        const key = digestKey(row.node, row.digest);
        const known = orders.get(key);
        if (keys.has(key) && (known === undefined || known.sequence < row.sequence))
          orders.set(key, { epoch: row.epoch, sequence: row.sequence });
      }
    }
    return orders;
  }

  /**
   * The epoch and digest of each kept declaration at one of these (node, sequence) places, by `sequenceKey`: whether
   * a report names a declaration that was sent. A sequence is unique per node, across epochs.
   */
  async atSequences(
    wanted: readonly { node: string; sequence: number }[],
  ): Promise<Map<string, { epoch: number; digest: string }>> {
    const found = new Map<string, { epoch: number; digest: string }>();
    const keys = new Set(wanted.map(({ node, sequence }) => sequenceKey(node, sequence)));
    for (const slice of slices([...new Set(wanted.map(({ node }) => node))])) {
      const inSlice = new Set(slice);
      const sequences = [
        ...new Set(wanted.filter(({ node }) => inSlice.has(node)).map(({ sequence }) => sequence)),
      ];
      const { rows } = await this.statements.run(
        this.db,
        `declarations.at.${slice.length}.${sequences.length}`,
        [...slice, ...sequences],
        () =>
          this.db
            .selectFrom("declarations")
            .select(["node", "sequence", "epoch", "digest"])
            .where("node", "in", slice)
            .where("sequence", "in", sequences),
      );
      for (const row of rows) {
        const key = sequenceKey(row.node, row.sequence);
        if (keys.has(key)) found.set(key, { epoch: row.epoch, digest: row.digest });
      }
    }
    return found;
  }

  /**
   * What each node was last sent (all nodes when `nodes` is not given); nodes never declared to are absent. One
   * statement for the whole fleet, so a control plane compares every node's composition with a single read.
   */
  async latestSent(nodes?: readonly string[]): Promise<Map<string, LatestSent>> {
    const found = new Map<string, LatestSent>();
    const query = (slice?: readonly string[]) => {
      // Each node's newest sequence first, one step down its declarations' index, then that one row: a node's whole
      // history is never read. Materialized, or SQLite's planner folds it in and scans every declaration kept.
      let newest = this.db.selectFrom("nodes").select((eb) => [
        "nodes.name as node",
        eb
          .selectFrom("declarations as newest")
          .select((inner) => inner.fn.max("newest.sequence").as("sequence"))
          .whereRef("newest.node", "=", "nodes.name")
          .as("sequence"),
      ]);
      if (slice !== undefined) newest = newest.where("nodes.name", "in", slice);
      return this.db
        .with(
          (cte) => cte("latest").materialized(),
          () => newest,
        )
        .selectFrom("latest")
        .innerJoin("declarations as d", (join) =>
          join.onRef("d.node", "=", "latest.node").onRef("d.sequence", "=", "latest.sequence"),
        )
        .select(["d.node", "d.epoch", "d.sequence", "d.digest", "d.units"])
        .execute();
    };
    const batches = nodes === undefined ? [undefined] : slices([...new Set(nodes)]);
    for (const slice of batches) {
      for (const row of await query(slice)) {
        found.set(row.node, {
          sequence: row.sequence,
          epoch: row.epoch,
          digest: row.digest,
          units: unitsOf(row.units),
        });
      }
    }
    return found;
  }

  /**
   * The (epoch, sequence) of each of these nodes' latest declaration, and when it was issued; nodes never declared
   * to are absent.
   */
  async latestOrders(nodes: readonly string[]): Promise<Map<string, LatestOrder>> {
    const orders = new Map<string, LatestOrder>();
    for (const slice of slices([...new Set(nodes)])) {
      const rows = await this.db
        .selectFrom("declarations as d")
        .select(["d.node", "d.epoch", "d.sequence", "d.issued_at"])
        .where("d.node", "in", slice)
        .where("d.sequence", "=", (eb) =>
          eb
            .selectFrom("declarations as newest")
            .select((inner) => inner.fn.max("newest.sequence").as("sequence"))
            .whereRef("newest.node", "=", "d.node"),
        )
        .execute();
      for (const row of rows) {
        orders.set(row.node, { epoch: row.epoch, sequence: row.sequence, issuedAt: row.issued_at });
      }
    }
    return orders;
  }
}

/** A node's latest declaration: its place in the node's order, and when it was issued. */
export interface LatestOrder {
  epoch: number;
  sequence: number;
  issuedAt: string;
}

/** The key `atSequences` answers under. */
export function sequenceKey(node: string, sequence: number): string {
  return `${node}\n${sequence}`;
}

/** The key `ordersOfDigests` answers under. */
export function digestKey(node: string, digest: string): string {
  return `${node}\n${digest}`;
}

function toRecord(row: Selectable<DeclarationTable>): DeclarationRecord {
  return {
    node: row.node,
    sequence: row.sequence,
    epoch: row.epoch,
    issuedAt: row.issued_at,
    digest: row.digest,
    envelope: row.envelope,
    units: unitsOf(row.units),
  };
}

/** The units column as written by `recordMany`: a JSON list of names. */
function unitsOf(text: string): string[] {
  const value: unknown = JSON.parse(text);
  if (!Array.isArray(value) || !value.every((one) => typeof one === "string")) {
    throw new MeshError(
      "internal",
      `a declaration's units column holds ${text.slice(0, 80)}, not a list of names`,
    );
  }
  return value;
}
