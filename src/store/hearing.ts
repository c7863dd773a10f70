/**
 * When the acting control plane could hear: the latest moment it knew it heard the broker and could write here, the
 * start of that stretch of hearing, and the gaps before it (a broker it could not reach, a store it could not write,
 * no controller running). Liveness reads these so that no node is called out of touch for time nobody listened.
 */
import type { Kysely } from "kysely";
import type { Database } from "./schema.js";

/** The one row's key: there is one acting control plane at a time, and its hearing is the mesh's. */
const key = "control";

/** Gaps kept: enough to judge any node silent for weeks through a deafness a day. */
export const hearingGapsKept = 1000;

export interface HearingGap {
  from: string;
  to: string;
}

export interface HearingRecord {
  /** The latest moment the control plane knew it heard. */
  heardAt: string;
  /** Since when it has heard without a gap, up to `heardAt`. */
  since: string;
  /** Earlier stretches without hearing, newest first. */
  gaps: HearingGap[];
}

export class HearingQueries {
  constructor(private readonly db: Kysely<Database>) {}

  /**
   * A stretch of hearing begins at `at`: the time since the last moment heard is a gap (nobody listened then).
   * Returns that gap, if there was one.
   */
  async begin(at: string): Promise<HearingGap | undefined> {
    const current = await this.db
      .selectFrom("control_hearing")
      .select(["heard_at"])
      .where("key", "=", key)
      .executeTakeFirst();
    const gap =
      current !== undefined && current.heard_at < at ? { from: current.heard_at, to: at } : undefined;
    if (gap !== undefined) {
      await this.db.insertInto("hearing_gaps").values({ from_at: gap.from, to_at: gap.to }).execute();
      await this.db
        .deleteFrom("hearing_gaps")
        .where(
          "to_at",
          "<",
          this.db
            .selectFrom("hearing_gaps")
            .select("to_at")
            .orderBy("to_at", "desc")
            .offset(hearingGapsKept - 1)
            .limit(1),
        )
        .execute();
    }
    await this.db
      .insertInto("control_hearing")
      .values({ key, heard_at: at, since: at })
      .onConflict((oc) => oc.column("key").doUpdateSet({ heard_at: at, since: at }))
      .execute();
    return gap;
  }

  /** The control plane heard at `at`, within the stretch that began at `since`. */
  async heard(at: string, since: string): Promise<void> {
    await this.db
      .updateTable("control_hearing")
      .set({ heard_at: at })
      .where("key", "=", key)
      .where("since", "=", since)
      .where("heard_at", "<", at)
      .execute();
  }

  /** What is known, or undefined when no control plane has acted here yet. */
  async read(): Promise<HearingRecord | undefined> {
    const row = await this.db
      .selectFrom("control_hearing")
      .select(["heard_at", "since"])
      .where("key", "=", key)
      .executeTakeFirst();
    if (row === undefined) return undefined;
    const gaps = await this.db
      .selectFrom("hearing_gaps")
      .select(["from_at", "to_at"])
      .orderBy("to_at", "desc")
      .limit(hearingGapsKept)
      .execute();
    return {
      heardAt: row.heard_at,
      since: row.since,
      gaps: gaps.map((gap) => ({ from: gap.from_at, to: gap.to_at })),
    };
  }
}
