/**
 * What the control plane does while it acts, in the order it starts them: the bus asserted, token accounts swept,
 * revocations brought up to date (and again after every reconnection), enrolments answered, the retention applied,
 * `last_seen` flushed, liveness watched, and the control queue consumed. Every piece passes the lease's gate.
 */
import type { ControlSide } from "../bus/index.js";
import type { ControlPeriods, MeshOptions } from "../config/options.js";
import type { SigningIdentity } from "../keys/index.js";
import type { Logger } from "../log.js";
import type { Store } from "../store/index.js";
import type { ControlMetrics } from "./control-metrics.js";
import { resendLatest } from "./declarations.js";
import { Enrolments } from "./enrolments.js";
import { Hearing } from "./hearing.js";
import { Ingest } from "./ingest.js";
import { LivenessWatch } from "./liveness-watch.js";
import { Periodic } from "./periodic.js";
import { PlanWatch } from "./plan-watch.js";
import { RefusalLedger } from "./refusals.js";
import { applyRetention } from "./retention.js";
import { RevocationSync } from "./revocation-sync.js";
import { TokenSweep } from "./token-sweep.js";

/**
 * The longest what nodes send waits for a roll-out under way, in all (`PlanWatch.rollingOut`): a roll-out of 10,000
 * nodes takes about a second on NATS and a few on RabbitMQ, and a node's alive counts from when the broker received
 * it, not when it is read, so the wait moves no node towards out of touch.
 */
const rolloutHoldsIngestMs = 5000;

export interface DutiesSettings {
  options: MeshOptions;
  periods: ControlPeriods;
  store: Store;
  side: Pick<ControlSide, "bus" | "identities">;
  signing: SigningIdentity;
  log: Logger;
  now: () => Date;
  /** Whether this control plane may act now (the lease's gate). */
  gate: () => boolean;
  /** The epoch it acts under (none while it acts without one: then nothing is signed). */
  epoch: () => number | undefined;
  metrics: Pick<ControlMetrics, "handled" | "handedBack" | "receiptsSent">;
}

export class Duties {
  private readonly revocations: RevocationSync;
  private readonly tokenSweep: TokenSweep;
  private readonly enrolments: Enrolments;
  private readonly ingest: Ingest;
  private readonly watch: LivenessWatch;
  private readonly periodic: Periodic;
  private readonly plans: PlanWatch;
  /** Whether this control plane hears the broker and can write the store. */
  readonly hearing: Hearing;
  private stopping = false;
  /** The control queue's consumer, once it runs: settles when the queue closes. */
  consuming: Promise<void> | undefined;

  constructor(private readonly settings: DutiesSettings) {
    const { options, periods, store, side, signing, log, now, gate, epoch } = settings;
    const { identities } = side;
    /** Refusals of what nodes send, told at most once a minute per node and kind, by enrolment and ingest alike. */
    const refusals = new RefusalLedger(log);
    this.revocations = new RevocationSync({ store, identities, log, now, debounceMs: options.tokenGraceMs });
    // Token accounts that can no longer be spent (spent, revoked, expired) are deleted: now, at each token's end,
    // and periodically as the safety net.
    this.tokenSweep = new TokenSweep({
      store,
      identities,
      log,
      now,
      graceMs: options.tokenGraceMs,
      sweepEveryMs: options.tokenSweepEveryMs,
      lookEveryMs: periods.tokenLookEveryMs,
    });
    const resend = async (node: string) => {
      if (gate()) await resendLatest(store, side.bus, node);
    };
    this.enrolments = new Enrolments(
      {
        store,
        broker: identities,
        signing,
        log,
        refusals,
        now,
        resendLatest: resend,
        revokeSoon: () => this.revocations.soon(),
        tokenSpent: (token) => this.tokenSweep.spent(token),
        enrolled: (node) => this.ingest.forget(node),
      },
      gate,
    );
    this.hearing = new Hearing({
      store,
      backlog: () => side.bus.backlog(),
      log,
      now,
      everyMs: periods.hearingEveryMs,
      answerWithinMs: periods.hearingAnswerWithinMs,
    });
    this.ingest = new Ingest({
      store,
      bus: side.bus,
      log,
      now,
      refusals,
      resendAfterMs: periods.resendAfterMs,
      receiptsEveryMs: periods.receiptsEveryMs,
      receiptsSent: (count) => settings.metrics.receiptsSent(count),
      storeFailed: (error, handedBack) => this.hearing.storeFailed(error, handedBack),
    });
    this.watch = new LivenessWatch(store, log, options.outOfTouchAfterMs, now, () => this.hearing.hears);
    this.periodic = new Periodic(log, () => this.hearing.storeDown);
    this.plans = new PlanWatch({
      context: {
        store,
        signing,
        bus: side.bus,
        now,
        gate: () => Promise.resolve(gate()),
        outOfTouchAfterMs: options.outOfTouchAfterMs,
      },
      store,
      log,
      epoch,
      gate: () => gate() && !this.hearing.storeDown,
      everyMs: periods.planEveryMs,
      revisionEveryMs: periods.planRevisionEveryMs,
      awayEveryMs: periods.livenessEveryMs,
    });
  }

  /** Starts every duty; a stop may come at any await, and nothing more is started after it. */
  async start(): Promise<void> {
    const { side, periods, gate, metrics } = this.settings;
    await side.bus.assert();
    if (this.stopping) return;
    // Hearing first: the stretch of time this control plane listens begins before it consumes anything.
    await this.hearing.start();
    this.tokenSweep.start();
    await this.revocations.start();
    if (this.stopping) return;
    side.bus.onReconnect(() => this.revocations.afterReconnect());
    await side.bus.answerEnrolments((request) => this.enrolments.answer(request));
    if (this.stopping) return;
    await this.retention();
    this.periodic.every("last_seen.flush", periods.flushEveryMs, () => this.ingest.flush());
    this.periodic.every("events.prune", periods.pruneEveryMs, () => this.retention());
    this.periodic.every("liveness.check", periods.livenessEveryMs, () => this.watch.check());
    this.consuming = side.bus.consumeControl(async (batch) => {
      // While the store takes no writes the batch waits here, unacknowledged, and nothing more is taken.
      await this.hearing.storeWritable();
      await this.plans.rollingOut(rolloutHoldsIngestMs);
      if (!gate()) {
        metrics.handedBack(batch.length);
        return batch.map(() => "retry");
      }
      const outcomes = await this.ingest.handleBatch(batch);
      metrics.handled(batch.length);
      return outcomes;
    });
    // After the consumer: a roll-out's reports are heard as they come.
    this.plans.start();
  }

  /** Stops the timers and the work waiting on them, before the lease is given back. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.hearing.stop();
    this.periodic.stop();
    await this.plans.stop();
    await this.tokenSweep.stop();
    await this.revocations.stop();
  }

  /** After the bus closed: what was batched is written (only when the duties ran: a standby has nothing). */
  async finish(): Promise<void> {
    this.ingest.close();
    await this.enrolments.kept();
    if (this.consuming !== undefined) await this.ingest.flush();
    // Work started while the stop was under way must not keep the process alive.
    this.periodic.stop();
  }

  private retention(): Promise<void> {
    const { store, options, now, log } = this.settings;
    return applyRetention(store, options, now(), log);
  }
}
