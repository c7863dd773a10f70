/**
 * What `mesh up` keeps running: its nats-server and a control plane, each restarted when it ends, with backoff. The
 * broker outlives the control plane: a lost lease, a closed gate or a failure ends only the control plane, and a
 * fresh one contends for the lease again while the nodes keep their broker. A broker that dies is started again on
 * the same port and data.
 */
import type { Logger } from "../log.js";
import { errorText } from "../log.js";

/** Restart delays: doubling from the first to the most, back to the first after a run this long. */
export interface Backoff {
  firstMs: number;
  mostMs: number;
  stableAfterMs: number;
}

export const defaultBackoff: Backoff = { firstMs: 1000, mostMs: 30_000, stableAfterMs: 60_000 };

/** The next delay after a run of `ranMs` that followed a delay of `previousMs` (undefined: none yet). */
export function nextDelay(backoff: Backoff, previousMs: number | undefined, ranMs: number): number {
  if (previousMs === undefined || ranMs >= backoff.stableAfterMs) return backoff.firstMs;
  return Math.min(backoff.mostMs, previousMs * 2);
}

export interface Supervised {
  /** Settles when the thing ends by itself: the reason (a rejection is a failure). */
  ended: Promise<string>;
  /** Ends it; resolves when it has ended. */
  stop(): Promise<void>;
}

export interface SuperviseSettings {
  /** What is supervised, in the log: `broker`, `control`. */
  name: string;
  start: () => Promise<Supervised>;
  log: Logger;
  backoff?: Backoff;
  /** How long a stop may take before it is left to finish by itself (a paused broker may never answer). */
  stopWithinMs?: number;
  /** What runs already, started by the caller (whose first start's failure is the caller's to report). */
  initial?: Supervised;
}

/**
 * Runs `start()` and again each time what it started ends by itself, until `stop()`. A start that fails is tried
 * again with the same backoff.
 */
export class Supervisor {
  private stopping = false;
  private current: Supervised | undefined;
  private wake: () => void = () => undefined;
  readonly running: Promise<void>;
  /** How many times it was started again after an end. */
  restarts = 0;

  constructor(private readonly settings: SuperviseSettings) {
    this.running = this.loop();
  }

  /** Stops what runs and starts nothing more; a start still under way is waited for no longer than a stop. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.wake();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<void>((resolve) => (timer = setTimeout(resolve, this.stopWithinMs * 2)));
    await Promise.race([this.running, late]);
    clearTimeout(timer);
  }

  private get stopWithinMs(): number {
    return this.settings.stopWithinMs ?? 10_000;
  }

  private async loop(): Promise<void> {
    const { name, start, log } = this.settings;
    const backoff = this.settings.backoff ?? defaultBackoff;
    let delay: number | undefined;
    let first = true;
    while (!this.stopping) {
      if (!first) {
        this.restarts += 1;
        log.warn(`${name}.restarting`, { in_ms: delay ?? 0 });
        await this.sleep(delay ?? 0);
        if (this.stopping) return;
      }
      const given = first ? this.settings.initial : undefined;
      first = false;
      const startedAt = Date.now();
      let reason: string;
      try {
        this.current = given ?? (await start());
        if (this.stopping) {
          await this.stopCurrent();
          return;
        }
        const wokenByStop = new Promise<string>((resolve) => (this.wake = () => resolve("stopping")));
        reason = await Promise.race([
          this.current.ended.then(
            (why) => why,
            (error: unknown) => `failed: ${errorText(error)}`,
          ),
          wokenByStop,
        ]);
      } catch (error) {
        reason = `could not start: ${errorText(error)}`;
      }
      if (!this.stopping) log.error(`${name}.ended`, { reason });
      await this.stopCurrent();
      if (this.stopping) return;
      delay = nextDelay(backoff, delay, Date.now() - startedAt);
    }
  }

  private async stopCurrent(): Promise<void> {
    const current = this.current;
    this.current = undefined;
    if (current === undefined) return;
    const within = this.settings.stopWithinMs ?? 10_000;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), within)));
    const stopped = current.stop().then(
      () => "stopped" as const,
      (error: unknown) => {
        this.settings.log.warn(`${this.settings.name}.stop_failed`, { error: errorText(error) });
        return "stopped" as const;
      },
    );
    const outcome = await Promise.race([stopped, late]);
    clearTimeout(timer);
    if (outcome === "late") {
      this.settings.log.warn(`${this.settings.name}.stop_slow`, {
        within_ms: within,
        note: "left to finish by itself; it no longer acts",
      });
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }
}
