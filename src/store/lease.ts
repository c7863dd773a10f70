/**
 * The lease in the SQL store, for deployments without NATS: one row, taken and renewed by compare-and-set on its
 * revision, which only ever rises. Expiry is judged by the controllers' clocks, which must agree to well within
 * the lease's margin (NTP does).
 */
import type { Kysely } from "kysely";
import type { HolderInfo, LeaseBackend, LeaseRecord, LeaseWake } from "../lease/lease.js";
import { parseHolderRecord } from "../link/index.js";
import type { Database } from "./schema.js";

const row = "holder";

export class SqlLease implements LeaseBackend {
  readonly where = "the store's controller_lease";

  constructor(
    private readonly db: Kysely<Database>,
    private readonly ttlMs: number,
    private readonly now: () => Date = () => new Date(),
  ) {}

  private async ensureRow(): Promise<void> {
    await this.db
      .insertInto("controller_lease")
      .values({ name: row, holder: null, revision: 0, expires_at: null })
      .onConflict((oc) => oc.column("name").doNothing())
      .execute();
  }

  /** What a take or a renewal writes besides the revision. */
  private holding(holder: HolderInfo, now: Date): { holder: string; expires_at: string } {
    return { holder: JSON.stringify(holder), expires_at: new Date(now.getTime() + this.ttlMs).toISOString() };
  }

  async take(holder: HolderInfo): Promise<number | undefined> {
    await this.ensureRow();
    const now = this.now();
    const taken = await this.db
      .updateTable("controller_lease")
      .set((eb) => ({ ...this.holding(holder, now), revision: eb("revision", "+", 1) }))
      .where("name", "=", row)
      .where((eb) => eb.or([eb("holder", "is", null), eb("expires_at", "<=", now.toISOString())]))
      .returning("revision")
      .executeTakeFirst();
    return taken?.revision;
  }

  async renew(holder: HolderInfo, revision: number): Promise<number | undefined> {
    const now = this.now();
    const renewed = await this.db
      .updateTable("controller_lease")
      .set((eb) => ({ ...this.holding(holder, now), revision: eb("revision", "+", 1) }))
      .where("name", "=", row)
      .where("revision", "=", revision)
      .where("expires_at", ">", now.toISOString())
      .returning("revision")
      .executeTakeFirst();
    return renewed?.revision;
  }

  async release(revision: number): Promise<boolean> {
    const released = await this.db
      .updateTable("controller_lease")
      .set((eb) => ({ holder: null, expires_at: null, revision: eb("revision", "+", 1) }))
      .where("name", "=", row)
      .where("revision", "=", revision)
      .executeTakeFirst();
    return released.numUpdatedRows === 1n;
  }

  async read(): Promise<LeaseRecord | undefined> {
    const current = await this.db
      .selectFrom("controller_lease")
      .selectAll()
      .where("name", "=", row)
      .where("holder", "is not", null)
      .where("expires_at", ">", this.now().toISOString())
      .executeTakeFirst();
    if (current?.holder == null) return undefined;
    return {
      holder: parseHolderRecord(current.holder, this.where),
      revision: current.revision,
      ...(current.expires_at === null ? {} : { expiresAt: Date.parse(current.expires_at) }),
    };
  }

  async raiseAbove(floor: number): Promise<boolean> {
    await this.ensureRow();
    const raised = await this.db
      .updateTable("controller_lease")
      .set({ revision: floor })
      .where("name", "=", row)
      .where("revision", "<", floor)
      .executeTakeFirst();
    return raised.numUpdatedRows === 1n;
  }

  async close(): Promise<void> {
    await Promise.resolve();
  }

  /** A row announces nothing: a standby reads it again after `withinMs`. */
  async changed(withinMs: number): Promise<LeaseWake> {
    return new Promise((resolve) => setTimeout(() => resolve({ by: "time" }), withinMs));
  }
}
