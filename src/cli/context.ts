/**
 * What every control-plane command starts from: the compiled options and, when it needs them, the store and the
 * signing key. Opening is lazy so `--help` and usage errors touch nothing on disk.
 */
import { join } from "node:path";
import type { MeshOptions, MeshSettings } from "../config/options.js";
import { compileMeshOptions } from "../config/options.js";
import type { SigningIdentity } from "../keys/index.js";
import { loadOrCreateSigningKey } from "../keys/index.js";
import type { Store } from "../store/index.js";
import { openStore } from "../store/index.js";
import type { BrokerAccess, ControlIdentities, ControlSide } from "../bus/index.js";
import { BusError, openControlSide, openIdentities } from "../bus/index.js";
import { MeshError } from "../errors.js";
import { createLogger } from "../log.js";
import { readBrokerRecord } from "../control/broker-record.js";
import type { ActingPolicy, ActingUnder, WithoutLease } from "../lease/acting.js";
import { underLease } from "../lease/acting.js";
import { BrokerDeadline, defaultBrokerTimeoutMs } from "./deadline.js";

/** The flags every `mesh` command shares. */
export interface GlobalFlags {
  data?: string;
  store?: string;
  outOfTouchAfter?: string;
  json?: boolean;
  /** `--metrics HOST:PORT` of `up` and `serve`. */
  metrics?: string;
  /** `--rabbitmq-api URL`. */
  rabbitmqApi?: string;
  /** `--timeout <duration>`, in milliseconds (parsed as the flag is read, so a bad one is refused first). */
  timeout?: number;
}

/** The compiled options, and the deadline of a command that reaches the broker. */
export interface CommandOptions extends MeshOptions {
  deadline: BrokerDeadline;
}

export function optionsFrom(flags: GlobalFlags): CommandOptions {
  const settings: MeshSettings = {
    store: flags.store,
    out_of_touch_after: flags.outOfTouchAfter,
    metrics: flags.metrics,
    rabbitmq_api: flags.rabbitmqApi,
  };
  return {
    ...compileMeshOptions({ dataDir: flags.data, flags: settings, env: process.env }),
    deadline: new BrokerDeadline(flags.timeout ?? defaultBrokerTimeoutMs),
  };
}

/** Runs `work` with an open store and closes the store afterwards, whatever happens. */
export async function withStore<T>(options: MeshOptions, work: (store: Store) => Promise<T>): Promise<T> {
  const store = await openStore(options.storeUrl, { historyLimit: options.historyLimit });
  try {
    return await work(store);
  } finally {
    await store.close();
  }
}

/** How to reach this mesh's recorded broker, when one has been recorded (by `mesh up` or `mesh serve`). */
export function recordedAccess(options: MeshOptions): BrokerAccess | undefined {
  const record = readBrokerRecord(options.dataDir);
  if (record === undefined) return undefined;
  return {
    url: record.url,
    rabbitmqApi: options.rabbitmqApi ?? record.rabbitmq_api,
    embedded:
      record.embedded === undefined
        ? undefined
        : { dir: join(options.dataDir, "nats", "server"), ...record.embedded },
  };
}

/** The broker identities of this mesh, when a broker has been recorded. */
export function recordedBroker(options: MeshOptions): ControlIdentities | undefined {
  const access = recordedAccess(options);
  return access === undefined ? undefined : openIdentities(options.dataDir, access);
}

export function signingIdentity(options: MeshOptions): SigningIdentity {
  return loadOrCreateSigningKey(join(options.dataDir, "keys"));
}

/**
 * Has the recorded broker refuse exactly the identities in `revoked` now (and end the account of `endedToken`, the
 * broker user of a token just revoked). When the broker is not running, says so on stderr: the control plane
 * applies the same list when it starts.
 */
export async function tellBroker(
  options: CommandOptions,
  revoked: ReadonlyMap<string, Date>,
  retired?: string,
  endedToken?: string,
): Promise<void> {
  const broker = recordedBroker(options);
  if (broker === undefined) return;
  options.deadline.reach();
  try {
    if (endedToken !== undefined) await broker.endToken(endedToken);
    await broker.revoke(revoked);
    if (retired !== undefined) await broker.forget(retired);
  } catch (error) {
    if (!(error instanceof BusError)) throw error;
    process.stderr.write(
      `mesh: the broker was not told (${error.message}); the control plane applies the revocation when it starts\n`,
    );
  } finally {
    await broker.close();
  }
}

/**
 * A one-shot connection to this mesh's recorded broker as the control plane, for commands that act or read. Every
 * wait for the broker on it is bounded by the command's deadline; `nothingDone` says what did not happen when the
 * broker does not answer in time.
 */
export async function openRecordedControlSide(
  options: CommandOptions,
  nothingDone?: string,
): Promise<ControlSide> {
  const access = recordedAccess(options);
  if (access === undefined) {
    throw new MeshError(
      "no_broker",
      "no broker is recorded for this mesh: start it with `mesh up` or `mesh serve`",
    );
  }
  options.deadline.reach(nothingDone);
  try {
    return await openControlSide(options.dataDir, access, createLogger({ level: "warn" }), {
      longLived: false,
      timeoutMs: options.deadline.ms,
    });
  } catch (error) {
    throw options.deadline.explain(error);
  }
}

/**
 * Runs `work` under the lease (`underLease`), reached through this mesh's recorded broker: through `side` when the
 * command has one open, otherwise through a connection opened for this. A mesh with no broker recorded, or one whose
 * broker cannot be reached, has no lease store to reach; the policy says whether the command acts without an epoch.
 */
export async function withCommandLease<T, W extends WithoutLease>(
  options: CommandOptions,
  store: Store,
  policy: ActingPolicy<W>,
  work: (acting: ActingUnder<W>) => Promise<T>,
  side?: ControlSide,
): Promise<T> {
  const log = createLogger({ level: "warn" });
  let opened: ControlSide | undefined;
  let reached: ControlSide | string;
  if (side !== undefined) {
    reached = side;
  } else if (recordedAccess(options) === undefined) {
    reached = "no broker is recorded for this mesh";
  } else {
    try {
      opened = await openRecordedControlSide(options, policy.nothingDone);
      reached = opened;
    } catch (error) {
      // A broker that took the connection but did not answer in time is not one that is away: the deadline has
      // passed, and the command ends rather than going on without an epoch.
      if (error instanceof MeshError && error.code === "timeout") throw error;
      if (!(error instanceof BusError)) throw error;
      reached = `the broker cannot be reached: ${error.message}`;
    }
  }
  // Until `work` begins the command has written nothing: a deadline passing now says so.
  const writing = (acting: ActingUnder<W>): Promise<T> => {
    options.deadline.beginsWriting();
    return work(acting);
  };
  try {
    if (typeof reached === "string") {
      // Without a broker recorded no controller has ever acted here: acting without an epoch is the ordinary case
      // then, and not worth a line on every command.
      const quiet = recordedAccess(options) === undefined ? createLogger({ level: "error" }) : log;
      return await underLease({ unreachable: reached, log: quiet }, policy, writing);
    }
    options.deadline.reach(policy.nothingDone);
    const backend = await reached.lease(options.lease.ttlMs, store);
    try {
      return await underLease(
        { backend, epochs: store.epochs, timings: options.lease, log },
        policy,
        writing,
      );
    } finally {
      await backend.close();
    }
  } catch (error) {
    throw options.deadline.explain(error);
  } finally {
    await opened?.close();
  }
}
