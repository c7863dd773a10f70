/**
 * Controllers that run without an epoch because the lease cannot be written at all. The condition is urgent and
 * must never be silent: every controller in it keeps a row here fresh, and `mesh lease show` reads them.
 */
import type { Kysely } from "kysely";
import type { ControllerNoEpochTable, Database } from "./schema.js";

/** One controller in the condition, as its row holds it. */
export type NoEpochController = ControllerNoEpochTable;

export class NoEpochQueries {
  constructor(private readonly db: Kysely<Database>) {}

  /** Records or refreshes the condition for one controller. */
  async raise(condition: NoEpochController): Promise<void> {
    await this.db
      .insertInto("controller_no_epoch")
      .values(condition)
      .onConflict((oc) =>
        oc.column("controller").doUpdateSet({ reason: condition.reason, seen_at: condition.seen_at }),
      )
      .execute();
  }

  async clear(controller: string): Promise<void> {
    await this.db.deleteFrom("controller_no_epoch").where("controller", "=", controller).execute();
  }

  /** Controllers in the condition that refreshed it at or after `freshSince`. */
  async current(freshSince: Date): Promise<NoEpochController[]> {
    return this.db
      .selectFrom("controller_no_epoch")
      .selectAll()
      .where("seen_at", ">=", freshSince.toISOString())
      .orderBy("since")
      .execute();
  }
}
