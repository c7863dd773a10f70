/** Counters per node: how many of its messages were refused, and why. */
import type { Kysely } from "kysely";
import type { Database } from "./schema.js";
import { inTransaction, slices } from "./transaction.js";

export class CounterQueries {
  constructor(private readonly db: Kysely<Database>) {}

  async add(node: string, name: string, by = 1): Promise<void> {
    await this.addMany([{ node, name, by }]);
  }

  /** Adds to many counters, a few statements for all of them. */
  async addMany(additions: readonly { node: string; name: string; by: number }[]): Promise<void> {
    // One row per counter: an upsert may not touch the same row twice in one statement.
    const totals = new Map<string, { node: string; name: string; value: number }>();
    for (const { node, name, by } of additions) {
      const key = `${node}\n${name}`;
      const total = totals.get(key);
      if (total === undefined) totals.set(key, { node, name, value: by });
      else total.value += by;
    }
    if (totals.size === 0) return;
    await inTransaction(this.db, async (trx) => {
      for (const slice of slices([...totals.values()])) {
        await trx
          .insertInto("node_counters")
          .values(slice)
          .onConflict((oc) =>
            oc
              .columns(["node", "name"])
              .doUpdateSet((eb) => ({ value: eb("node_counters.value", "+", eb.ref("excluded.value")) })),
          )
          .execute();
      }
    });
  }

  async of(node: string): Promise<Record<string, number>> {
    const rows = await this.db
      .selectFrom("node_counters")
      .select(["name", "value"])
      .where("node", "=", node)
      .execute();
    return Object.fromEntries(rows.map((row) => [row.name, Number(row.value)]));
  }
}
