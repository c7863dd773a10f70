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
   * Resolves when the record may have changed (a holder gave the lease back or took it), and at the latest after
   * `withinMs`: expiry by age is not announced by every store, so a standby looks again at least that often.
   * Resolves with a note for the log when the watch it relies on had failed.
   */
  changed(withinMs: number): Promise<string | undefined>;
  close(): Promise<void>;
}

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
