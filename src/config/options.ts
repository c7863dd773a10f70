/**
 * The control plane's options, compiled once from four layers, each overriding the one before: defaults,
 * `mesh.yaml` in the data dir, `MESH_*` environment variables, command-line flags. Every default lives here.
 */
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { UsageError } from "../errors.js";
import { writePrivateFile } from "../keys/index.js";
import { parseDuration } from "./duration.js";

export interface MeshOptions {
  /** The control plane's own state: keys, config, the default SQLite store. */
  dataDir: string;
  /** `sqlite:PATH` or `postgres://…`. */
  storeUrl: string;
  /** Silence longer than this makes a node out of touch. */
  outOfTouchAfterMs: number;
  /** How long a new token stays valid unless the command says otherwise. */
  tokenTtlMs: number;
  /**
   * How long a spent token's broker identity outlives the enrolment's answer, so the joiner reads the answer on the
   * token's own connection before the identity ends.
   */
  tokenGraceMs: number;
  /**
   * How often every token account is checked against the store (RabbitMQ), whatever timers are armed: the safety net
   * behind the deletions at spend, revoke and expiry.
   */
  tokenSweepEveryMs: number;
  /**
   * How long a token is kept once it has expired (spent, revoked or never used). Until its expiry a spent or revoked
   * token's identity must stay refused, so no token goes before it; after, only `mesh token list` misses it.
   */
  tokenKeepForMs: number;
  /** Declarations and accounts kept per node behind the latest. */
  historyLimit: number;
  /**
   * How long the audit trail keeps an event, and how many it keeps at most: the trail grows with what nodes send, so
   * it is bounded by age and by count (a roll-out's chunk counting the nodes it names), whichever bites first.
   */
  events: { keepForMs: number; keepAtMost: number };
  /** The controller lease: renew every, entries age out after, stop acting this much before. */
  lease: { renewEveryMs: number; ttlMs: number; marginMs: number };
  /** Where `mesh serve` serves Prometheus metrics, or undefined when it does not. */
  metrics: { host: string; port: number } | undefined;
  /** RabbitMQ's management API (`http://user:pass@host:15672`), when set; otherwise the broker record's. */
  rabbitmqApi: string | undefined;
  /** The acting control plane's own periods (`serve`). */
  periods: ControlPeriods;
}

/** Every period of the acting control plane, in milliseconds. */
export interface ControlPeriods {
  /** How often batched `last_seen` times are written. */
  flushEveryMs: number;
  /**
   * The period of receipts (a twelfth of the threshold, between 250 ms and 1 s): a node not sent one within it is
   * answered at once; the others wait for the period's sending, at most once a period, which sends each one for its
   * newest report of the batches between, well within the interval after which a node sends a report again.
   */
  receiptsEveryMs: number;
  /** How often liveness is checked for crossings: a quarter of the threshold, between 250 ms and 5 s. */
  livenessEveryMs: number;
  /** How long after its latest declaration was issued (or last sent again) a node behind it is sent it again. */
  resendAfterMs: number;
  /** How often the store is looked at for a newly issued token that expires before the armed sweep. */
  tokenLookEveryMs: number;
  /** How often the retention runs (audit trail, old tokens). */
  pruneEveryMs: number;
  /** How often the urgent no-epoch condition is logged again while it lasts. */
  noEpochLogEveryMs: number;
  /** How often the control plane checks that it hears the broker and can write the store. */
  hearingEveryMs: number;
  /** How long the broker may take to answer before the control plane counts itself deaf. */
  hearingAnswerWithinMs: number;
  /** How often the control plane looks whether the fleet changed (and so what to send). */
  planEveryMs: number;
  /**
   * How often it looks whether the plan has a new revision: a command's change goes out within this. Only the
   * newest revision's number is read, so it may be much shorter than `planEveryMs`.
   */
  planRevisionEveryMs: number;
}

/** What may be set, by its name in mesh.yaml; the environment variable is MESH_ + the name in capitals. */
export interface MeshSettings {
  store?: string | undefined;
  out_of_touch_after?: string | undefined;
  token_ttl?: string | undefined;
  token_grace?: string | undefined;
  token_sweep_every?: string | undefined;
  token_keep_for?: string | undefined;
  history_limit?: string | number | undefined;
  events_keep_for?: string | undefined;
  events_keep_at_most?: string | number | undefined;
  lease_renew_every?: string | undefined;
  lease_ttl?: string | undefined;
  lease_margin?: string | undefined;
  /** `HOST:PORT` for `/metrics`, or `off`. */
  metrics?: string | undefined;
  /** RabbitMQ's management API, `http://user:pass@host:15672`. */
  rabbitmq_api?: string | undefined;
}

const defaults = {
  dataDir: ".mesh",
  outOfTouchAfter: "45s",
  tokenTtl: "1h",
  // Measured: the answer reaches the joiner within milliseconds of being sent, even on a loaded machine.
  tokenGrace: "2s",
  tokenSweepEvery: "1m",
  tokenKeepFor: "7d",
  historyLimit: 50,
  eventsKeepFor: "30d",
  eventsKeepAtMost: 1_000_000,
  leaseRenewEvery: "5s",
  leaseTtl: "15s",
  leaseMargin: "3s",
} as const;

const settingNames = [
  "store",
  "out_of_touch_after",
  "token_ttl",
  "token_grace",
  "token_sweep_every",
  "token_keep_for",
  "history_limit",
  "events_keep_for",
  "events_keep_at_most",
  "lease_renew_every",
  "lease_ttl",
  "lease_margin",
  "metrics",
  "rabbitmq_api",
] as const;

const fileSchema = z.strictObject({
  store: z.string().min(1).optional(),
  out_of_touch_after: z.string().min(1).optional(),
  token_ttl: z.string().min(1).optional(),
  token_grace: z.string().min(1).optional(),
  token_sweep_every: z.string().min(1).optional(),
  token_keep_for: z.string().min(1).optional(),
  history_limit: z.union([z.number(), z.string()]).optional(),
  events_keep_for: z.string().min(1).optional(),
  events_keep_at_most: z.union([z.number(), z.string()]).optional(),
  lease_renew_every: z.string().min(1).optional(),
  lease_ttl: z.string().min(1).optional(),
  lease_margin: z.string().min(1).optional(),
  metrics: z.string().min(1).optional(),
  rabbitmq_api: z.string().min(1).optional(),
});

export interface CompileInput {
  /** `--data`, when given. */
  dataDir?: string | undefined;
  /** Settings from flags, when given. */
  flags: MeshSettings;
  env: NodeJS.ProcessEnv;
}

export function compileMeshOptions(input: CompileInput): MeshOptions {
  const dataDir = resolve(input.dataDir ?? nonEmpty(input.env.MESH_HOME) ?? defaults.dataDir);
  const file = readConfigFile(join(dataDir, "mesh.yaml"));
  const running = readRunningSettings(dataDir);
  const fromEnv: MeshSettings = Object.fromEntries(
    settingNames.map((name) => [name, nonEmpty(input.env[`MESH_${name.toUpperCase()}`])]),
  );
  const pick = <K extends keyof MeshSettings>(name: K): [MeshSettings[K], string] => {
    if (input.flags[name] !== undefined) return [input.flags[name], `--${name.replaceAll("_", "-")}`];
    if (fromEnv[name] !== undefined) return [fromEnv[name], `MESH_${name.toUpperCase()}`];
    if (running[name] !== undefined) return [running[name], `${runningFile} ${name}`];
    return [file[name], `mesh.yaml ${name}`];
  };

  const [store] = pick("store");
  const [outOfTouch, outOfTouchSource] = pick("out_of_touch_after");
  const [tokenTtl, tokenTtlSource] = pick("token_ttl");
  const [tokenGrace, tokenGraceSource] = pick("token_grace");
  const [tokenSweepEvery, tokenSweepEverySource] = pick("token_sweep_every");
  const [tokenKeepFor, tokenKeepForSource] = pick("token_keep_for");
  const [history, historySource] = pick("history_limit");
  const [eventsKeepFor, eventsKeepForSource] = pick("events_keep_for");
  const [eventsKeepAtMost, eventsKeepAtMostSource] = pick("events_keep_at_most");
  const [metrics, metricsSource] = pick("metrics");
  const outOfTouchAfterMs = parseDuration(outOfTouch ?? defaults.outOfTouchAfter, outOfTouchSource);
  return {
    dataDir,
    storeUrl: store ?? `sqlite:${join(dataDir, "mesh.db")}`,
    outOfTouchAfterMs,
    tokenTtlMs: parseDuration(tokenTtl ?? defaults.tokenTtl, tokenTtlSource),
    tokenGraceMs: parseDuration(tokenGrace ?? defaults.tokenGrace, tokenGraceSource),
    tokenSweepEveryMs: parseDuration(tokenSweepEvery ?? defaults.tokenSweepEvery, tokenSweepEverySource),
    tokenKeepForMs: parseDuration(tokenKeepFor ?? defaults.tokenKeepFor, tokenKeepForSource),
    historyLimit: history === undefined ? defaults.historyLimit : parseCount(history, historySource),
    events: {
      keepForMs: parseDuration(eventsKeepFor ?? defaults.eventsKeepFor, eventsKeepForSource),
      keepAtMost:
        eventsKeepAtMost === undefined
          ? defaults.eventsKeepAtMost
          : parseCount(eventsKeepAtMost, eventsKeepAtMostSource),
    },
    lease: compileLease(pick("lease_renew_every"), pick("lease_ttl"), pick("lease_margin")),
    metrics: metrics === undefined ? undefined : parseListen(metrics, metricsSource),
    rabbitmqApi: parseRabbitmqApi(...pick("rabbitmq_api")),
    periods: controlPeriods(outOfTouchAfterMs),
  };
}

/**
 * The control plane's periods. Liveness is checked often enough that a crossing is seen within a quarter of the
 * threshold (at most every 5 s, at least every 250 ms). Receipts go out at once to a node not sent one within the last
 * twelfth of the threshold (between 250 ms and 1 s), and to the others at most that often: a node says alive a few
 * times within the threshold (every 15 s against the default 45 s) and sends its pending report again only after a
 * whole such interval, so its receipt still comes long before; and each sending costs the control plane and the broker
 * a message for every node heard since the last, which in a backlog is every node several times a second. The retention
 * runs every ten minutes: refusals are told at most once a minute per node and kind, so between two runs a fleet adds a
 * bounded number of rows, and the trail stays near its limit without a delete on every tick.
 */
export function controlPeriods(outOfTouchAfterMs: number): ControlPeriods {
  return {
    flushEveryMs: 1000,
    receiptsEveryMs: Math.min(1000, Math.max(250, outOfTouchAfterMs / 12)),
    livenessEveryMs: Math.min(5000, Math.max(250, outOfTouchAfterMs / 4)),
    resendAfterMs: 5000,
    tokenLookEveryMs: 1000,
    pruneEveryMs: 10 * 60_000,
    noEpochLogEveryMs: 60_000,
    hearingEveryMs: 1000,
    hearingAnswerWithinMs: 3000,
    planEveryMs: 200,
    planRevisionEveryMs: 25,
  };
}

/**
 * What the running control plane was started with, so every command shows what it acts on: the out-of-touch
 * threshold given to `mesh up` or `mesh serve` is the one `mesh node list` uses unless told otherwise.
 */
const runningFile = "running.json";
const runningSchema = z.strictObject({ out_of_touch_after: z.string().min(1) });

export function recordRunningSettings(options: MeshOptions): void {
  // 0600 like every file in the data dir, whatever the directory's own mode.
  writePrivateFile(
    join(options.dataDir, runningFile),
    `${JSON.stringify({ out_of_touch_after: `${options.outOfTouchAfterMs}ms` })}\n`,
  );
}

function readRunningSettings(dataDir: string): MeshSettings {
  const path = join(dataDir, runningFile);
  if (!existsSync(path)) return {};
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    throw new UsageError(`${path} is damaged: ${(error as Error).message}`, { cause: error });
  }
  const result = runningSchema.safeParse(value);
  if (!result.success) throw new UsageError(`${path} is damaged: ${result.error.issues[0]?.message ?? ""}`);
  return result.data;
}

function readConfigFile(path: string): MeshSettings {
  // No config file is the ordinary case: every setting has a default.
  if (!existsSync(path)) return {};
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new UsageError(`cannot read ${path}: ${(error as Error).message}`, { cause: error });
  }
  let parsed: unknown;
  try {
    parsed = parseYaml(text) ?? {};
  } catch (error) {
    throw new UsageError(`${path} is not valid YAML: ${(error as Error).message}`, { cause: error });
  }
  const result = fileSchema.safeParse(parsed);
  if (!result.success) {
    const issue = result.error.issues[0];
    throw new UsageError(`${path}: ${issue?.path.join(".") ?? ""} ${issue?.message ?? "is invalid"}`.trim());
  }
  return result.data;
}

function compileLease(
  [renew, renewSource]: [string | undefined, string],
  [ttl, ttlSource]: [string | undefined, string],
  [margin, marginSource]: [string | undefined, string],
): MeshOptions["lease"] {
  const lease = {
    renewEveryMs: parseDuration(renew ?? defaults.leaseRenewEvery, renewSource),
    ttlMs: parseDuration(ttl ?? defaults.leaseTtl, ttlSource),
    marginMs: parseDuration(margin ?? defaults.leaseMargin, marginSource),
  };
  // A holder must renew well before it stops acting, or it would stop acting between renewals.
  if (lease.renewEveryMs >= lease.ttlMs - lease.marginMs) {
    throw new UsageError(
      `the lease must be renewed (every ${lease.renewEveryMs} ms) more often than it can act (ttl − margin = ${lease.ttlMs - lease.marginMs} ms)`,
    );
  }
  return lease;
}

/**
 * RabbitMQ's management API, `http(s)://user:pass@host:15672`: checked here, with the other settings, so a bad one
 * is bad usage before anything is written rather than a failure once the data dir has been made.
 */
export function parseRabbitmqApi(value: string | undefined, source: string): string | undefined {
  if (value === undefined) return undefined;
  let url: URL;
  try {
    url = new URL(value);
  } catch (error) {
    // The value is not echoed: it may hold a password.
    throw new UsageError(`${source} is not a URL (http://user:pass@host:15672)`, { cause: error });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new UsageError(`${source}: "${url.protocol}//…" is not http(s)://user:pass@host:15672`);
  }
  if (url.username === "") {
    throw new UsageError(`${source}: the URL names no user: http://user:pass@${url.host}`);
  }
  return value;
}

/** `HOST:PORT` (port 0 picks a free one), or `off`. */
export function parseListen(value: string, source: string): { host: string; port: number } | undefined {
  if (value.trim() === "off") return undefined;
  const match = /^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(value.trim());
  const port = Number(match?.[2]);
  if (match?.[1] === undefined || !(port >= 0 && port <= 65535)) {
    throw new UsageError(`${source}: "${value}" is not HOST:PORT (e.g. 127.0.0.1:9464) or off`);
  }
  return { host: match[1].replace(/^\[|\]$/g, ""), port };
}

function parseCount(value: string | number, source: string): number {
  const count = typeof value === "number" ? value : /^\d+$/.test(value.trim()) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(count) || count < 1) {
    throw new UsageError(`${source}: "${value}" must be a whole number of at least 1`);
  }
  return count;
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === "" ? undefined : value;
}
