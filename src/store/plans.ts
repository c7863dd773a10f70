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

/** A unit allot could not place as asked, as kept. */
export interface StoredCondition {
  unit: string;
  wanted: number | "every";
  placed: number;
  reason: string;
  epoch: number;
  since: string;
}

/** Which plan revision the control plane has composed and sent, and under which epoch. */
export interface PlanSent {
  revision: number;
  epoch: number;
  sentAt: string;
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
          .where(sql<number>`cast(${write.epoch} as integer)`, ">=", floorQuery(this.db))
          .where(
            sql<number>`cast(${write.expected} as integer)`,
            "=",
            eb.selectFrom("plans").select(sql<number>`coalesce(max(revision), 0)`.as("newest")),
          ),
      )
      .onConflict((oc) => oc.column("revision").doNothing())
      .executeTakeFirst();
    if (Number(result.numInsertedOrUpdatedRows ?? 0) === 1) return revision;
    const floor = await floorOf(this.db);
    if (write.epoch < floor) throw belowFloor("the plan was not written", write.epoch, floor);
    throw new MeshError("plan_changed", `plan changed since revision ${write.expected}`);
  }

  /** The newest revision's number (0: no plan yet): what a control plane looks at to see that the plan changed. */
  async newest(): Promise<number> {
    const row = await this.db
      .selectFrom("plans")
      .select(sql<number>`coalesce(max(revision), 0)`.as("newest"))
      .executeTakeFirst();
    return Number(row?.newest ?? 0);
  }

  /**
   * Replaces the conditions with what allot found now, under `epoch`; a condition that lasts keeps its `since`.
   * Refused (`fenced`) below the floor, checked by each writing statement, so a controller that lost its lease
   * never writes what it found.
   */
  async writeConditions(
    conditions: ReadonlyArray<Omit<StoredCondition, "epoch" | "since">>,
    epoch: number,
    at: string,
  ): Promise<void> {
    await this.db.transaction().execute(async (trx) => {
      const floor = await floorOf(trx);
      if (epoch < floor) throw belowFloor("the plan's conditions were not written", epoch, floor);
      const before = new Map(
        (await trx.selectFrom("plan_conditions").select(["unit", "since"]).execute()).map((row) => [
          row.unit,
          row.since,
        ]),
      );
      await trx
        .deleteFrom("plan_conditions")
        .where(sql<number>`cast(${epoch} as integer)`, ">=", floorQuery(trx))
        .execute();
      for (const condition of conditions) {
        await trx
          .insertInto("plan_conditions")
          .columns(["unit", "wanted", "placed", "reason", "epoch", "since"])
          .expression(
            trx
              .selectNoFrom([
                sql<string>`cast(${condition.unit} as text)`.as("unit"),
                sql<string>`cast(${String(condition.wanted)} as text)`.as("wanted"),
                sql<number>`cast(${condition.placed} as integer)`.as("placed"),
                sql<string>`cast(${condition.reason} as text)`.as("reason"),
                sql<number>`cast(${epoch} as integer)`.as("epoch"),
                sql<string>`cast(${before.get(condition.unit) ?? at} as text)`.as("since"),
              ])
              .where(sql<number>`cast(${epoch} as integer)`, ">=", floorQuery(trx)),
          )
          .execute();
      }
    });
  }

  async conditions(): Promise<StoredCondition[]> {
    const rows = await this.db.selectFrom("plan_conditions").selectAll().orderBy("unit").execute();
    return rows.map((row) => ({
      unit: row.unit,
      wanted: row.wanted === "every" ? "every" : Number(row.wanted),
      placed: Number(row.placed),
      reason: row.reason,
      epoch: Number(row.epoch),
      since: row.since,
    }));
  }

  /** Records that `revision` has been composed and sent under `epoch`; refused (`fenced`) below the floor. */
  async markSent(revision: number, epoch: number, at: string): Promise<void> {
    const result = await this.db
      .insertInto("plan_sent")
      .columns(["name", "revision", "epoch", "sent_at"])
      .expression(
        this.db
          .selectNoFrom([
            sql<string>`cast('plan' as text)`.as("name"),
            sql<number>`cast(${revision} as integer)`.as("revision"),
            sql<number>`cast(${epoch} as integer)`.as("epoch"),
            sql<string>`cast(${at} as text)`.as("sent_at"),
          ])
          .where(sql<number>`cast(${epoch} as integer)`, ">=", floorQuery(this.db)),
      )
      .onConflict((oc) =>
        oc.column("name").doUpdateSet((eb) => ({
          revision: eb.ref("excluded.revision"),
          epoch: eb.ref("excluded.epoch"),
          sent_at: eb.ref("excluded.sent_at"),
        })),
      )
      .executeTakeFirst();
    if (Number(result.numInsertedOrUpdatedRows ?? 0) === 1) return;
    throw belowFloor(`revision ${revision} was not marked sent`, epoch, await floorOf(this.db));
  }

  /** The revision last composed and sent, or undefined when none ever was. */
  async sent(): Promise<PlanSent | undefined> {
    const row = await this.db
      .selectFrom("plan_sent")
      .selectAll()
      .where("name", "=", "plan")
      .executeTakeFirst();
    return row === undefined
      ? undefined
      : { revision: Number(row.revision), epoch: Number(row.epoch), sentAt: row.sent_at };
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

/** The epoch floor: the highest epoch any controller has taken. */
function floorQuery(db: Pick<Kysely<Database>, "selectFrom">) {
  return db.selectFrom("controller_epoch").select(sql<number>`coalesce(max(epoch), 0)`.as("floor"));
}

async function floorOf(db: Kysely<Database>): Promise<number> {
  return Number((await floorQuery(db).executeTakeFirst())?.floor ?? 0);
}

function belowFloor(what: string, epoch: number, floor: number): MeshError {
  return new MeshError(
    "fenced",
    `${what}: epoch ${epoch} is below the floor ${floor} (another controller took the lease)`,
  );
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
