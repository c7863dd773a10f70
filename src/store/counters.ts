/** Counters per node: how many of its messages were refused, and why. */
import type { Kysely } from "kysely";
import type { Database } from "./schema.js";

export class CounterQueries {
  constructor(private readonly db: Kysely<Database>) {}

  async add(node: string, name: string, by = 1): Promise<void> {
    await this.db
      .insertInto("node_counters")
      .values({ node, name, value: by })
      .onConflict((oc) =>
        oc.columns(["node", "name"]).doUpdateSet((eb) => ({ value: eb("node_counters.value", "+", by) })),
      )
      .execute();
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
