/**
 * The lease: which of several controllers acts. One record, taken by create and renewed by compare-and-set; the
 * revision at which it was taken is the epoch, a fencing token carried by everything the holder writes. The gate is
 * the clock: a holder acts only until its last successful renewal + TTL − margin, whatever else it believes.
 */

/** Who holds the lease, as stored in it. */
export interface HolderInfo {
  id: string;
  host: string;
  pid: number;
  taken_at: string;
  /** The epoch, written with the first renewal (the take itself cannot know its revision). */
  epoch?: number;
  /** When the holder last renewed, as the holder saw it. */
  renewed_at?: string;
  /**
   * The life the holder works to, written with every take and renewal. A store that ages entries out by a life of
   * its own (a NATS bucket, whose max_age the next controller may have raised) judges this holder by this one.
   */
  ttl_ms?: number;
}

/** The epoch of the current holding: the one the holder wrote, or the revision of the take itself. */
export function epochOf(record: LeaseRecord): number {
  return record.holder.epoch ?? record.revision;
}

export interface LeaseRecord {
  holder: HolderInfo;
  revision: number;
  /**
   * When this holding ends unless it is renewed, by the wall clock (ms since 1970): the store's time of the last
   * take or renewal + the holder's life. A standby waits for it; the store still judges whether a take may happen.
   */
  expiresAt?: number;
}

/**
 * Where a lease is kept as a row when the broker keeps none (RabbitMQ has no compare-and-set store): the mesh's
 * store. Stated here so the bus can ask for it without knowing the store.
 */
export interface LeaseStore {
  lease(ttlMs: number): LeaseBackend;
}

/** The stores a lease can live in (a NATS key-value bucket, a SQL row), in the lease's words. */
export interface LeaseBackend {
  /** A name for logs: where the lease lives. */
  readonly where: string;
  /** Takes the lease when nobody holds it: the revision written, or undefined when it is held. */
  take(holder: HolderInfo): Promise<number | undefined>;
  /** Renews by compare-and-set on `revision`: the new revision, or undefined when the lease is no longer ours. */
  renew(holder: HolderInfo, revision: number): Promise<number | undefined>;
  /** Gives the lease back if `revision` is still the current one. Returns whether it was ours to give. */
  release(revision: number): Promise<boolean>;
  /** The current holder, read from the authoritative copy, or undefined when nobody holds the lease. */
  read(): Promise<LeaseRecord | undefined>;
  /**
   * Makes sure the next revision is above `floor` (revisions restart when a bucket is recreated). Returns true when
   * it had to move the revisions, so the caller can say so.
   */
  raiseAbove(floor: number): Promise<boolean>;
  /**
   * Resolves when the record may have changed (a holder gave the lease back, took it or renewed it), and at the
   * latest after `withinMs`: expiry by age is not announced by every store, so a standby sets its own time. Says
   * which it was, or that the watch it relies on had failed.
   */
  changed(withinMs: number): Promise<LeaseWake>;
  close(): Promise<void>;
}

/** What ended a standby's wait on the lease's store. */
export type LeaseWake =
  /** The record changed, or may have: look again now. */
  | { by: "change" }
  /** The time asked for passed with nothing announced. */
  | { by: "time" }
  /** The watch had ended (the note says why, for the log); a new one is opened at the next wait. */
  | { by: "watch_failed"; note: string };

/** Every duration of the lease, in milliseconds. Production: renew every 5 s, TTL 15 s, stop acting 3 s early. */
export interface LeaseTimings {
  renewEveryMs: number;
  ttlMs: number;
  marginMs: number;
}

export const defaultLeaseTimings: LeaseTimings = { renewEveryMs: 5000, ttlMs: 15_000, marginMs: 3000 };

/** Whether a holder whose last successful renewal began at `renewedAt` may still act at `now` (both monotonic). */
export function gateOpen(renewedAt: number, now: number, timings: LeaseTimings): boolean {
  return now < renewedAt + timings.ttlMs - timings.marginMs;
}

/**
 * How long after a holding's end a standby looks: a timer may fire a millisecond early by the wall clock, and a take
 * tried before the end is only refused (and tried again), so a moment later is sooner on the whole.
 */
export const lookAfterExpiryMs = 2;

/** What a standby waits for before it tries the lease again, and for how long. */
export interface StandbyWait {
  ms: number;
  until: "expiry" | "period";
}

/**
 * How long a standby waits before it tries the lease again: until the current holding ends (`expiresAt`, by the
 * wall clock like `now`) when that comes within a renewal period, else one renewal period. A live holder renews
 * within the period, which wakes a watching standby to wait again from the new end; a store that announces
 * nothing (a SQL row) is looked at that often, so a lease given back there is taken within a period.
 */
export function standbyWait(expiresAt: number | undefined, now: number, renewEveryMs: number): StandbyWait {
  if (expiresAt === undefined) return { ms: renewEveryMs, until: "period" };
  const untilExpiry = Math.max(0, expiresAt - now) + lookAfterExpiryMs;
  return untilExpiry <= renewEveryMs
    ? { ms: untilExpiry, until: "expiry" }
    : { ms: renewEveryMs, until: "period" };
}
