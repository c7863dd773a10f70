/**
 * A lease kept in memory, for unit tests of what sits on the lease (standing, commands acting under it): the same
 * contract as the real stores, with switches to make it refuse writes or reads.
 */
import type { EpochRecord } from "../../src/lease/holder.js";
import type { HolderInfo, LeaseBackend, LeaseRecord, LeaseWake } from "../../src/lease/lease.js";

export class MemoryLease implements LeaseBackend {
  readonly where = "memory";
  record: LeaseRecord | undefined;
  revision = 0;
  /** Set: every write throws this. */
  refuseWrites: string | undefined;
  /** Set: every read throws this. */
  refuseReads: string | undefined;
  private wake: (() => void)[] = [];

  take(holder: HolderInfo): Promise<number | undefined> {
    if (this.refuseWrites !== undefined) return Promise.reject(new Error(this.refuseWrites));
    if (this.held() !== undefined) return Promise.resolve(undefined);
    this.revision++;
    this.record = { holder, revision: this.revision };
    this.changedNow();
    return Promise.resolve(this.revision);
  }

  renew(holder: HolderInfo, revision: number): Promise<number | undefined> {
    if (this.refuseWrites !== undefined) return Promise.reject(new Error(this.refuseWrites));
    if (this.record?.revision !== revision) return Promise.resolve(undefined);
    this.revision++;
    this.record = { holder, revision: this.revision };
    // As a NATS bucket's watch does: a standby waiting for this holding's end waits again from the new one.
    this.changedNow();
    return Promise.resolve(this.revision);
  }

  release(revision: number): Promise<boolean> {
    if (this.record?.revision !== revision) return Promise.resolve(false);
    this.record = undefined;
    this.revision++;
    this.changedNow();
    return Promise.resolve(true);
  }

  read(): Promise<LeaseRecord | undefined> {
    if (this.refuseReads !== undefined) return Promise.reject(new Error(this.refuseReads));
    return Promise.resolve(this.held());
  }

  /** The record while its holding lasts: one with an end is nobody's from that moment (by this clock). */
  private held(): LeaseRecord | undefined {
    const end = this.record?.expiresAt;
    return end !== undefined && end <= Date.now() ? undefined : this.record;
  }

  raiseAbove(floor: number): Promise<boolean> {
    if (this.revision >= floor) return Promise.resolve(false);
    this.revision = floor;
    return Promise.resolve(true);
  }

  changed(withinMs: number): Promise<LeaseWake> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve({ by: "time" }), withinMs);
      this.wake.push(() => {
        clearTimeout(timer);
        resolve({ by: "change" });
      });
    });
  }

  /**
   * Someone else holds the lease from now (a controller elsewhere); with `expiresAt` (wall clock, ms), until then:
   * a holder that stops renewing, as a killed one does.
   */
  heldBy(id: string, expiresAt?: number): void {
    this.revision++;
    this.record = {
      holder: { id, host: "elsewhere", pid: 1, taken_at: new Date().toISOString() },
      revision: this.revision,
      ...(expiresAt === undefined ? {} : { expiresAt }),
    };
    this.changedNow();
  }

  close(): Promise<void> {
    this.changedNow();
    return Promise.resolve();
  }

  private changedNow(): void {
    const waiting = this.wake;
    this.wake = [];
    for (const wake of waiting) wake();
  }
}

/** Epochs kept in memory: the floor is the highest recorded. */
export function memoryEpochs(): EpochRecord & { recorded: number[] } {
  const recorded: number[] = [];
  return {
    recorded,
    floor: () => Promise.resolve(Math.max(0, ...recorded)),
    record: (epoch) => {
      recorded.push(epoch);
      return Promise.resolve();
    },
  };
}
