/**
 * A control plane process. It waits as a standby until it holds the lease, and only then asserts the bus, answers
 * enrolments, consumes the control queue, keeps `last_seen` in batches and watches liveness. It acts only while the
 * lease's gate is open; a lost lease or a closed gate ends it.
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { join } from "node:path";
import type { EmbeddedServer } from "../bus/index.js";
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
import { currentRevocations } from "./revocations.js";

export interface ServeSettings {
  options: MeshOptions;
  brokerUrl: string;
  embedded?: EmbeddedServer;
  log: Logger;
  /** How often batched `last_seen` times are written. */
  flushEveryMs?: number;
  /** How often liveness is checked for crossings. */
  livenessEveryMs?: number;
  resendAfterMs?: number;
}

export interface RunningControlPlane {
  /** Settles when the control plane stops acting; rejects when it lost the lease or failed. */
  done: Promise<void>;
  stop(): Promise<void>;
}

export async function serve(settings: ServeSettings): Promise<RunningControlPlane> {
  const { options, log } = settings;
  const now = () => new Date();
  const signing = loadOrCreateSigningKey(join(options.dataDir, "keys"));
  const store = await openStore(options.storeUrl, { historyLimit: options.historyLimit });
  // Nothing may stay open behind a control plane that did not start: the process must be able to end.
  const side = await openControlSide(options.dataDir, settings.brokerUrl, log, {
    ...(settings.embedded === undefined ? {} : { embedded: settings.embedded }),
    longLived: true,
  }).catch(async (error: unknown) => {
    await store.close();
    throw error;
  });
  const backend = await side.lease(options.lease.ttlMs);
  const holder = new LeaseHolder({
    backend,
    epochs: store.epochs,
    timings: options.lease,
    holder: { id: randomUUID(), host: hostname(), pid: process.pid, taken_at: now().toISOString() },
    log,
  });

  let stopping = false;
  const timers: NodeJS.Timeout[] = [];
  let ingest: Ingest | undefined;
  let consuming: Promise<void> | undefined;
  let closeGate: (reason: string) => void = () => undefined;
  const gateClosed = new Promise<string>((resolve) => (closeGate = resolve));
  /** Work that acts passes the gate; a closed gate means the lease may be someone else's by now. */
  const gate = (): boolean => {
    if (stopping) return false;
    if (holder.canAct()) return true;
    closeGate("the lease's gate closed: no renewal within its lifetime");
    return false;
  };

  const act = async (): Promise<void> => {
    // A standby waits: nothing is asserted or consumed before the lease is ours.
    let announced = false;
    while (!(await holder.tryTake())) {
      if (stopping) return;
      if (!announced) {
        log.info("lease.standby", { holder: (await backend.read())?.holder ?? null });
        announced = true;
      }
      await new Promise((resolve) => setTimeout(resolve, options.lease.renewEveryMs));
    }
    if (stopping) return;
    await side.bus.assert();
    // The broker may have started from an older preload (it is not always ours to rewrite): bring its
    // revocations up to date now and after every reconnection.
    const syncRevocations = async () => side.identities.revoke(await currentRevocations(store, now()));
    await syncRevocations();
    side.bus.onReconnect(() => {
      syncRevocations().then(
        () => log.info("broker.reconnected", { revocations: "applied again" }),
        (error: unknown) => log.error("broker.revocations_not_applied", { error: errorText(error) }),
      );
    });
    await side.bus.answerEnrolments(async (request) => {
      if (!gate()) {
        const reason = "the control plane is handing over; try again";
        return { reply: encodeMessage({ kind: "enrol_reply", accepted: false, reason }) };
      }
      return answerEnrolment(
        {
          store,
          broker: side.identities,
          signing,
          log,
          now,
          resendLatest: async (node) => {
            if (gate()) await resendLatest(store, side.bus, node);
          },
        },
        request,
      );
    });
    const running = new Ingest({
      store,
      bus: side.bus,
      log,
      now,
      resendAfterMs: settings.resendAfterMs ?? 5000,
    });
    ingest = running;
    const watch = new LivenessWatch(store, log, options.outOfTouchAfterMs, now);
    const repeat = (what: string, everyMs: number, work: () => Promise<void>) =>
      setInterval(() => {
        work().catch((error: unknown) => log.error(`${what}.failed`, { error: errorText(error) }));
      }, everyMs);
    timers.push(
      repeat("last_seen.flush", settings.flushEveryMs ?? 1000, () => running.flush()),
      // Checked often enough that a crossing is seen within a quarter of the threshold (at most every 5 s).
      repeat(
        "liveness.check",
        settings.livenessEveryMs ?? Math.min(5000, Math.max(250, options.outOfTouchAfterMs / 4)),
        () => watch.check(),
      ),
    );
    consuming = side.bus.consumeControl((delivery) =>
      gate() ? running.handle(delivery) : Promise.resolve("retry"),
    );
    log.info("control.serving", {
      epoch: holder.epoch,
      broker: settings.brokerUrl,
      store: options.storeUrl.replace(/:[^:@/]*@/, ":***@"),
    });
    const ended = await Promise.race([
      consuming.then(() => "the control queue closed"),
      holder.lost.then((reason) => `lease lost: ${reason}`),
      gateClosed,
    ]);
    if (!stopping) throw new MeshError("lease_lost", ended);
  };

  const done = act();
  let stopped = false;
  return {
    done,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      stopping = true;
      for (const timer of timers) clearInterval(timer);
      // Given back first: from here the gate is shut, so nothing acts any more, and a standby may take over.
      await holder
        .release()
        .catch((error: unknown) => log.warn("lease.not_released", { error: errorText(error) }));
      await side.close();
      await consuming?.catch((error: unknown) =>
        log.warn("control.consume_ended", { error: errorText(error) }),
      );
      await ingest?.flush();
      await store.close();
      log.info("control.stopped");
    },
  };
}
