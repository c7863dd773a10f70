/**
 * Accounts: the reports nodes sent about themselves. The newest kept account is the node's recovery copy; a
 * bounded history stands behind it. An account is a statement by the node, never what the node should hold.
 */
import type { Insertable, Kysely, Selectable } from "kysely";
import type { AccountTable, Database } from "./schema.js";
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

/**
 * How many accounts a node may gain before its history is trimmed again. Trimming a node walks its index back
 * `historyLimit` steps and deletes a row from an old page; done at every report it cost as much as keeping the report
 * (measured on SQLite), done every tenth it costs a tenth. A node holds at most `historyLimit + trimEvery - 1`
 * accounts, and its history reads `historyLimit` of them, as it always did.
 */
const trimEvery = 10;

export class AccountQueries {
  constructor(
    private readonly db: Kysely<Database>,
    private readonly historyLimit: number,
    private readonly statements = new StatementTexts(),
    /**
     * Accounts kept per node since this process last trimmed its history, shared by the store and every transaction
     * it hands out. A node not in it (none kept since this process began) is trimmed at its next account. Should
     * a transaction that trimmed roll back, the node is trimmed again `trimEvery` accounts later: its history grows
     * by at most that much meanwhile.
     */
    private readonly sinceTrimmed = new Map<string, number>(),
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
    const added = new Map<string, number>();
    for (const { node } of accounts) added.set(node, (added.get(node) ?? 0) + 1);
    const due = [...added].flatMap(([node, count]) => {
      const since = this.sinceTrimmed.get(node);
      return since === undefined || since + count >= trimEvery ? [node] : [];
    });
    await inTransaction(this.db, async (trx) => {
      for (const slice of slices(accounts)) await this.insert(trx, slice);
      for (const nodes of slices(due)) {
        // Each node's edge is the newest account behind the ones it keeps, found by walking its index back
        // `historyLimit` steps; that account and everything older go. Nodes with no more than that have no edge.
        await this.statements.run(
          trx,
          `accounts.trim.${nodes.length}`,
          [1, this.historyLimit, ...nodes],
          () =>
            trx.deleteFrom("accounts").where("id", "in", (eb) =>
              eb
                .selectFrom("accounts as old")
                .innerJoin(
                  (inner) =>
                    inner
                      .selectFrom("nodes")
                      .select((node) => [
                        "nodes.name as node",
                        node
                          .selectFrom("accounts as kept")
                          .select("kept.id")
                          .whereRef("kept.node", "=", "nodes.name")
                          .orderBy("kept.id", "desc")
                          .limit(1)
                          .offset(this.historyLimit)
                          .as("edge"),
                      ])
                      .where("nodes.name", "in", nodes)
                      .as("edges"),
                  (join) => join.onRef("old.node", "=", "edges.node").onRef("old.id", "<=", "edges.edge"),
                )
                .select("old.id"),
            ),
        );
      }
    });
    for (const [node, count] of added)
      this.sinceTrimmed.set(node, (this.sinceTrimmed.get(node) ?? 0) + count);
    for (const node of due) this.sinceTrimmed.set(node, 0);
  }

  /** Inserts accounts in one statement, its values bound in the order of the table's columns. */
  private async insert(trx: Kysely<Database>, accounts: readonly AccountRecord[]): Promise<void> {
    const rows = accounts.map(toRow);
    const values = rowValues(rows);
    await this.statements.run(trx, `accounts.insert.${rows.length}`, values, () =>
      trx.insertInto("accounts").values(rows),
    );
  }

  /** The newest kept account, or undefined when the node never reported. */
  async recoveryCopy(node: string): Promise<AccountRecord | undefined> {
    return (await this.recoveryCopies([node])).get(node);
  }

  /** The recovery copy of each of these nodes that ever reported. */
  async recoveryCopies(nodes: readonly string[]): Promise<Map<string, AccountRecord>> {
    const copies = new Map<string, AccountRecord>();
    for (const slice of slices([...new Set(nodes)])) {
      // Each node's newest account is one step down its index, where grouping would walk its whole history.
      const { rows } = await this.statements.run(this.db, `accounts.copies.${slice.length}`, slice, () =>
        this.db
          .selectFrom("nodes")
          .innerJoin("accounts", (join) =>
            join.on("accounts.id", "=", (eb) =>
              eb
                .selectFrom("accounts as newest")
                .select((inner) => inner.fn.max("newest.id").as("id"))
                .whereRef("newest.node", "=", "nodes.name"),
            ),
          )
          .selectAll("accounts")
          .where("nodes.name", "in", slice),
      );
      for (const row of rows) copies.set(row.node, toRecord(row));
    }
    return copies;
  }

  /** Newest first, `historyLimit` at most (until its next trim a node may hold a few more). */
  async history(node: string): Promise<AccountRecord[]> {
    const rows = await this.db
      .selectFrom("accounts")
      .selectAll()
      .where("node", "=", node)
      .orderBy("id", "desc")
      .limit(this.historyLimit)
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
