/**
 * Accounts: the reports nodes sent about themselves. The newest kept account is the node's recovery copy; a
 * bounded history stands behind it. An account is a statement by the node, never what the node should hold.
 */
import type { Insertable, Kysely, Selectable } from "kysely";
import { CompiledQuery } from "kysely";
import { StoreError } from "../errors.js";
import type { AccountTable, Database } from "./schema.js";
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
    /** The insert statement's SQL by number of rows, shared by the store's transactions. */
    private readonly insertText = new Map<number, string>(),
  ) {}

  /** Keeps an account as the node's recovery copy and trims the history behind it. */
  async keep(account: AccountRecord): Promise<void> {
    await this.keepMany([account]);
  }

  /**
   * Keeps accounts in the order given (the last of each node becomes its recovery copy) and trims each node's
   * history, all in one transaction: a batch of reports costs a few statements, not a few per report.
   */
  async keepMany(accounts: readonly AccountRecord[]): Promise<void> {
    if (accounts.length === 0) return;
    await inTransaction(this.db, async (trx) => {
      for (const slice of slices(accounts)) await this.insert(trx, slice);
      for (const nodes of slices([...new Set(accounts.map((account) => account.node))])) {
        // Everything behind each node's newest `historyLimit` accounts, ranked within the node.
        const ranked = trx
          .selectFrom("accounts")
          .select((eb) => [
            "id",
            eb.fn
              .agg<number>("row_number")
              .over((ob) => ob.partitionBy("node").orderBy("id", "desc"))
              .as("place"),
          ])
          .where("node", "in", nodes)
          .as("ranked");
        await trx
          .deleteFrom("accounts")
          .where("id", "in", (eb) =>
            eb.selectFrom(ranked).select("ranked.id").where("ranked.place", ">", this.historyLimit),
          )
          .execute();
      }
    });
  }

  /**
   * Inserts accounts in one statement. Building a statement of a few hundred rows costs more than running it, so
   * its SQL is built once for each number of rows and the values are bound in the same order.
   */
  private async insert(trx: Kysely<Database>, accounts: readonly AccountRecord[]): Promise<void> {
    const rows = accounts.map(toRow);
    const parameters = rows.flatMap((row) => Object.values(row));
    let text = this.insertText.get(rows.length);
    if (text === undefined) {
      const compiled = trx.insertInto("accounts").values(rows).compile();
      // Checked when built: the statement binds exactly these values in this order.
      if (
        compiled.parameters.length !== parameters.length ||
        compiled.parameters.some((v, i) => v !== parameters[i])
      )
        throw new StoreError("the accounts insert binds its values in an unexpected order");
      text = compiled.sql;
      this.insertText.set(rows.length, text);
    }
    await trx.executeQuery(CompiledQuery.raw(text, parameters));
  }

  /** The newest kept account, or undefined when the node never reported. */
  async recoveryCopy(node: string): Promise<AccountRecord | undefined> {
    return (await this.recoveryCopies([node])).get(node);
  }

  /** The recovery copy of each of these nodes that ever reported. */
  async recoveryCopies(nodes: readonly string[]): Promise<Map<string, AccountRecord>> {
    const copies = new Map<string, AccountRecord>();
    for (const slice of slices([...new Set(nodes)])) {
      const rows = await this.db
        .selectFrom("accounts")
        .selectAll()
        .where("id", "in", (eb) =>
          eb
            .selectFrom("accounts")
            .select((inner) => inner.fn.max("id").as("id"))
            .where("node", "in", slice)
            .groupBy("node"),
        )
        .execute();
      for (const row of rows) copies.set(row.node, toRecord(row));
    }
    return copies;
  }

  /** Newest first. */
  async history(node: string): Promise<AccountRecord[]> {
    const rows = await this.db
      .selectFrom("accounts")
      .selectAll()
      .where("node", "=", node)
      .orderBy("id", "desc")
      .execute();
    return rows.map(toRecord);
  }
}

/** An account as a row, its columns always in this order. */
function toRow(account: AccountRecord): Insertable<AccountTable> {
  return {
    node: account.node,
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
