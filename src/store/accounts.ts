/**
 * Accounts: the reports nodes sent about themselves. The newest kept account is the node's recovery copy; a
 * bounded history stands behind it, a ring of `historyLimit` places a node. An account is a statement by the node,
 * never what the node should hold.
 */
import type { Insertable, Kysely, Selectable } from "kysely";
import type { AccountHeadTable, AccountTable, Database } from "./schema.js";
import { rowValues, StatementTexts } from "./statements.js";
import { inTransaction, slices } from "./transaction.js";

export interface AccountRecord {
  node: string;
  receivedAt: string;
  epoch: number | null;
  sequence: number | null;
  reportSequence: number | null;
  digest: string;
  outcome: string;
  report: string;
}

export class AccountQueries {
  constructor(
    private readonly db: Kysely<Database>,
    private readonly historyLimit: number,
    private readonly statements = new StatementTexts(),
  ) {}

  /** Keeps an account as the node's recovery copy, in place of its oldest once its history is full. */
  async keep(account: AccountRecord): Promise<void> {
    await this.keepMany([account]);
  }

  /**
   * Keeps accounts in the order given (the last of each node becomes its recovery copy), all in one transaction:
   * a batch of reports costs a few statements, not a few per report. Each node's accounts are numbered on from its
   * newest (read in the transaction, so two processes never number from a stale head) and each goes in place of the
   * one `historyLimit` older; of a node's accounts in one batch only the newest `historyLimit` are written (the rest
   * would be overwritten at once, and one statement may not write a row twice).
   */
  async keepMany(accounts: readonly AccountRecord[]): Promise<void> {
    if (accounts.length === 0) return;
    const byNode = new Map<string, AccountRecord[]>();
    for (const account of accounts) {
      const own = byNode.get(account.node);
      if (own === undefined) byNode.set(account.node, [account]);
      else own.push(account);
    }
    await inTransaction(this.db, async (trx) => {
      const heads = await this.headsOf(trx, [...byNode.keys()]);
      const laidOtherwise = [...heads].flatMap(([node, head]) =>
        head.places === this.historyLimit ? [] : [node],
      );
      if (laidOtherwise.length > 0) await this.layOut(trx, laidOtherwise);
      const rows: Array<Insertable<AccountTable>> = [];
      const newest: Array<Insertable<AccountHeadTable>> = [];
      for (const [node, own] of byNode) {
        const head = heads.get(node)?.kept ?? 0;
        const skipped = Math.max(0, own.length - this.historyLimit);
        own.slice(skipped).forEach((account, i) => {
          const kept = head + skipped + i + 1;
          rows.push(toRow(account, kept, kept % this.historyLimit));
        });
        const kept = head + own.length;
        newest.push({ node, kept, slot: kept % this.historyLimit, places: this.historyLimit });
      }
      for (const slice of slices(rows)) {
        await this.statements.run(trx, `accounts.keep.${slice.length}`, rowValues(slice), () =>
          trx
            .insertInto("accounts")
            .values(slice)
            .onConflict((conflict) =>
              conflict.columns(["node", "slot"]).doUpdateSet((eb) => ({
                kept: eb.ref("excluded.kept"),
                received_at: eb.ref("excluded.received_at"),
                epoch: eb.ref("excluded.epoch"),
                sequence: eb.ref("excluded.sequence"),
                report_sequence: eb.ref("excluded.report_sequence"),
                digest: eb.ref("excluded.digest"),
                outcome: eb.ref("excluded.outcome"),
                report: eb.ref("excluded.report"),
              })),
            ),
        );
      }
      for (const slice of slices(newest)) {
        await this.statements.run(trx, `accounts.heads.${slice.length}`, rowValues(slice), () =>
          trx
            .insertInto("account_heads")
            .values(slice)
            .onConflict((conflict) =>
              conflict.column("node").doUpdateSet((eb) => ({
                kept: eb.ref("excluded.kept"),
                slot: eb.ref("excluded.slot"),
                places: eb.ref("excluded.places"),
              })),
            ),
        );
      }
    });
  }

  /** Each of these nodes' head (its newest account's number, and its ring's places), for those that have one. */
  private async headsOf(
    trx: Kysely<Database>,
    nodes: readonly string[],
  ): Promise<Map<string, { kept: number; places: number }>> {
    const heads = new Map<string, { kept: number; places: number }>();
    for (const slice of slices(nodes)) {
      const { rows } = await this.statements.run(trx, `accounts.headsOf.${slice.length}`, slice, () =>
        trx.selectFrom("account_heads").select(["node", "kept", "places"]).where("node", "in", slice),
      );
      for (const { node, kept, places } of rows) heads.set(node, { kept, places });
    }
    return heads;
  }

  /**
   * Lays these nodes' rings out again for this process's `historyLimit`, which differs from the one they were laid
   * out with: each node's newest accounts, as many as the limit, at the places it gives them, the rest deleted. Left
   * as they were, the next accounts would land on places still holding accounts of the new history.
   */
  private async layOut(trx: Kysely<Database>, nodes: readonly string[]): Promise<void> {
    for (const slice of slices(nodes)) {
      const rows = await trx
        .selectFrom("accounts")
        .selectAll()
        .where("node", "in", slice)
        .orderBy("node")
        .orderBy("kept", "desc")
        .execute();
      await trx.deleteFrom("accounts").where("node", "in", slice).execute();
      const taken = new Map<string, number>();
      const kept = rows.filter(({ node }) => {
        const count = (taken.get(node) ?? 0) + 1;
        taken.set(node, count);
        return count <= this.historyLimit;
      });
      for (const part of slices(kept)) {
        await trx
          .insertInto("accounts")
          .values(part.map((row) => ({ ...row, slot: row.kept % this.historyLimit })))
          .execute();
      }
      await trx
        .updateTable("account_heads")
        .set((eb) => ({ slot: eb("kept", "%", this.historyLimit), places: this.historyLimit }))
        .where("node", "in", slice)
        .execute();
    }
  }

  /** The newest kept account, or undefined when the node never reported. */
  async recoveryCopy(node: string): Promise<AccountRecord | undefined> {
    return (await this.recoveryCopies([node])).get(node);
  }

  /**
   * The recovery copy of each of these nodes that ever reported: its newest account, at the place its head names
   * (one lookup a node, whatever the history holds).
   */
  async recoveryCopies(nodes: readonly string[]): Promise<Map<string, AccountRecord>> {
    const copies = new Map<string, AccountRecord>();
    for (const slice of slices([...new Set(nodes)])) {
      const { rows } = await this.statements.run(this.db, `accounts.copies.${slice.length}`, slice, () =>
        this.db
          .selectFrom("account_heads as heads")
          .innerJoin("accounts", (join) =>
            join
              .onRef("accounts.node", "=", "heads.node")
              .onRef("accounts.slot", "=", "heads.slot")
              .onRef("accounts.kept", "=", "heads.kept"),
          )
          .selectAll("accounts")
          .where("heads.node", "in", slice),
      );
      for (const row of rows) copies.set(row.node, toRecord(row));
    }
    return copies;
  }

  /** Newest first, `historyLimit` at most. */
  async history(node: string): Promise<AccountRecord[]> {
    const rows = await this.db
      .selectFrom("accounts")
      .selectAll()
      .where("node", "=", node)
      .orderBy("kept", "desc")
      .limit(this.historyLimit)
      .execute();
    return rows.map(toRecord);
  }
}

/** An account as a row at its place in the ring, its columns always in this order. */
function toRow(account: AccountRecord, kept: number, slot: number): Insertable<AccountTable> {
  return {
    node: account.node,
    slot,
    kept,
    received_at: account.receivedAt,
    epoch: account.epoch,
    sequence: account.sequence,
    report_sequence: account.reportSequence,
    digest: account.digest,
    outcome: account.outcome,
    report: account.report,
  };
}

function toRecord(row: Selectable<AccountTable>): AccountRecord {
  return {
    node: row.node,
    receivedAt: row.received_at,
    epoch: row.epoch,
    sequence: row.sequence,
    reportSequence: row.report_sequence,
    digest: row.digest,
    outcome: row.outcome,
    report: row.report,
  };
}
