/**
 * Every lease epoch ever taken. Their maximum is the floor: a lease bucket recreated from nothing restarts its
 * revisions at 1, and no epoch at or below the floor may be used again.
 */
import type { Kysely } from "kysely";
import type { Database } from "./schema.js";

export class EpochQueries {
  constructor(private readonly db: Kysely<Database>) {}

  async record(epoch: number, holder: string, takenAt: string): Promise<void> {
    await this.db
      .insertInto("controller_epoch")
      .values({ epoch, holder, taken_at: takenAt })
      .onConflict((oc) => oc.column("epoch").doNothing())
      .execute();
  }

  /** The highest epoch ever taken, or 0 when none was. */
  async floor(): Promise<number> {
    const row = await this.db
      .selectFrom("controller_epoch")
      .select((eb) => eb.fn.max("epoch").as("floor"))
      .executeTakeFirst();
    return Number(row?.floor ?? 0);
  }
}
