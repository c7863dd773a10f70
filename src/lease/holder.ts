/**
 * Holding the lease: take it (above the epoch floor), renew it on a timer, and answer `canAct()` by the clock
 * alone. A refused renewal is a loss, reported once through `lost`; the process that holds the lease then stops.
 */
import { performance } from "node:perf_hooks";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { HolderInfo, LeaseBackend, LeaseTimings } from "./lease.js";
import { gateOpen } from "./lease.js";

/** Where every epoch ever taken is kept (the store's controller_epoch). */
export interface EpochRecord {
  floor(): Promise<number>;
  record(epoch: number, holder: string, takenAt: string): Promise<void>;
}

export interface LeaseHolderOptions {
  backend: LeaseBackend;
  epochs: EpochRecord;
  timings: LeaseTimings;
  holder: HolderInfo;
  log: Logger;
  /** A monotonic clock in milliseconds (tests may drive it). */
  clock?: () => number;
}

export class LeaseHolder {
  /** The epoch this holder took the lease at, once it has. */
  epoch: number | undefined;
  private revision = 0;
  private renewedAt = Number.NEGATIVE_INFINITY;
  /** Renewals that failed in a row, said once when the run starts and once when it ends. */
  private failedRenewals = 0;
  private timer: NodeJS.Timeout | undefined;
  /** The renewal in flight, if any: one at a time, and a release waits for it. */
  private renewing: Promise<void> | undefined;
  /** Set once a release has begun: no renewal starts after it. */
  private releasing = false;
  private readonly clock: () => number;
  private signalLoss: (reason: string) => void = () => undefined;
  /** Settles with the reason when the lease is lost (a refused renewal). */
  readonly lost: Promise<string>;

  constructor(private readonly options: LeaseHolderOptions) {
    this.clock = options.clock ?? (() => performance.now());
    this.lost = new Promise((resolve) => (this.signalLoss = resolve));
  }

  /** Takes the lease if nobody holds it. Returns whether it did; renewals start at once. */
  async tryTake(): Promise<boolean> {
    const { backend, epochs, log } = this.options;
    const floor = await epochs.floor();
    // With no epoch ever taken there is no floor to keep above.
    if (floor > 0 && (await backend.raiseAbove(floor))) {
      log.warn("lease.revisions_raised", {
        where: backend.where,
        floor,
        note: "the lease store was reset; epochs continue above the floor",
      });
    }
    const startedAt = this.clock();
    const revision = await backend.take({ ...this.options.holder, ttl_ms: this.options.timings.ttlMs });
    if (revision === undefined) return false;
    this.epoch = revision;
    this.revision = revision;
    this.renewedAt = startedAt;
    await epochs.record(revision, this.options.holder.id, new Date().toISOString());
    log.info("lease.taken", { epoch: revision, where: backend.where });
    this.timer = setInterval(() => void this.renew(), this.options.timings.renewEveryMs);
    return true;
  }

  /** Whether this holder may act now: only until its last renewal + TTL − margin, whatever else it believes. */
  canAct(): boolean {
    return this.epoch !== undefined && gateOpen(this.renewedAt, this.clock(), this.options.timings);
  }

  /**
   * Renews once; exposed so a caller (and a test) can renew at a moment of its choosing. A renewal asked for while
   * one is in flight joins it: a second compare-and-set on the same revision would be refused, and read as a loss.
   */
  renew(): Promise<void> {
    if (this.releasing) return Promise.resolve();
    this.renewing ??= this.renewOnce().finally(() => (this.renewing = undefined));
    return this.renewing;
  }

  private async renewOnce(): Promise<void> {
    if (this.epoch === undefined) return;
    // The renewal counts from before it was sent: the lease's new life started no earlier than that.
    const startedAt = this.clock();
    try {
      const revision = await this.options.backend.renew(
        {
          ...this.options.holder,
          epoch: this.epoch,
          renewed_at: new Date().toISOString(),
          ttl_ms: this.options.timings.ttlMs,
        },
        this.revision,
      );
      if (revision === undefined) {
        this.stopRenewing();
        this.options.log.error("lease.lost", {
          epoch: this.epoch,
          reason: "renewal refused: another holder or expired",
        });
        this.signalLoss("renewal refused");
        return;
      }
      this.revision = revision;
      this.renewedAt = startedAt;
      if (this.failedRenewals > 0) {
        this.options.log.info("lease.renewed_again", {
          epoch: this.epoch,
          failed_renewals: this.failedRenewals,
        });
        this.failedRenewals = 0;
      }
    } catch (error) {
      // The store could not be reached: the gate closes by itself if this lasts. Said for the first failure of a
      // run; the count comes with the renewal that ends it.
      this.failedRenewals += 1;
      if (this.failedRenewals === 1)
        this.options.log.warn("lease.renewal_failed", { epoch: this.epoch, error: errorText(error) });
    }
  }

  /**
   * Stops renewing and gives the lease back if it is still ours. A renewal in flight is waited for first: its write
   * moves the revision, and a release on the revision before it would be refused and leave the lease to age out.
   */
  async release(): Promise<void> {
    this.releasing = true;
    this.stopRenewing();
    // At most a lease's life: a store that never answers the renewal must not keep the process from stopping (the
    // release is then tried on the revision known, and the lease ages out if that is refused).
    if (this.renewing !== undefined) {
      let timer: NodeJS.Timeout | undefined;
      const waited = await Promise.race([
        this.renewing.then(() => true),
        new Promise<false>(
          (resolve) => (timer = setTimeout(() => resolve(false), this.options.timings.ttlMs)),
        ),
      ]);
      clearTimeout(timer);
      if (!waited) {
        this.options.log.warn("lease.renewal_unanswered", {
          epoch: this.epoch ?? null,
          note: "giving the lease back without the renewal's answer",
        });
      }
    }
    if (this.epoch === undefined) return;
    const given = await this.options.backend.release(this.revision);
    this.options.log.info("lease.released", { epoch: this.epoch, given_back: given });
    this.epoch = undefined;
  }

  stopRenewing(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
