/**
 * The acting control plane's periodic work (flushing `last_seen`, the retention, the liveness watch). A run that
 * fails is logged as `<what>.failed` and the work runs again at the next period: each is the same work over the
 * store's current state, so a store away for a moment costs one period, never the control plane.
 */
import type { Logger } from "../log.js";
import { errorText } from "../log.js";

export class Periodic {
  private readonly timers: NodeJS.Timeout[] = [];
  private stopped = false;

  /** `paused` says when runs are skipped: while the store is known to be down, that is said once, elsewhere. */
  constructor(
    private readonly log: Logger,
    private readonly paused: () => boolean = () => false,
  ) {}

  /** Runs `work` every `everyMs` from now until stopped. */
  every(what: string, everyMs: number, work: () => Promise<void>): void {
    if (this.stopped) return;
    this.timers.push(
      setInterval(() => {
        if (this.paused()) return;
        work().catch((error: unknown) => this.log.error(`${what}.failed`, { error: errorText(error) }));
      }, everyMs),
    );
  }

  /** No run starts after this (one under way finishes by itself). */
  stop(): void {
    this.stopped = true;
    for (const timer of this.timers) clearInterval(timer);
    this.timers.length = 0;
  }
}
