/**
 * The acting control plane keeps the fleet on the plan: it rolls the plan out once when it begins to act (sending
 * nothing to a node whose composition it already sent, under whatever epoch), and again whenever the plan gets a
 * new revision, a node enrols or is retired, or a node has been out of touch longer than a unit's `move_after`. It
 * looks at cheap marks each period (the newest revision, the fleet's counts) and reads the whole fleet only when one
 * moved, or, while some unit can move, once per liveness period. A roll-out for anything but a new revision waits
 * out a quiet spell after the last one (`quietAfter`), so a fleet joining by the thousand, which moves the fleet's
 * mark at every look, does not keep the control plane reading the whole fleet while the joins wait.
 */
import { parseDuration } from "../config/duration.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Store } from "../store/index.js";
import type { RolloutContext } from "./plans.js";
import { DeclaredInPart, resendLatest } from "./declarations.js";
import { readFleet, readPlan, rollOut } from "./plans.js";
import { SentMemory } from "./sent-memory.js";
import { AllotMemory } from "./allot-memory.js";

export interface PlanWatchSettings {
  context: RolloutContext;
  store: Store;
  log: Logger;
  /** The epoch this control plane acts under; without one nothing can be signed, so nothing is rolled out. */
  epoch: () => number | undefined;
  gate: () => boolean;
  /** How often the fleet's marks are looked at. */
  everyMs: number;
  /** How often the newest revision is looked at (a single number read: a command's change goes out soon). */
  revisionEveryMs: number;
  /** How often, while a unit has `move_after`, the fleet's silences are read. */
  awayEveryMs: number;
}

export class PlanWatch {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;
  /** What the last roll-out saw; undefined until one succeeded. */
  private seen: { revision: number; fleet: string; moved: string } | undefined;
  private wanted = true;
  private movable: number[] = [];
  private lastAwayCheck = 0;
  /** When the fleet's marks were last read (monotonic ms). */
  private lastFleetLook = Number.NEGATIVE_INFINITY;
  /** Until when (monotonic ms) only a new revision is rolled out. */
  private quietUntil = Number.NEGATIVE_INFINITY;
  /** How many looks in a row failed, and until when (monotonic ms) the next waits after the last of them. */
  private failures = 0;
  private retryAt = Number.NEGATIVE_INFINITY;
  /** Nodes whose declaration was recorded by a roll-out that failed before the broker confirmed it. */
  private readonly unconfirmed = new Set<string>();
  /** The sending of a roll-out under way, if any: what nodes send waits for it (`rollingOut`). */
  private rolling: Promise<unknown> | undefined;
  /** Until when (monotonic ms) what nodes send waits for that sending: it is held once per roll-out, not per batch. */
  private holdUntil: number | undefined;

  private readonly context: RolloutContext;

  constructor(private readonly settings: PlanWatchSettings) {
    this.context = {
      ...settings.context,
      sentMemory: new SentMemory(),
      allotMemory: new AllotMemory(),
      onSending: (sending) => {
        this.rolling = sending;
        this.holdUntil = undefined;
        const ended = () => {
          if (this.rolling === sending) this.rolling = undefined;
        };
        // Its failure is the roll-out's, told there: here it only ends the hold.
        sending.then(ended, ended);
      },
    };
  }

  start(): void {
    if (this.stopped) return;
    this.timer = setInterval(
      () => this.tick(),
      Math.min(this.settings.revisionEveryMs, this.settings.everyMs),
    );
    this.tick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    await this.running;
  }

  private tick(): void {
    if (this.running !== undefined || this.stopped || performance.now() < this.retryAt) return;
    this.running = this.look()
      .then(
        (looked) => {
          // A look the gate turned away did nothing, and says nothing of the failures before it.
          if (!looked) return;
          if (this.failures > 0) this.settings.log.info("plan.rollout_again", { failures: this.failures });
          this.failures = 0;
          this.retryAt = Number.NEGATIVE_INFINITY;
        },
        (error: unknown) => {
          // Tried again after a pause that grows while the failures go on; said once per run of failures.
          this.wanted = true;
          if (error instanceof DeclaredInPart) for (const node of error.recorded) this.unconfirmed.add(node);
          this.failures++;
          const retryMs = rolloutRetryMs(this.failures);
          this.retryAt = performance.now() + retryMs;
          if (this.failures === 1)
            this.settings.log.error("plan.rollout_failed", { error: errorText(error), retry_ms: retryMs });
        },
      )
      .finally(() => (this.running = undefined));
  }

  /** Whether it looked: false when there was no epoch to act under or the gate was closed. */
  private async look(): Promise<boolean> {
    const { store, gate, log } = this.settings;
    const epoch = this.settings.epoch();
    if (epoch === undefined || !gate()) return false;
    const revision = await store.plans.newest();
    const seen = this.seen;
    // The fleet's marks cost a pass over its nodes: read each `everyMs`, or at once for a new revision.
    const startedAt = performance.now();
    const fleetDue = startedAt - this.lastFleetLook >= this.settings.everyMs && startedAt >= this.quietUntil;
    if (!this.wanted && seen !== undefined && seen.revision === revision && !fleetDue) return true;
    this.lastFleetLook = startedAt;
    const fleet = await store.nodes.fleetMark();
    const moved = await this.movedMark();
    if (
      !this.wanted &&
      seen !== undefined &&
      seen.revision === revision &&
      seen.fleet === fleet &&
      seen.moved === moved
    )
      return true;
    this.wanted = false;
    await this.resendUnconfirmed();
    const rolloutStarted = performance.now();
    // The process's CPU (every thread's: the signing threads' too) over the roll-out, logged beside its time: while it
    // sends, what nodes send waits (`rollingOut`), so this is the roll-out's own cost, whatever else shares the cores.
    const cpuBefore = process.cpuUsage();
    const rollout = await rollOut(this.context, epoch);
    const rolloutEnded = performance.now();
    const rolloutMs = Math.round(rolloutEnded - rolloutStarted);
    const cpu = process.cpuUsage(cpuBefore);
    this.quietUntil = quietAfter(rolloutEnded, rolloutEnded - startedAt);
    this.seen = { revision: rollout.revision, fleet, moved };
    this.movable = await this.moveAfters();
    if (rollout.sent.length > 0 || seen?.revision !== rollout.revision) {
      log.info("plan.rolled_out", {
        revision: rollout.revision,
        epoch,
        sent: rollout.sent.length,
        unchanged: rollout.unchanged,
        conditions: rollout.conditions.length,
        ms: rolloutMs,
        compose_ms: Math.round(rollout.composeMs),
        send_ms: Math.round(rollout.sendMs),
        cpu_ms: Math.round((cpu.user + cpu.system) / 1000),
      });
    }
    return true;
  }

  /**
   * Settles when the roll-out under way has sent its declarations (at once when none is being sent), however that
   * ends, or once `atMostMs` have passed since the first wait on it. Ingest waits on it: a roll-out and the reports it
   * causes would otherwise share the thread chunk by chunk, and each node's report waits in its stream,
   * unacknowledged, for a larger and cheaper batch. A roll-out that sends nothing (the look at a takeover, most often)
   * holds nothing, and one slower than `atMostMs` (a broker struggling) holds ingest that long in all, not that long
   * for each batch: the nodes' messages would otherwise pile up unread behind it.
   */
  rollingOut(atMostMs: number): Promise<void> {
    if (this.rolling === undefined) return Promise.resolve();
    this.holdUntil ??= performance.now() + atMostMs;
    const leftMs = this.holdUntil - performance.now();
    return leftMs <= 0 ? Promise.resolve() : settledWithin(this.rolling, leftMs);
  }

  /**
   * Sends again, exactly as recorded, each declaration a failed roll-out recorded but the broker may not have taken:
   * before the roll-out that follows, so the node has it before anything newer. A node that fails here is tried at
   * the next look.
   */
  private async resendUnconfirmed(): Promise<void> {
    const { store, context } = this.settings;
    for (const node of [...this.unconfirmed]) {
      await resendLatest(store, context.bus, node);
      this.unconfirmed.delete(node);
    }
  }

  /** The `move_after` periods of the current plan's units, shortest first. */
  private async moveAfters(): Promise<number[]> {
    const { plan } = await readPlan(this.settings.store);
    const periods = plan.units.flatMap((unit) =>
      unit.move_after === undefined ? [] : [parseDuration(unit.move_after, "move_after")],
    );
    return [...new Set(periods)].sort((a, b) => a - b);
  }

  /**
   * For each `move_after` of the plan, which nodes have been out of touch longer: a change moves placements. Read
   * at most once per `awayEveryMs`, and not at all when no unit can move.
   */
  private async movedMark(): Promise<string> {
    const previous = this.seen?.moved ?? "";
    if (this.movable.length === 0) return "";
    const now = this.settings.context.now();
    if (now.getTime() - this.lastAwayCheck < this.settings.awayEveryMs) return previous;
    this.lastAwayCheck = now.getTime();
    const { away } = await readFleet(this.settings.store, now, this.settings.context.outOfTouchAfterMs);
    return JSON.stringify(
      this.movable.map((period) =>
        [...away]
          .filter(([, ms]) => ms >= period)
          .map(([node]) => node)
          .sort(),
      ),
    );
  }
}

/**
 * Until when a look that finds only the fleet changed waits, after a look that rolled out and took `tookMs` (its
 * reads and its roll-out): three times as long again, so such looks take at most a quarter of the thread. At 1,000
 * nodes a look takes tens of milliseconds; at 10,000, hundreds — and each newly enrolled node still gets its first
 * declaration within a few of them.
 */
export function quietAfter(endedAt: number, tookMs: number): number {
  return endedAt + 3 * Math.max(0, tookMs);
}

/**
 * How long a roll-out that failed waits before it is tried again: from a tenth of a second, doubled at each failure
 * in a row, to 5 s. A fault that passes (the broker a moment away) costs a tenth of a second; one that lasts (a
 * store refusing the declarations' rows) is tried about a dozen times a minute, not at every look, each try
 * allocating every target's next sequence and reading the fleet. 5 s: a roll-out goes out within seconds of the
 * fault's end, well within a waiting `mesh declare`'s deadline.
 */
export const rolloutRetry = { firstMs: 100, longestMs: 5_000 };

/** The pause after the `failures`th failed roll-out in a row. */
export function rolloutRetryMs(failures: number): number {
  return Math.min(rolloutRetry.longestMs, rolloutRetry.firstMs * 2 ** Math.max(0, failures - 1));
}

/** Settles when `work` does, fulfilled or rejected (its outcome is its owner's to handle), or after `ms`. */
export async function settledWithin(work: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const ended = work.then(
    () => undefined,
    () => undefined,
  );
  await Promise.race([ended, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
  clearTimeout(timer);
}
