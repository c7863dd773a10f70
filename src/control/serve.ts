/**
 * A control plane process: answers enrolments, consumes the control queue, keeps `last_seen` in batches and
 * watches liveness, until stopped.
 */
import type { EmbeddedServer } from "../bus/index.js";
import { openControlSide } from "../bus/index.js";
import type { MeshOptions } from "../config/options.js";
import { loadOrCreateSigningKey } from "../keys/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import { openStore } from "../store/index.js";
import { join } from "node:path";
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
  /** Settles when the control queue stops being consumed (rejects on a failure). */
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
  // The broker may have started from an older preload (it is not always ours to rewrite): bring its revocations
  // up to date now and after every reconnection.
  const syncRevocations = async () => side.identities.revoke(await currentRevocations(store, now()));
  try {
    await side.bus.assert();
    await syncRevocations();
  } catch (error) {
    await side.close();
    await store.close();
    throw error;
  }
  side.bus.onReconnect(() => {
    syncRevocations().then(
      () => log.info("broker.reconnected", { revocations: "applied again" }),
      (error: unknown) => log.error("broker.revocations_not_applied", { error: errorText(error) }),
    );
  });

  await side.bus.answerEnrolments((request) =>
    answerEnrolment(
      {
        store,
        broker: side.identities,
        signing,
        log,
        now,
        resendLatest: async (node) => {
          await resendLatest(store, side.bus, node);
        },
      },
      request,
    ),
  );
  const ingest = new Ingest({
    store,
    bus: side.bus,
    log,
    now,
    resendAfterMs: settings.resendAfterMs ?? 5000,
  });
  const watch = new LivenessWatch(store, log, options.outOfTouchAfterMs, now);
  const repeat = (what: string, everyMs: number, work: () => Promise<void>) =>
    setInterval(() => {
      work().catch((error: unknown) => log.error(`${what}.failed`, { error: errorText(error) }));
    }, everyMs);
  const timers = [
    repeat("last_seen.flush", settings.flushEveryMs ?? 1000, () => ingest.flush()),
    // Checked often enough that a crossing is seen within a quarter of the threshold (at most every 5 s).
    repeat(
      "liveness.check",
      settings.livenessEveryMs ?? Math.min(5000, Math.max(250, options.outOfTouchAfterMs / 4)),
      () => watch.check(),
    ),
  ];
  const done = side.bus.consumeControl((delivery) => ingest.handle(delivery));
  log.info("control.serving", {
    broker: settings.brokerUrl,
    store: options.storeUrl.replace(/:[^:@/]*@/, ":***@"),
  });

  let stopped = false;
  return {
    done,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      for (const timer of timers) clearInterval(timer);
      await side.close();
      await done.catch((error: unknown) => log.warn("control.consume_ended", { error: errorText(error) }));
      await ingest.flush();
      await store.close();
      log.info("control.stopped");
    },
  };
}
