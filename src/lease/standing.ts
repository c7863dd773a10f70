/**
 * Where a controller stands: a standby waiting for the lease, the holder acting under its epoch, or — when nobody
 * holds the lease and it cannot be written at all — acting WITHOUT an epoch, urgently and never silently, trying the
 * lease again every renewal period. The gate answers whether work may act now; `ended` says why acting is over.
 */
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { EpochRecord } from "./holder.js";
import { LeaseHolder } from "./holder.js";
import type { HolderInfo, LeaseBackend, LeaseRecord, LeaseTimings, LeaseWake } from "./lease.js";
import { standbyWait } from "./lease.js";

/** Where controllers acting without an epoch are kept, so every command can see it (the store's no-epoch table). */
export interface NoEpochRecord {
  raise(condition: {
    controller: string;
    host: string;
    pid: number;
    reason: string;
    since: string;
    seen_at: string;
  }): Promise<void>;
  clear(controller: string): Promise<void>;
}

export interface StandingOptions {
  backend: LeaseBackend;
  epochs: EpochRecord;
  noEpoch: NoEpochRecord;
  timings: LeaseTimings;
  holder: HolderInfo;
  log: Logger;
  /** How often the urgent no-epoch condition is logged again while it lasts. */
  noEpochLogEveryMs: number;
  /** The wall clock (the no-epoch row's times); default: now. */
  now?: () => Date;
  /** A monotonic clock for the lease's gate (tests may drive it). */
  clock?: () => number;
}

export type Obtained = "holder" | "no_epoch" | "stopping";

const urgentNote =
  "nobody holds the lease and it cannot be written: acting WITHOUT an epoch. Nothing fences this controller " +
  "from another and no declaration can be signed until the lease store takes writes again";

export class Standing {
  readonly holder: LeaseHolder;
  private stopping = false;
  /** Set while acting without any epoch: since when, why, and when it was last logged. */
  private noEpoch: { since: string; reason: string; loggedAt: number } | undefined;
  private retrying = false;
  private retryTimer: NodeJS.Timeout | undefined;
  private gateTimer: NodeJS.Timeout | undefined;
  private closeGate: (reason: string) => void = () => undefined;
  private readonly gateClosed = new Promise<string>((resolve) => (this.closeGate = resolve));
  private readonly now: () => Date;

  constructor(private readonly options: StandingOptions) {
    this.now = options.now ?? (() => new Date());
    this.holder = new LeaseHolder({
      backend: options.backend,
      epochs: options.epochs,
      timings: options.timings,
      holder: options.holder,
      log: options.log,
      ...(options.clock === undefined ? {} : { clock: options.clock }),
    });
  }

  /** The epoch acted under, if any. */
  get epoch(): number | undefined {
    return this.holder.epoch;
  }

  /** Whether this controller acts without any epoch now. */
  get withoutEpoch(): boolean {
    return this.noEpoch !== undefined;
  }

  /**
   * Whether work may act now. A closed gate means the lease may be someone else's by now: it ends acting (`ended`).
   */
  gate(): boolean {
    if (this.stopping) return false;
    if (this.noEpoch !== undefined || this.holder.canAct()) return true;
    this.closeGate("the lease's gate closed: no renewal within its lifetime");
    return false;
  }

  /** Settles with the reason acting is over: the lease lost, the gate closed, or another took it meanwhile. */
  get ended(): Promise<string> {
    return Promise.race([this.holder.lost.then((reason) => `lease lost: ${reason}`), this.gateClosed]);
  }

  /** Waits as a standby until the lease is ours, or until it is clear that nobody can hold it at all. */
  async obtain(): Promise<Obtained> {
    const { backend, log, timings } = this.options;
    let announced = false;
    // The holding last seen while standing by, and what ended the last wait: said when the lease is taken over.
    let seen: LeaseRecord | undefined;
    let woken: StandbyWoken | undefined;
    let lookedAgainAtOnce = false;
    for (;;) {
      if (this.stopping) return "stopping";
      let taken: boolean;
      try {
        taken = await this.holder.tryTake();
      } catch (error) {
        const reason = errorText(error);
        const current = await backend.read().then(
          (record) => record ?? null,
          (readError: unknown) => {
            log.warn("lease.unreadable", { error: errorText(readError) });
            return "unknown" as const;
          },
        );
        if (current === null) {
          await this.raiseNoEpoch(reason);
          this.startRetrying();
          return "no_epoch";
        }
        // Someone may hold it: without knowing, acting would risk two controllers. Wait and try again.
        log.warn("lease.unwritable", {
          reason,
          holder: current === "unknown" ? "unknown" : current.holder,
          note: "standing by",
        });
        await new Promise((resolve) => setTimeout(resolve, timings.renewEveryMs));
        continue;
      }
      if (taken) {
        if (woken !== undefined) log.info("lease.taken_over", takenOver(seen, woken));
        this.watchGate();
        return "holder";
      }
      const current = await backend.read().catch((error: unknown) => {
        log.warn("lease.unreadable", { error: errorText(error), note: "looking again in a renewal period" });
        return "unknown" as const;
      });
      if (!announced) {
        log.info("lease.standby", { holder: current === "unknown" ? "unknown" : (current?.holder ?? null) });
        announced = true;
      }
      // Refused, yet nobody holds it now: given back or aged out since the take was refused. Tried again at once,
      // but not twice in a row, so a store whose answers disagree is not asked in a loop.
      if (current === undefined && !lookedAgainAtOnce) {
        lookedAgainAtOnce = true;
        continue;
      }
      lookedAgainAtOnce = false;
      if (current !== undefined && current !== "unknown") seen = current;
      // Until the holding ends, or one renewal period; woken at once when the holder gives the lease back (or
      // renews it: then the wait starts again from the new end).
      const wait = standbyWait(
        current === "unknown" ? undefined : current?.expiresAt,
        this.now().getTime(),
        timings.renewEveryMs,
      );
      const wake = await backend.changed(wait.ms).catch(async (error: unknown): Promise<LeaseWake> => {
        await new Promise((resolve) => setTimeout(resolve, timings.renewEveryMs));
        return { by: "watch_failed", note: `the lease could not be watched: ${errorText(error)}` };
      });
      if (wake.by === "watch_failed") log.warn("lease.watch_failed", { note: wake.note });
      woken = wake.by === "time" ? wait.until : wake.by;
    }
  }

  /** Stops acting at once: the gate is shut from here, and no retry of the lease starts. */
  stopActing(): void {
    this.stopping = true;
    clearInterval(this.retryTimer);
    clearInterval(this.gateTimer);
  }

  /**
   * The gate is looked at every renewal period even when no work asks: a holder cut off from the lease's store
   * (a paused broker) ends its acting when the gate closes, not when the store answers again.
   */
  private watchGate(): void {
    this.gateTimer = setInterval(() => {
      if (!this.gate()) clearInterval(this.gateTimer);
    }, this.options.timings.renewEveryMs);
  }

  /** Gives the lease back if it is ours (a standby may take over at once) and stops watching it. */
  async giveBack(): Promise<void> {
    this.stopActing();
    await this.holder
      .release()
      .catch((error: unknown) => this.options.log.warn("lease.not_released", { error: errorText(error) }));
    await this.options.backend.close();
  }

  /** Clears this controller's no-epoch row, if it had one (at the very end: the store is still open). */
  async clearNoEpoch(): Promise<void> {
    if (this.noEpoch !== undefined) await this.options.noEpoch.clear(this.options.holder.id);
  }

  /** While without an epoch, the lease is tried again every renewal period. */
  private startRetrying(): void {
    if (this.stopping) return;
    const { log, timings } = this.options;
    this.retryTimer = setInterval(() => {
      this.retryLease().catch((error: unknown) =>
        log.error("lease.retry_failed", { error: errorText(error) }),
      );
    }, timings.renewEveryMs);
  }

  /** Exposed for tests: one retry of the lease while without an epoch. */
  async retryLease(): Promise<void> {
    if (this.noEpoch === undefined || this.retrying || this.stopping) return;
    this.retrying = true;
    try {
      const attempt = await this.holder.tryTake().then(
        (taken) => ({ taken }),
        (error: unknown) => ({ failure: errorText(error) }),
      );
      if ("failure" in attempt) {
        await this.raiseNoEpoch(attempt.failure);
        return;
      }
      if (!attempt.taken) {
        this.closeGate("another controller took the lease while this one acted without an epoch");
        return;
      }
      this.options.log.warn("lease.epoch_restored", {
        epoch: this.holder.epoch,
        without_epoch_since: this.noEpoch.since,
      });
      this.noEpoch = undefined;
      clearInterval(this.retryTimer);
      this.watchGate();
      await this.options.noEpoch.clear(this.options.holder.id);
    } finally {
      this.retrying = false;
    }
  }

  private async raiseNoEpoch(reason: string): Promise<void> {
    const { log, holder, noEpochLogEveryMs } = this.options;
    const at = this.now().toISOString();
    if (this.noEpoch === undefined) {
      this.noEpoch = { since: at, reason, loggedAt: Date.now() };
      log.error("lease.no_epoch", { urgent: true, reason, note: urgentNote });
    } else if (Date.now() - this.noEpoch.loggedAt >= noEpochLogEveryMs) {
      this.noEpoch.loggedAt = Date.now();
      log.error("lease.no_epoch", { urgent: true, reason, since: this.noEpoch.since, note: urgentNote });
    }
    await this.options.noEpoch.raise({
      controller: holder.id,
      host: holder.host,
      pid: holder.pid,
      reason,
      since: this.noEpoch.since,
      seen_at: at,
    });
  }
}

/** What ended a standby's last wait: the holding's end, a renewal period, a change the store announced, or none. */
type StandbyWoken = "expiry" | "period" | "change" | "watch_failed";

/** What a standby says when it took the lease over: why it looked, and when the holding it waited on ended. */
function takenOver(seen: LeaseRecord | undefined, woken: StandbyWoken): Record<string, unknown> {
  return {
    woken_by: woken,
    previous_holder: seen?.holder.id ?? null,
    previous_expiry: seen?.expiresAt === undefined ? null : new Date(seen.expiresAt).toISOString(),
  };
}
