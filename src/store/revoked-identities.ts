/** Broker identities kept refused for good: a node's earlier identity after it enrolled again with a new one. */
import type { Kysely } from "kysely";
import type { Database } from "./schema.js";

export class RevokedIdentityQueries {
  constructor(private readonly db: Kysely<Database>) {}

  async add(brokerUser: string, node: string, since: string): Promise<void> {
    await this.db
      .insertInto("revoked_identities")
      .values({ broker_user: brokerUser, node, since })
      .onConflict((oc) => oc.column("broker_user").doNothing())
      .execute();
  }

  /** The node this identity was revoked from, if it was. */
  async nodeOf(brokerUser: string): Promise<string | undefined> {
    const row = await this.db
      .selectFrom("revoked_identities")
      .select("node")
      .where("broker_user", "=", brokerUser)
      .executeTakeFirst();
    return row?.node;
  }

  async list(): Promise<Array<{ brokerUser: string; node: string; since: string }>> {
    const rows = await this.db.selectFrom("revoked_identities").selectAll().orderBy("since").execute();
    return rows.map((row) => ({ brokerUser: row.broker_user, node: row.node, since: row.since }));
  }
}
