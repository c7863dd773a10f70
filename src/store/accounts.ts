/**
 * Accounts: the reports nodes sent about themselves. The newest kept account is the node's recovery copy; a
 * bounded history stands behind it. An account is a statement by the node, never what the node should hold.
 */
import type { Kysely, Selectable } from "kysely";
import type { AccountTable, Database } from "./schema.js";

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
  ) {}

  /** Keeps an account as the node's recovery copy and trims the history behind it. */
  async keep(account: AccountRecord): Promise<void> {
    await this.db.transaction().execute(async (trx) => {
      await trx
        .insertInto("accounts")
        .values({
          node: account.node,
          received_at: account.receivedAt,
          epoch: account.epoch,
          sequence: account.sequence,
          report_sequence: account.reportSequence,
          digest: account.digest,
          outcome: account.outcome,
          report: account.report,
        })
        .execute();
      const oldestKept = await trx
        .selectFrom("accounts")
        .select("id")
        .where("node", "=", account.node)
        .orderBy("id", "desc")
        .limit(1)
        .offset(this.historyLimit - 1)
        .executeTakeFirst();
      if (oldestKept !== undefined) {
        await trx
          .deleteFrom("accounts")
          .where("node", "=", account.node)
          .where("id", "<", oldestKept.id)
          .execute();
      }
    });
  }

  /** The newest kept account, or undefined when the node never reported. */
  async recoveryCopy(node: string): Promise<AccountRecord | undefined> {
    const row = await this.db
      .selectFrom("accounts")
      .selectAll()
      .where("node", "=", node)
      .orderBy("id", "desc")
      .limit(1)
      .executeTakeFirst();
    return row === undefined ? undefined : toRecord(row);
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
