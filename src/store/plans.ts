/**
 * Every revision of the plan, kept with who wrote it, when and under which epoch. A revision is written by
 * compare-and-set on the one before it, and only with an epoch at or above the floor: the store itself refuses a
 * write from a controller that lost its lease, whatever that controller's own clock told it. Both conditions are
 * checked in the statement that writes, so nothing can slip between the check and the write.
 */
import type { Kysely } from "kysely";
import { sql } from "kysely";
import { MeshError } from "../errors.js";
import type { Database } from "./schema.js";

export interface PlanRevision {
  revision: number;
  /** The plan as written (canonical JSON). */
  plan: string;
  writtenAt: string;
  writtenBy: string;
  epoch: number;
}

export interface PlanWrite {
  /** The revision the writer read: the write lands only while it is still the newest (0: no plan yet). */
  expected: number;
  plan: string;
  at: string;
  by: string;
  epoch: number;
}

export class PlanQueries {
  constructor(private readonly db: Kysely<Database>) {}

  /** Writes revision `expected + 1`, or refuses: `plan_changed` when another came first, `fenced` below the floor. */
  async write(write: PlanWrite): Promise<number> {
    const revision = write.expected + 1;
    const result = await this.db
      .insertInto("plans")
      .columns(["revision", "plan", "written_at", "written_by", "epoch"])
      .expression((eb) =>
        this.db
          .selectNoFrom([
            sql<number>`cast(${revision} as integer)`.as("revision"),
            sql<string>`cast(${write.plan} as text)`.as("plan"),
            sql<string>`cast(${write.at} as text)`.as("written_at"),
            sql<string>`cast(${write.by} as text)`.as("written_by"),
            sql<number>`cast(${write.epoch} as integer)`.as("epoch"),
          ])
          .where(
            sql<number>`cast(${write.epoch} as integer)`,
            ">=",
            eb.selectFrom("controller_epoch").select(sql<number>`coalesce(max(epoch), 0)`.as("floor")),
          )
          .where(
            sql<number>`cast(${write.expected} as integer)`,
            "=",
            eb.selectFrom("plans").select(sql<number>`coalesce(max(revision), 0)`.as("newest")),
          ),
      )
      .onConflict((oc) => oc.column("revision").doNothing())
      .executeTakeFirst();
    if (Number(result.numInsertedOrUpdatedRows ?? 0) === 1) return revision;
    const floor = Number(
      (
        await this.db
          .selectFrom("controller_epoch")
          .select(sql<number>`coalesce(max(epoch), 0)`.as("floor"))
          .executeTakeFirst()
      )?.floor ?? 0,
    );
    if (write.epoch < floor) {
      throw new MeshError(
        "fenced",
        `the plan was not written: epoch ${write.epoch} is below the floor ${floor} (another controller took the lease)`,
      );
    }
    throw new MeshError("plan_changed", `plan changed since revision ${write.expected}`);
  }

  /** The newest revision, or undefined when no plan was ever written. */
  async current(): Promise<PlanRevision | undefined> {
    const row = await this.db
      .selectFrom("plans")
      .selectAll()
      .orderBy("revision", "desc")
      .limit(1)
      .executeTakeFirst();
    return row === undefined ? undefined : revisionOf(row);
  }

  async at(revision: number): Promise<PlanRevision | undefined> {
    const row = await this.db
      .selectFrom("plans")
      .selectAll()
      .where("revision", "=", revision)
      .executeTakeFirst();
    return row === undefined ? undefined : revisionOf(row);
  }

  /** Every revision, newest first, without the plans' text. */
  async history(): Promise<Array<Omit<PlanRevision, "plan">>> {
    const rows = await this.db
      .selectFrom("plans")
      .select(["revision", "written_at", "written_by", "epoch"])
      .orderBy("revision", "desc")
      .execute();
    return rows.map((row) => ({
      revision: Number(row.revision),
      writtenAt: row.written_at,
      writtenBy: row.written_by,
      epoch: Number(row.epoch),
    }));
  }
}

function revisionOf(row: Database["plans"]): PlanRevision {
  return {
    revision: Number(row.revision),
    plan: row.plan,
    writtenAt: row.written_at,
    writtenBy: row.written_by,
    epoch: Number(row.epoch),
  };
}
