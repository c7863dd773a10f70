/**
 * A control plane process. It waits as a standby until it holds the lease, and only then asserts the bus, answers
 * enrolments, consumes the control queue, keeps `last_seen` in batches and watches liveness. It acts only while the
 * lease's gate is open; a lost lease or a closed gate ends it.
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { join } from "node:path";
import type { BrokerAccess } from "../bus/index.js";
import { openControlSide } from "../bus/index.js";
import type { MeshOptions } from "../config/options.js";
import { MeshError } from "../errors.js";
import { encodeMessage } from "../link/index.js";
import { loadOrCreateSigningKey } from "../keys/index.js";
import { LeaseHolder } from "../lease/holder.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import { openStore } from "../store/index.js";
import { resendLatest } from "./declarations.js";
import { answerEnrolment } from "./enrolment.js";
import { Ingest } from "./ingest.js";
import { LivenessWatch } from "./liveness-watch.js";
import { Metrics } from "./metrics.js";
import { RefusalLedger } from "./refusals.js";
import { pruneEvents, pruneEventsEveryMs } from "./retention.js";
import { currentRevocations, retiredNodes } from "./revocations.js";
import { TokenSweep } from "./token-sweep.js";

export interface ServeSettings {
  options: MeshOptions;
  broker: BrokerAccess;
  log: Logger;
  /** How often batched `last_seen` times are written. */
  flushEveryMs?: number;
  /** How often liveness is checked for crossings. */
  livenessEveryMs?: number;
  resendAfterMs?: number;
  /** How often the store is looked at for a newly issued token that expires before the armed sweep. */
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
  const now = () => new Date();
  const signing = loadOrCreateSigningKey(join(options.dataDir, "keys"));
  const store = await openStore(options.storeUrl, { historyLimit: options.historyLimit });
  // Nothing may stay open behind a control plane that did not start: the process must be able to end.
  const side = await openControlSide(options.dataDir, settings.broker, log, { longLived: true }).catch(
    async (error: unknown) => {
      await store.close();
      throw error;
    },
  );
  const backend = await side.lease(options.lease.ttlMs, store);
  const me = { id: randomUUID(), host: hostname(), pid: process.pid, taken_at: now().toISOString() };
  const holder = new LeaseHolder({ backend, epochs: store.epochs, timings: options.lease, holder: me, log });

  let stopping = false;
  const timers: NodeJS.Timeout[] = [];
  /** Work to finish before the broker connection closes. */
  const stoppers: (() => Promise<void>)[] = [];
  let ingest: Ingest | undefined;
  let consuming: Promise<void> | undefined;
  let closeGate: (reason: string) => void = () => undefined;
  const gateClosed = new Promise<string>((resolve) => (closeGate = resolve));
  /**
   * Set while this controller acts without any epoch: nobody held the lease and it could not be written at all.
   * Urgent and never silent: logged, kept in the store for `mesh lease show`, and a metric.
   */
  let noEpoch: { since: string; reason: string; loggedAt: number } | undefined;
  /** Work that acts passes the gate; a closed gate means the lease may be someone else's by now. */
  const gate = (): boolean => {
    if (stopping) return false;
    if (noEpoch !== undefined || holder.canAct()) return true;
    closeGate("the lease's gate closed: no renewal within its lifetime");
    return false;
  };

  /** Refusals of what nodes send, told at most once a minute per node and kind, by enrolment and ingest alike. */
  const refusals = new RefusalLedger(log);
  const metrics = new Metrics();
  metrics.gauge("mesh_lease_held", "1 while this controller holds the lease and its gate is open", () =>
    holder.canAct() ? 1 : 0,
  );
  metrics.gauge(
    "mesh_lease_epoch",
    "the epoch this controller acts under (0: none)",
    () => holder.epoch ?? 0,
  );
  metrics.gauge(
    "mesh_lease_no_epoch",
    "1 while this controller acts without any epoch because the lease cannot be written (urgent)",
    () => (noEpoch === undefined ? 0 : 1),
  );
  const countHandled = metrics.counter(
    "mesh_control_messages_total",
    "messages from the control queue this control plane has handled",
  );
  const countHandedBack = metrics.counter(
    "mesh_control_messages_handed_back_total",
    "messages handed back to the broker because the gate was closed",
  );
  const metricsServer =
    options.metrics === undefined
      ? undefined
      : await metrics.listen(options.metrics.host, options.metrics.port).catch(async (error: unknown) => {
          await side.close();
          await store.close();
          throw error;
        });
  if (metricsServer !== undefined) log.info("metrics.serving", { url: metricsServer.url });

  const urgentNote =
    "nobody holds the lease and it cannot be written: acting WITHOUT an epoch. Nothing fences this controller " +
    "from another and no declaration can be signed until the lease store takes writes again";
  const raiseNoEpoch = async (reason: string): Promise<void> => {
    const at = now().toISOString();
    if (noEpoch === undefined) {
      noEpoch = { since: at, reason, loggedAt: Date.now() };
      log.error("lease.no_epoch", { urgent: true, reason, note: urgentNote });
    } else if (Date.now() - noEpoch.loggedAt >= 60_000) {
      noEpoch.loggedAt = Date.now();
      log.error("lease.no_epoch", { urgent: true, reason, since: noEpoch.since, note: urgentNote });
    }
    await store.noEpoch.raise({
      controller: me.id,
      host: me.host,
      pid: me.pid,
      reason,
      since: noEpoch.since,
      seen_at: at,
    });
  };
  /** While without an epoch, the lease is tried again every renewal period. */
  let retrying = false;
  const retryLease = async (): Promise<void> => {
    if (noEpoch === undefined || retrying || stopping) return;
    retrying = true;
    try {
      const attempt = await holder.tryTake().then(
        (taken) => ({ taken }),
        (error: unknown) => ({ failure: errorText(error) }),
      );
      if ("failure" in attempt) {
        await raiseNoEpoch(attempt.failure);
        return;
      }
      if (!attempt.taken) {
        closeGate("another controller took the lease while this one acted without an epoch");
        return;
      }
      log.warn("lease.epoch_restored", { epoch: holder.epoch, without_epoch_since: noEpoch.since });
      noEpoch = undefined;
      await store.noEpoch.clear(me.id);
    } finally {
      retrying = false;
    }
  };

  /** Waits as a standby until the lease is ours, or until it is clear that nobody can hold it at all. */
  const obtain = async (): Promise<"holder" | "no_epoch" | "stopping"> => {
    let announced = false;
    for (;;) {
      if (stopping) return "stopping";
      let taken: boolean;
      try {
        taken = await holder.tryTake();
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
          await raiseNoEpoch(reason);
          return "no_epoch";
        }
        // Someone may hold it: without knowing, acting would risk two controllers. Wait and try again.
        log.warn("lease.unwritable", {
          reason,
          holder: current === "unknown" ? "unknown" : current.holder,
          note: "standing by",
        });
        await new Promise((resolve) => setTimeout(resolve, options.lease.renewEveryMs));
        continue;
      }
      if (taken) return "holder";
      if (!announced) {
        log.info("lease.standby", { holder: (await backend.read())?.holder ?? null });
        announced = true;
      }
      // Woken at once when the holder gives the lease back; an expiry is seen within one renewal period.
      const note = await backend.changed(options.lease.renewEveryMs).catch(async (error: unknown) => {
        await new Promise((resolve) => setTimeout(resolve, options.lease.renewEveryMs));
        return `the lease could not be watched: ${errorText(error)}`;
      });
      if (note !== undefined) log.warn("lease.watch_failed", { note });
    }
  };

  const act = async (): Promise<void> => {
    // A standby waits: nothing is asserted or consumed before the lease is ours.
    const standing = await obtain();
    if (standing === "stopping" || stopping) return;
    if (standing === "no_epoch") {
      timers.push(
        setInterval(() => {
          retryLease().catch((error: unknown) =>
            log.error("lease.retry_failed", { error: errorText(error) }),
          );
        }, options.lease.renewEveryMs),
      );
    }
    await side.bus.assert();
    // A stop may come at any await from here on: nothing is started after it.
    if (stopping) return;
    // The broker may have started from an older preload (it is not always ours to rewrite): bring its
    // revocations up to date now and after every reconnection.
    const syncRevocations = async () => {
      await side.identities.revoke(await currentRevocations(store, now()));
      for (const node of await retiredNodes(store)) await side.identities.forget(node);
    };
    // Token accounts that can no longer be spent (spent, revoked, expired) are deleted: now, at each token's end,
    // and periodically as the safety net.
    const tokenSweep = new TokenSweep({
      store,
      identities: side.identities,
      log,
      now,
      graceMs: options.tokenGraceMs,
      sweepEveryMs: options.tokenSweepEveryMs,
      lookEveryMs: settings.tokenLookEveryMs ?? 1000,
    });
    stoppers.push(() => tokenSweep.stop());
    await tokenSweep.start();
    await syncRevocations();
    if (stopping) return;
    side.bus.onReconnect(() => {
      syncRevocations().then(
        () => log.info("broker.reconnected", { revocations: "applied again" }),
        (error: unknown) => log.error("broker.revocations_not_applied", { error: errorText(error) }),
      );
    });
    // Enrolments ask for the revocations to be brought up to date once the joiner has had its answer (the token's
    // grace); a burst of joins shares one.
    let revokeTimer: NodeJS.Timeout | undefined;
    let revoking: Promise<void> = Promise.resolve();
    const revokeSoon = () => {
      if (revokeTimer !== undefined || stopping) return;
      revokeTimer = setTimeout(() => {
        revokeTimer = undefined;
        revoking = revoking
          .then(syncRevocations)
          .catch((error: unknown) =>
            log.error("broker.revocations_not_applied", { error: errorText(error) }),
          );
      }, options.tokenGraceMs);
    };
    stoppers.push(async () => {
      clearTimeout(revokeTimer);
      await revoking;
    });
    // Enrolments are answered side by side, but one node's one after another: a node with two valid tokens
    // presented at once must end with one broker identity, the one before revoked each time.
    const enrolling = new Map<string, Promise<unknown>>();
    await side.bus.answerEnrolments(async (request) => {
      if (!gate()) {
        const reason = "the control plane is handing over; try again";
        return { reply: encodeMessage({ kind: "enrol_reply", accepted: false, reason }) };
      }
      const answer = () =>
        answerEnrolment(
          {
            store,
            broker: side.identities,
            signing,
            log,
            refusals,
            now,
            resendLatest: async (node) => {
              if (gate()) await resendLatest(store, side.bus, node);
            },
            revokeSoon,
            tokenSpent: (token) => tokenSweep.spent(token),
          },
          request,
        );
      const before = enrolling.get(request.node) ?? Promise.resolve();
      const turn = before.then(answer, answer);
      enrolling.set(request.node, turn);
      try {
        return await turn;
      } finally {
        if (enrolling.get(request.node) === turn) enrolling.delete(request.node);
      }
    });
    if (stopping) return;
    const running = new Ingest({
      store,
      bus: side.bus,
      log,
      now,
      refusals,
      resendAfterMs: settings.resendAfterMs ?? 5000,
    });
    ingest = running;
    const watch = new LivenessWatch(store, log, options.outOfTouchAfterMs, now);
    const repeat = (what: string, everyMs: number, work: () => Promise<void>) =>
      setInterval(() => {
        work().catch((error: unknown) => log.error(`${what}.failed`, { error: errorText(error) }));
      }, everyMs);
    const prune = async () => {
      await pruneEvents(store, options.events, now(), log);
    };
    await prune();
    timers.push(
      repeat("last_seen.flush", settings.flushEveryMs ?? 1000, () => running.flush()),
      repeat("events.prune", pruneEventsEveryMs, prune),
      // Checked often enough that a crossing is seen within a quarter of the threshold (at most every 5 s).
      repeat(
        "liveness.check",
        settings.livenessEveryMs ?? Math.min(5000, Math.max(250, options.outOfTouchAfterMs / 4)),
        () => watch.check(),
      ),
    );
    consuming = side.bus.consumeControl(async (batch) => {
      if (!gate()) {
        countHandedBack(batch.length);
        return batch.map(() => "retry");
      }
      const outcomes = await running.handleBatch(batch);
      countHandled(batch.length);
      return outcomes;
    });
    markServing();
    log.info("control.serving", {
      epoch: holder.epoch ?? null,
      broker: side.identities.url,
      store: options.storeUrl.replace(/:[^:@/]*@/, ":***@"),
    });
    const ended = await Promise.race([
      consuming.then(() => "the control queue closed"),
      holder.lost.then((reason) => `lease lost: ${reason}`),
      gateClosed,
    ]);
    if (!stopping) throw new MeshError("lease_lost", ended);
  };

  let markServing: () => void = () => undefined;
  const serving = new Promise<void>((resolve) => (markServing = resolve));
  const done = act();
  let stopped = false;
  return {
    done,
    serving,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      stopping = true;
      for (const timer of timers) clearInterval(timer);
      for (const stopper of stoppers) await stopper();
      // Given back first: from here the gate is shut, so nothing acts any more, and a standby may take over.
      await holder
        .release()
        .catch((error: unknown) => log.warn("lease.not_released", { error: errorText(error) }));
      await backend.close();
      await side.close();
      await consuming?.catch((error: unknown) =>
        log.warn("control.consume_ended", { error: errorText(error) }),
      );
      await ingest?.flush();
      if (noEpoch !== undefined) await store.noEpoch.clear(me.id);
      await store.close();
      await metricsServer?.close();
      // Work started while this stop was under way must not keep the process alive.
      for (const timer of timers) clearInterval(timer);
      log.info("control.stopped");
    },
  };
}
