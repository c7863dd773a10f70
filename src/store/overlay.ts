/**
 * Overlay addresses: one per node, kept while the node exists (a retired node keeps its own), so no address is ever
 * given to two nodes. Given out in one transaction, so two writers cannot hand one address twice.
 */
import type { Kysely } from "kysely";
import type { Database } from "./schema.js";
import { inTransaction } from "./transaction.js";

export class OverlayQueries {
  constructor(private readonly db: Kysely<Database>) {}

  /** Every address given, by node. */
  async addresses(): Promise<Map<string, string>> {
    const rows = await this.db.selectFrom("overlay_addresses").select(["node", "address"]).execute();
    return new Map(rows.map((row) => [row.node, row.address]));
  }

  /**
   * Gives each node in `wanting` the address `choose` picks from those taken, in one transaction, and returns every
   * address given (the new ones with them). A node replacing its address (the network changed) keeps its row.
   */
  async give(
    wanting: readonly string[],
    choose: (taken: ReadonlySet<string>, nodes: readonly string[]) => Map<string, string>,
    at: string,
  ): Promise<Map<string, string>> {
    return inTransaction(this.db, async (trx) => {
      const rows = await trx.selectFrom("overlay_addresses").select(["node", "address"]).execute();
      const current = new Map(rows.map((row) => [row.node, row.address]));
      const given = choose(new Set(current.values()), wanting);
      for (const [node, address] of given) {
        if (current.has(node)) {
          await trx
            .updateTable("overlay_addresses")
            .set({ address, since: at })
            .where("node", "=", node)
            .execute();
        } else {
          await trx.insertInto("overlay_addresses").values({ node, address, since: at }).execute();
        }
        current.set(node, address);
      }
      return current;
    });
  }
}
