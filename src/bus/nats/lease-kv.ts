/**
 * The lease in a NATS key-value bucket: key `holder`, taken by create, renewed by update on the last revision,
 * aged out by the bucket's TTL. A revision is the bucket stream's sequence, so it keeps rising — except when the
 * bucket is deleted and made again, which is why the lease keeps an epoch floor.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import type { JetStreamManagerOptions } from "@nats-io/jetstream";
import { jetstream, JetStreamApiError, jetstreamManager } from "@nats-io/jetstream";
import type { KV, KvEntry, KvWatchEntry } from "@nats-io/kv";
import { Kvm, KvWatchInclude } from "@nats-io/kv";
import type { QueuedIterator } from "@nats-io/transport-node";
import type { HolderInfo, LeaseBackend, LeaseRecord, LeaseWake } from "../../lease/lease.js";
import { parseHolderRecord } from "../../link/index.js";
import { BusError } from "../errors.js";
import { askJetStream } from "./connect.js";

export const leaseBucket = "mesh-controller_lease";
const key = "holder";
/** "Wrong last sequence": a create of a key that exists, or an update or delete on a stale revision. */
const wrongLastSequence = 10071;

/**
 * Whether an entry has outlived the life its holder wrote into it. The bucket ages entries out by its own max_age,
 * which a controller on longer timings raises for every entry, left ones included. Judged by this machine's clock
 * against the broker's time of writing, as the SQL lease judges by the controllers' clocks: they must agree to
 * well within the lease's margin, the time a holder stops acting before its life ends.
 */
function outlived(entry: KvEntry, holder: HolderInfo): boolean {
  const life = holder.ttl_ms;
  return life !== undefined && entry.created.getTime() + life <= Date.now();
}

export class NatsKvLease implements LeaseBackend {
  /** Watches the key for standbys, opened on first use. */
  private watcher: QueuedIterator<KvWatchEntry> | undefined;
  private readonly waiting = new Set<() => void>();
  /** Why the last watcher failed, told to the next waiter (which then opens a new one). */
  private watchFailure: string | undefined;

  private constructor(
    private readonly nc: NatsConnection,
    private kv: KV,
    private readonly bucket: string,
    private readonly ttlMs: number,
    private readonly timeoutMs: number | undefined,
  ) {}

  get where(): string {
    return `NATS bucket ${this.bucket}`;
  }

  /**
   * `timeoutMs`: how long each operation on the bucket waits for the broker (the client's default, 5 s, when not
   * given); a one-shot command gives its deadline.
   */
  static async open(
    nc: NatsConnection,
    ttlMs: number,
    bucket = leaseBucket,
    timeoutMs?: number,
  ): Promise<NatsKvLease> {
    const kv = await askJetStream(nc, timeoutMs, () => NatsKvLease.bucket(nc, bucket, ttlMs, timeoutMs));
    return new NatsKvLease(nc, kv, bucket, ttlMs, timeoutMs);
  }

  private static async bucket(
    nc: NatsConnection,
    bucket: string,
    ttlMs: number,
    timeoutMs: number | undefined,
  ): Promise<KV> {
    const within: JetStreamManagerOptions = timeoutMs === undefined ? {} : { timeout: timeoutMs };
    // No direct gets: in a cluster a follower could answer with an older holder.
    const kv = await new Kvm(jetstream(nc, within)).create(bucket, {
      ttl: ttlMs,
      history: 1,
      allow_direct: false,
    });
    // An existing bucket keeps the TTL it was made with: brought to this one, or a holder renewing on the new
    // timings would see its entry age out under it (and a standby would not be told).
    const stream = `KV_${bucket}`;
    const jsm = await jetstreamManager(nc, within);
    const { config } = await jsm.streams.info(stream);
    if (config.max_age !== ttlMs * 1_000_000) {
      await jsm.streams.update(stream, { ...config, max_age: ttlMs * 1_000_000 });
    }
    return kv;
  }

  async take(holder: HolderInfo): Promise<number | undefined> {
    const outcome = await this.unlessStale(() => this.kv.create(key, JSON.stringify(holder)));
    if (outcome.written) return outcome.revision;
    // Held — or left by a holder that stopped renewing, on a shorter life than the bucket keeps entries now.
    const entry = await askJetStream(this.nc, this.timeoutMs, () => this.kv.get(key));
    if (entry === null || entry.operation !== "PUT" || !outlived(entry, this.holderOf(entry)))
      return undefined;
    // Cleared only if nothing was written since it was read, then taken as if given back.
    const cleared = await this.unlessStale(async () => {
      await this.kv.delete(key, { previousSeq: entry.revision });
      return entry.revision;
    });
    if (!cleared.written) return undefined;
    const retaken = await this.unlessStale(() => this.kv.create(key, JSON.stringify(holder)));
    return retaken.written ? retaken.revision : undefined;
  }

  async renew(holder: HolderInfo, revision: number): Promise<number | undefined> {
    const outcome = await this.unlessStale(() => this.kv.update(key, JSON.stringify(holder), revision));
    return outcome.written ? outcome.revision : undefined;
  }

  async release(revision: number): Promise<boolean> {
    const outcome = await this.unlessStale(async () => {
      await this.kv.delete(key, { previousSeq: revision });
      return revision;
    });
    return outcome.written;
  }

  async read(): Promise<LeaseRecord | undefined> {
    const entry = await askJetStream(this.nc, this.timeoutMs, () => this.kv.get(key));
    if (entry === null || entry.operation !== "PUT") return undefined;
    const holder = this.holderOf(entry);
    if (outlived(entry, holder)) return undefined;
    // A holder that wrote no life of its own ages out with the bucket's, which is ours.
    const expiresAt = entry.created.getTime() + (holder.ttl_ms ?? this.ttlMs);
    return { holder, revision: entry.revision, expiresAt };
  }

  /** The holder an entry names, checked: a damaged record is an error naming the bucket, not a holder. */
  private holderOf(entry: KvEntry): HolderInfo {
    return parseHolderRecord(entry.string(), this.where);
  }

  async raiseAbove(floor: number): Promise<boolean> {
    return askJetStream(this.nc, this.timeoutMs, () => this.raiseAboveOnce(floor));
  }

  private async raiseAboveOnce(floor: number): Promise<boolean> {
    const jsm = await jetstreamManager(
      this.nc,
      this.timeoutMs === undefined ? {} : { timeout: this.timeoutMs },
    );
    const stream = `KV_${this.bucket}`;
    const info = await jsm.streams.info(stream);
    // The next revision is last_seq + 1: at last_seq == floor it is already above the floor, and the key is a
    // live holder's (a take at the floor, not yet renewed), which must never be purged away.
    if (info.state.last_seq >= floor) return false;
    // Purging up to floor + 1 makes the stream's next sequence, and so the next revision, floor + 1.
    await jsm.streams.purge(stream, { seq: floor + 1 });
    this.kv = await NatsKvLease.bucket(this.nc, this.bucket, this.ttlMs, this.timeoutMs);
    return true;
  }

  async changed(withinMs: number): Promise<LeaseWake> {
    const failure = this.watchFailure;
    this.watchFailure = undefined;
    if (failure !== undefined)
      return { by: "watch_failed", note: `the watch on the lease ended (${failure}); watching again` };
    if (this.watcher === undefined) this.watcher = await this.watch();
    return new Promise<LeaseWake>((resolve) => {
      const wake = (by: "change" | "time") => {
        clearTimeout(timer);
        this.waiting.delete(changed);
        resolve({ by });
      };
      const changed = () => wake("change");
      const timer = setTimeout(() => wake("time"), withinMs);
      this.waiting.add(changed);
    });
  }

  /** Every put or delete of the key wakes whoever waits; the bucket's TTL expiry is not announced on 2.9. */
  private async watch(): Promise<QueuedIterator<KvWatchEntry>> {
    const watcher = await this.kv.watch({ key, include: KvWatchInclude.UpdatesOnly });
    const wakeAll = () => {
      for (const wake of [...this.waiting]) wake();
    };
    void (async () => {
      try {
        for await (const entry of watcher) {
          if (entry.key === key) wakeAll();
        }
      } catch (error) {
        // The bucket went away or the connection closed: whoever waits looks again now, with a new watcher.
        this.watchFailure = (error as Error).message;
      } finally {
        if (this.watcher === watcher) this.watcher = undefined;
        wakeAll();
      }
    })();
    return watcher;
  }

  async close(): Promise<void> {
    const watcher = this.watcher;
    this.watcher = undefined;
    watcher?.stop();
    await Promise.resolve();
  }

  /** Runs a compare-and-set write; a stale revision is an answer (someone else holds the lease), not a failure. */
  private async unlessStale(
    write: () => Promise<number>,
  ): Promise<{ written: true; revision: number } | { written: false }> {
    try {
      return { written: true, revision: await askJetStream(this.nc, this.timeoutMs, write) };
    } catch (error) {
      if (error instanceof JetStreamApiError && error.code === wrongLastSequence) return { written: false };
      if (error instanceof BusError) throw error;
      throw new BusError(
        "lease",
        `the lease in ${this.where} could not be written: ${(error as Error).message}`,
        {
          cause: error,
        },
      );
    }
  }
}
