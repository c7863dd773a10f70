/**
 * A control plane process, as a composition root: it opens the store and the broker and wires the named parts. It
 * waits as a standby until it holds the lease (`lease/standing.ts`), and only then asserts the bus, brings the
 * revocations up to date, answers enrolments, consumes the control queue and starts its periodic work. It acts only
 * while the lease's gate is open; a lost lease or a closed gate ends it.
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { join } from "node:path";
import type { BrokerAccess } from "../bus/index.js";
import { openControlSide } from "../bus/index.js";
import type { ControlPeriods, MeshOptions } from "../config/options.js";
import { MeshError } from "../errors.js";
import { loadOrCreateSigningKey } from "../keys/index.js";
import { Standing } from "../lease/standing.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import { openStore, redact } from "../store/index.js";
import { ControlMetrics } from "./control-metrics.js";
import { Duties } from "./duties.js";

export interface ServeSettings {
  options: MeshOptions;
  broker: BrokerAccess;
  log: Logger;
  /** Overrides of `options.periods` (tests run with short ones). */
  flushEveryMs?: number;
  livenessEveryMs?: number;
  resendAfterMs?: number;
  tokenLookEveryMs?: number;
}

export interface RunningControlPlane {
  /** Settles when the control plane stops acting; rejects when it lost the lease or failed. */
  done: Promise<void>;
  /** Settles once this control plane acts: it holds the lease (or runs without an epoch) and consumes. */
  serving: Promise<void>;
  stop(): Promise<void>;
}

export async function serve(settings: ServeSettings): Promise<RunningControlPlane> {
  const { options, log } = settings;
  const periods = periodsOf(settings);
  const now = () => new Date();
  const signing = loadOrCreateSigningKey(join(options.dataDir, "keys"));
  const store = await openStore(options.storeUrl, {
    historyLimit: options.historyLimit,
    // SQLite's checkpoints on a thread of their own, off the commits of roll-outs and report batches.
    checkpointsApart: {
      failed: (reason) => log.warn("store.checkpoint_failed", { reason }),
      recovered: () => log.info("store.checkpoint_recovered"),
    },
  });
  // Nothing may stay open behind a control plane that did not start: the process must be able to end.
  const side = await openControlSide(options.dataDir, settings.broker, log, { longLived: true }).catch(
    async (error: unknown) => {
      await store.close();
      throw error;
    },
  );
  const standing = new Standing({
    backend: await side.lease(options.lease.ttlMs, store),
    epochs: store.epochs,
    noEpoch: store.noEpoch,
    timings: options.lease,
    holder: { id: randomUUID(), host: hostname(), pid: process.pid, taken_at: now().toISOString() },
    log,
    noEpochLogEveryMs: periods.noEpochLogEveryMs,
    now,
  });
  const gate = () => standing.gate();
  const metrics = new ControlMetrics({
    held: () => standing.holder.canAct(),
    epoch: () => standing.epoch,
    withoutEpoch: () => standing.withoutEpoch,
  });
  const metricsServer = await metrics.serve(options.metrics, log).catch(async (error: unknown) => {
    await side.close();
    await store.close();
    throw error;
  });

  const duties = new Duties({
    options,
    periods,
    store,
    side,
    signing,
    log,
    now,
    gate,
    epoch: () => standing.epoch,
    metrics,
  });

  let stopping = false;
  let markServing: () => void = () => undefined;
  const serving = new Promise<void>((resolve) => (markServing = resolve));
  const act = async (): Promise<void> => {
    // A standby waits: nothing is asserted or consumed before the lease is ours.
    if ((await standing.obtain()) === "stopping" || stopping) return;
    await duties.start();
    if (stopping || duties.consuming === undefined) return;
    markServing();
    const [epoch, broker, storeUrl] = [standing.epoch ?? null, side.identities.url, redact(options.storeUrl)];
    log.info("control.serving", { epoch, broker, store: storeUrl });
    const closed = duties.consuming.then(
      () => "the control queue closed",
      (error: unknown) => {
        // A consumer taken away from a controller whose lease is over (frozen past it, say) is the next holder's
        // doing: the lease is why acting ended, whichever of the two this process noticed first.
        if (!stopping && !standing.gate()) return standing.ended;
        throw error;
      },
    );
    const ended = await Promise.race([closed, standing.ended]);
    if (!stopping) throw new MeshError("lease_lost", ended);
  };

  const done = act();
  return {
    done,
    serving,
    stop: async () => {
      if (stopping) return;
      stopping = true;
      standing.stopActing();
      await duties.stop();
      // Given back first: from here the gate is shut, so nothing acts any more, and a standby may take over.
      await standing.giveBack();
      await side.close();
      await duties.consuming?.catch((error: unknown) =>
        log.warn("control.consume_ended", { error: errorText(error) }),
      );
      await duties.finish();
      await standing.clearNoEpoch();
      await store.close();
      await metricsServer?.close();
      log.info("control.stopped");
    },
  };
}

/** The compiled periods, with the overrides a caller (a test) gave. */
function periodsOf(settings: ServeSettings): ControlPeriods {
  const { flushEveryMs, livenessEveryMs, resendAfterMs, tokenLookEveryMs } = settings;
  const given = { flushEveryMs, livenessEveryMs, resendAfterMs, tokenLookEveryMs };
  const overrides = Object.entries(given).filter(([, value]) => value !== undefined);
  return { ...settings.options.periods, ...Object.fromEntries(overrides) };
}
