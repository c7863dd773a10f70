/** Declarations as sent: the latest per node and a bounded history behind it, each composition's items kept once. */
import { createHash } from "node:crypto";
import type { Kysely, Selectable } from "kysely";
import type { Database, DeclarationTable } from "./schema.js";
import { MeshError } from "../errors.js";
import { keptDeclarationText } from "../link/index.js";
import { rowValues, StatementTexts } from "./statements.js";
import { inTransaction, slices } from "./transaction.js";

/** A declaration as kept: the envelope exactly as it was sent. */
export interface DeclarationRecord {
  node: string;
  sequence: number;
  epoch: number;
  issuedAt: string;
  digest: string;
  envelope: string;
  /** The plan's units it was composed from (none for a declaration from before plans). */
  units?: readonly string[];
}

/**
 * A declaration to keep: its header, its composition's items exactly as it carried them (`keptItems`), and its seal.
 * The envelope is rebuilt from these byte for byte when it is sent again.
 */
export interface NewDeclaration {
  node: string;
  sequence: number;
  epoch: number;
  issuedAt: string;
  digest: string;
  items: KeptItems;
  /** The envelope's signature (base64) and signer (`SHA256:…`). */
  signature: string;
  signer: string;
  units?: readonly string[];
}

/** A composition's items' text and the key it is kept under, worked out once per composition. */
export interface KeptItems {
  key: string;
  text: string;
}

export function keptItems(text: string): KeptItems {
  return { key: createHash("sha256").update(text).digest("hex"), text };
}

/**
 * How stale a composition's `used_at` may get before a declaration that refers to it writes it again: once an hour
 * at most, so a roll-out writes each composition's row once, not at every chunk, and seldom at all.
 */
const usedAtRefreshMs = 60 * 60_000;

/**
 * How many declarations a node may gain before its history is trimmed again. A trim is a statement of its own per
 * node: at every declaration, a roll-out to 10,000 nodes whose histories are full ran 10,000 of them; at every tenth
 * it runs a tenth as many. A node keeps at most `historyLimit + trimEvery - 1` declarations, and its history reads
 * `historyLimit` of them.
 */
const trimEvery = 10;

/** A composition no declaration refers to is pruned once it has not been used for this long (`pruneItems`). */
export const itemsKeptUnusedMs = 24 * 60 * 60_000;

/** What a node was last sent, without the envelope: what compose compares with and `node list` shows. */
export interface LatestSent {
  sequence: number;
  epoch: number;
  digest: string;
  units: readonly string[];
}

export class DeclarationQueries {
  constructor(
    private readonly db: Kysely<Database>,
    private readonly historyLimit: number,
    private readonly statements = new StatementTexts(),
  ) {}

  /** Records a declaration and drops the ones that fell out of the node's bounded history. */
  async record(declaration: NewDeclaration): Promise<void> {
    await this.recordMany([declaration]);
  }

  /**
   * Records declarations of many nodes in one transaction, each node's history bounded as for one. Each composition's
   * items are written once (and again only to mark them used, at most once an hour); each declaration refers to them.
   * `itemsKept` names compositions that declarations of the same issue time already refer to, recorded in a
   * transaction that has committed: a roll-out's later chunks, whose compositions its earlier chunks wrote. Their
   * items are not written again. The write would change nothing: their `used_at` is within the hour of this issue
   * time already (written then, or left as it was), and the retention prunes no composition a declaration refers to.
   */
  async recordMany(
    declarations: readonly NewDeclaration[],
    itemsKept: ReadonlySet<string> = new Set(),
  ): Promise<void> {
    if (declarations.length === 0) return;
    const items = new Map<string, { key: string; items: string; used_at: string }>();
    for (const { items: kept, issuedAt } of declarations) {
      if (itemsKept.has(kept.key)) continue;
      const known = items.get(kept.key);
      if (known === undefined || known.used_at < issuedAt)
        items.set(kept.key, { key: kept.key, items: kept.text, used_at: issuedAt });
    }
    await inTransaction(this.db, async (trx) => {
      for (const slice of slices([...items.values()])) {
        const newest = slice.reduce((at, row) => (row.used_at > at ? row.used_at : at), "");
        const staleBefore = new Date(Date.parse(newest) - usedAtRefreshMs).toISOString();
        await this.statements.run(
          trx,
          `declaration_items.upsert.${slice.length}`,
          [...rowValues(slice), staleBefore],
          () =>
            trx
              .insertInto("declaration_items")
              .values(slice)
              .onConflict((conflict) =>
                conflict
                  .column("key")
                  .doUpdateSet({ used_at: (eb) => eb.ref("excluded.used_at") })
                  .where("declaration_items.used_at", "<", staleBefore),
              ),
        );
      }
      // A roll-out's nodes on the same units share one list: written out once.
      const unitsTexts = new Map<readonly string[] | undefined, string>();
      const unitsText = (units: readonly string[] | undefined) => {
        let text = unitsTexts.get(units);
        if (text === undefined) unitsTexts.set(units, (text = JSON.stringify(units ?? [])));
        return text;
      };
      for (const slice of slices(declarations)) {
        const rows = slice.map((declaration) => ({
          node: declaration.node,
          sequence: declaration.sequence,
          epoch: declaration.epoch,
          issued_at: declaration.issuedAt,
          digest: declaration.digest,
          units: unitsText(declaration.units),
          items_key: declaration.items.key,
          signature: declaration.signature,
          signer: declaration.signer,
        }));
        await this.statements.run(trx, `declarations.insert.${rows.length}`, rowValues(rows), () =>
          trx.insertInto("declarations").values(rows),
        );
      }
      for (const { node, sequence } of declarations) {
        // A node with no more declarations than the history holds has nothing to drop (most of a fleet, most days);
        // past that, its history is trimmed at every `trimEvery`th declaration.
        if (sequence <= this.historyLimit || sequence % trimEvery !== 0) continue;
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
    const row = await this.kept()
      .where("d.node", "=", node)
      .orderBy("d.sequence", "desc")
      .limit(1)
      .executeTakeFirst();
    return row === undefined ? undefined : toRecord(row);
  }

  /** Newest first. */
  async history(node: string): Promise<DeclarationRecord[]> {
    const rows = await this.kept()
      .where("d.node", "=", node)
      .orderBy("d.sequence", "desc")
      .limit(this.historyLimit)
      .execute();
    return rows.map(toRecord);
  }

  /** Declarations with their composition's items, for rebuilding their envelopes. */
  private kept() {
    return this.db
      .selectFrom("declarations as d")
      .leftJoin("declaration_items as i", "i.key", "d.items_key")
      .select([
        "d.node",
        "d.sequence",
        "d.epoch",
        "d.issued_at",
        "d.digest",
        "d.envelope",
        "d.units",
        "d.items_key",
        "d.signature",
        "d.signer",
        "i.items",
      ]);
  }

  /**
   * Deletes the compositions no kept declaration refers to that were last used before `before` (at least
   * `itemsKeptUnusedMs` ago: a roll-out under way marks what it uses long before it could be among them). Returns
   * how many went.
   */
  async pruneItems(before: string): Promise<number> {
    const stale = await this.db
      .selectFrom("declaration_items")
      .select("key")
      .where("used_at", "<", before)
      .execute();
    if (stale.length === 0) return 0;
    const referred = new Set(
      (
        await this.db
          .selectFrom("declarations")
          .select("items_key")
          .distinct()
          .where("items_key", "is not", null)
          .execute()
      ).map((row) => row.items_key),
    );
    const orphans = stale.map((row) => row.key).filter((key) => !referred.has(key));
    let deleted = 0;
    for (const slice of slices(orphans)) {
      // `used_at` again: one marked used since it was read stays.
      const result = await this.db
        .deleteFrom("declaration_items")
        .where("key", "in", slice)
        .where("used_at", "<", before)
        .executeTakeFirst();
      deleted += Number(result.numDeletedRows);
    }
    return deleted;
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
    // A fleet holds few distinct lists of units: each is read once, and the nodes holding it share it.
    const unitsRead = new Map<string, readonly string[]>();
    for (const slice of batches) {
      for (const row of await query(slice)) {
        let units = unitsRead.get(row.units);
        if (units === undefined) {
          units = Object.freeze(unitsOf(row.units));
          unitsRead.set(row.units, units);
        }
        found.set(row.node, { sequence: row.sequence, epoch: row.epoch, digest: row.digest, units });
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

/** A declaration's row with its composition's items, as `kept()` reads it. */
type KeptRow = Selectable<DeclarationTable> & { items: string | null };

function toRecord(row: KeptRow): DeclarationRecord {
  return {
    node: row.node,
    sequence: row.sequence,
    epoch: row.epoch,
    issuedAt: row.issued_at,
    digest: row.digest,
    envelope: row.envelope ?? envelopeOf(row),
    units: unitsOf(row.units),
  };
}

/** A declaration's envelope rebuilt from its header, its composition's items and its seal. */
function envelopeOf(row: KeptRow): string {
  if (row.items === null || row.signature === null || row.signer === null) {
    const missing = [
      row.items === null ? `its items (${row.items_key ?? "no key"})` : undefined,
      row.signature === null ? "its signature" : undefined,
      row.signer === null ? "its signer" : undefined,
    ].filter((what) => what !== undefined);
    throw new MeshError(
      "internal",
      `declaration ${row.sequence} of ${row.node} keeps no envelope and cannot be rebuilt: ` +
        `${missing.join(", ")} not kept`,
    );
  }
  return keptDeclarationText({
    header: { node: row.node, epoch: row.epoch, sequence: row.sequence, issued_at: row.issued_at },
    itemsText: row.items,
    digest: row.digest,
    signature: row.signature,
    signer: row.signer,
  });
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
