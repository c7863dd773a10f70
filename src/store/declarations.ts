/** Declarations as sent: the latest per node and a bounded history behind it. */
import type { Kysely } from "kysely";
import type { Database, DeclarationTable } from "./schema.js";

export interface DeclarationRecord {
  node: string;
  sequence: number;
  epoch: number;
  issuedAt: string;
  digest: string;
  envelope: string;
}

export class DeclarationQueries {
  constructor(
    private readonly db: Kysely<Database>,
    private readonly historyLimit: number,
  ) {}

  /** Records a declaration and drops the ones that fell out of the node's bounded history. */
  async record(declaration: DeclarationRecord): Promise<void> {
    await this.recordMany([declaration]);
  }

  /** Records declarations of many nodes in one transaction, each node's history bounded as for one. */
  async recordMany(declarations: readonly DeclarationRecord[]): Promise<void> {
    await this.db.transaction().execute(async (trx) => {
      for (const declaration of declarations) {
        await trx
          .insertInto("declarations")
          .values({
            node: declaration.node,
            sequence: declaration.sequence,
            epoch: declaration.epoch,
            issued_at: declaration.issuedAt,
            digest: declaration.digest,
            envelope: declaration.envelope,
          })
          .execute();
        // A node with no more declarations than the history holds has nothing to drop (most of a fleet, most days).
        if (declaration.sequence <= this.historyLimit) continue;
        const oldestKept = await trx
          .selectFrom("declarations")
          .select("sequence")
          .where("node", "=", declaration.node)
          .orderBy("sequence", "desc")
          .limit(1)
          .offset(this.historyLimit - 1)
          .executeTakeFirst();
        if (oldestKept !== undefined) {
          await trx
            .deleteFrom("declarations")
            .where("node", "=", declaration.node)
            .where("sequence", "<", oldestKept.sequence)
            .execute();
        }
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

  /** The (epoch, sequence) of the kept declaration with this digest: the ordering fallback for older agents. */
  async orderOfDigest(
    node: string,
    digest: string,
  ): Promise<{ epoch: number; sequence: number } | undefined> {
    return this.db
      .selectFrom("declarations")
      .select(["epoch", "sequence"])
      .where("node", "=", node)
      .where("digest", "=", digest)
      .orderBy("sequence", "desc")
      .limit(1)
      .executeTakeFirst();
  }
}

function toRecord(row: DeclarationTable): DeclarationRecord {
  return {
    node: row.node,
    sequence: row.sequence,
    epoch: row.epoch,
    issuedAt: row.issued_at,
    digest: row.digest,
    envelope: row.envelope,
  };
}
