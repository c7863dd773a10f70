/**
 * The service applier: mesh-host's own process supervisor (there is no systemd under it). It starts each declared
 * service from its argv, restarts it by its policy with a growing pause, stops what is no longer declared, and keeps
 * a record per service in the state directory so that an agent that restarts takes over the processes the previous
 * one started instead of starting them twice. Linux only: it reads /proc to know a process by its start time.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import {
  closeSync,
  constants as fsConstants,
  copyFileSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  renameSync,
  statSync,
  truncateSync,
  unlinkSync,
} from "node:fs";
import { access, stat } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { writePrivateFile } from "../keys/index.js";
import { boundText, reasonMaxBytes } from "../link/index.js";
import type { DeclaredItem } from "../link/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Drift, ItemResult, KindApplier } from "./appliers.js";
import { ApplierError } from "./appliers.js";

type ServiceItem = Extract<DeclaredItem, { type: "service" }>;
type RestartPolicy = ServiceItem["restart"];
type StopSignal = NonNullable<ServiceItem["stop_signal"]>;

export interface ServiceApplierOptions {
  /** The agent's state directory; each service's record and logs go in `services/<name>/` below it. */
  stateDir: string;
  log: Logger;
  now?: () => Date;
  /** The first pause before a restart (1 s); each restart in a row doubles it up to `backoffMaxMs` (60 s). */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** A run this long (60 s) counts as stable: the next restart pauses `backoffInitialMs` again. */
  stableAfterMs?: number;
  /** How often (1 s) a process this agent did not start is looked at in /proc, and log files are measured. */
  pollMs?: number;
  /** How long a stop waits after SIGKILL for the process to be gone before it reports failure (5 s). */
  killWaitMs?: number;
  /** A log file is rotated once it reaches this size (1 MiB); `logKeep` (3) rotated files are kept. */
  logMaxBytes?: number;
  logKeep?: number;
  /**
   * Where the users and groups a service runs as are looked up (`etc/passwd`, `etc/group` below it): `/` on a node;
   * under a scratch root, the accounts the user applier made there.
   */
  accountsRoot?: string;
}

type Settings = Required<Omit<ServiceApplierOptions, "stateDir" | "log">>;

function compileServiceApplierOptions(options: ServiceApplierOptions): Settings {
  return {
    now: options.now ?? (() => new Date()),
    backoffInitialMs: options.backoffInitialMs ?? 1_000,
    backoffMaxMs: options.backoffMaxMs ?? 60_000,
    stableAfterMs: options.stableAfterMs ?? 60_000,
    pollMs: options.pollMs ?? 1_000,
    killWaitMs: options.killWaitMs ?? 5_000,
    logMaxBytes: options.logMaxBytes ?? 1024 * 1024,
    logKeep: options.logKeep ?? 3,
    accountsRoot: options.accountsRoot ?? "/",
  };
}

const defaultStopGraceMs = 10_000;
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const recordFile = "pid.json";

/** A service that will not be started as declared, with the reason a person reads in the report. */
class Refusal extends Error {
  override name = "Refusal";
}

/** How a run ended. `known` is false for a process this agent did not start: it cannot learn its exit status. */
interface Ending {
  code: number | null;
  signal: string | null;
  at: string;
  known: boolean;
}

const endingSchema = z.object({
  code: z.int().nullable(),
  signal: z.string().max(32).nullable(),
  at: z.string().max(64),
  known: z.boolean(),
});

/** `services/<name>/pid.json`: what was started, so the next agent can tell it from a process that reused the pid. */
const recordSchema = z.object({
  name: z.string().regex(/^[a-z0-9][a-z0-9_.-]{0,62}$/),
  pid: z.int().min(1),
  /** Field 22 of /proc/<pid>/stat: clock ticks after boot. With boot_id it names one process for good. */
  start_ticks: z.int().min(0),
  boot_id: z.string().max(64),
  digest: z.string().max(80),
  started_at: z.string().max(64),
  stop_signal: z.enum(["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGKILL"]),
  stop_grace_ms: z.int().min(0),
  ended: endingSchema.optional(),
});
type ServiceRecord = z.infer<typeof recordSchema>;

/** One process of a service, started by this agent or adopted from an earlier one. */
class Run {
  readonly ended: Promise<Ending>;
  private finish!: (ending: Ending) => void;
  private over = false;

  constructor(
    readonly pid: number,
    readonly startTicks: number,
    readonly startedAt: string,
    readonly adopted: boolean,
  ) {
    this.ended = new Promise((resolve) => (this.finish = resolve));
  }

  get isOver(): boolean {
    return this.over;
  }

  end(ending: Ending): void {
    if (this.over) return;
    this.over = true;
    this.finish(ending);
  }
}

/** What a Supervision needs from the applier that holds it. */
interface Host {
  settings: Settings;
  log: Logger;
  bootId: string;
  dirOf(name: string): string;
  /** Polls an adopted run until it is gone: it is not this agent's child, so no exit event comes. */
  watch(run: Run): void;
}

/**
 * Applies `service` items: each declared service kept running by its restart policy, a changed one restarted, and
 * each one it started earlier and no longer declared stopped and forgotten. Output goes to rotated files in the
 * state directory. `close()` stops supervising and leaves the processes running, for the next agent to adopt.
 */
export class ServiceApplier implements KindApplier {
  readonly types = ["service"] as const;
  readonly stateDir: string;
  private readonly settings: Settings;
  private readonly log: Logger;
  private readonly bootId: string;
  private readonly services = new Map<string, Supervision>();
  /** Services a rebuilt machine's recovery copy names: found by their command line when they have no record. */
  private readonly recovered = new Set<string>();
  private readonly watched = new Set<Run>();
  private readonly ticker: NodeJS.Timeout;
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;

  /** @throws ApplierError when /proc cannot be read: without it no process can be told apart. */
  constructor(options: ServiceApplierOptions) {
    this.stateDir = options.stateDir;
    this.log = options.log;
    this.settings = compileServiceApplierOptions(options);
    try {
      this.bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
    } catch (error) {
      throw new ApplierError(
        `the service applier needs /proc (Linux) to know its processes: ${errorText(error)}`,
        { cause: error },
      );
    }
    this.ticker = setInterval(() => this.tick(), this.settings.pollMs).unref();
  }

  apply(given: readonly DeclaredItem[]): Promise<ItemResult[]> {
    return this.serially(() => this.applyNow(given));
  }

  /** Where each declared service is not running, or runs another definition; nothing is started or stopped. */
  verify(given: readonly DeclaredItem[]): Promise<Drift[]> {
    return this.serially(() => {
      const drifts: Drift[] = [];
      for (const item of serviceItems(given)) {
        const what = this.driftOf(item);
        if (what !== undefined) drifts.push({ id: item.id, what: boundText(what) });
      }
      return drifts;
    });
  }

  /**
   * A rebuilt machine, told by its recovery copy which services the mesh ran here: each one that has no record is
   * looked for, at its next apply, among the running processes by its exact command line, and adopted when found.
   */
  adopt(ids: readonly string[]): Promise<void> {
    for (const id of ids) if (id.startsWith("service:")) this.recovered.add(id.slice("service:".length));
    return Promise.resolve();
  }

  /** Stops supervising once the apply in hand is done: timers cleared, every process left running. */
  async close(): Promise<void> {
    if (this.closed) return;
    await this.serially(() => {
      this.closed = true;
      clearInterval(this.ticker);
      for (const service of this.services.values()) service.release();
      this.services.clear();
      this.watched.clear();
    });
  }

  private serially<T>(work: () => T | Promise<T>): Promise<T> {
    const next = this.queue.then(() => {
      if (this.closed) throw new ApplierError("the service applier is closed");
      return work();
    });
    this.queue = next.catch((error: unknown) => error);
    return next;
  }

  private async applyNow(given: readonly DeclaredItem[]): Promise<ItemResult[]> {
    const items = serviceItems(given);
    const claimed = new Set<string>();
    const work = items.map(async (item): Promise<ItemResult> => {
      if (claimed.has(item.name))
        return { id: item.id, state: "failed", reason: `service ${item.name} is declared more than once` };
      claimed.add(item.name);
      try {
        return await this.applyOne(item);
      } catch (error) {
        return { id: item.id, state: "failed", reason: boundText(reasonOf(error, item.name)) };
      }
    });
    const leaving = this.knownNames().filter((name) => !claimed.has(name));
    const removals = leaving.map(async (name): Promise<ItemResult | undefined> => {
      try {
        await this.remove(name);
        return undefined;
      } catch (error) {
        const reason = `could not stop service ${name}: ${reasonOf(error, name)}`;
        return { id: `service:${name}`, state: "failed", reason: boundText(reason) };
      }
    });
    const [results, removed] = await Promise.all([Promise.all(work), Promise.all(removals)]);
    return [...results, ...removed.filter((result): result is ItemResult => result !== undefined)];
  }

  private async applyOne(item: ServiceItem): Promise<ItemResult> {
    const digest = definitionDigest(item);
    let service = this.services.get(item.name);
    if (service !== undefined && service.digest !== digest) {
      this.log.info("service.changed", { service: item.name });
      await service.stop();
      this.services.delete(item.name);
      service = undefined;
    }
    if (service === undefined) {
      service = await this.takeOver(item, digest);
      this.services.set(item.name, service);
    } else {
      await service.settle(item);
    }
    return service.result();
  }

  /** A service this agent does not supervise yet: adopt what the record names, or start it. */
  private async takeOver(item: ServiceItem, digest: string): Promise<Supervision> {
    const host = this.host();
    const record = readRecord(this.dirOf(item.name));
    if (record === undefined) {
      const found = this.recovered.has(item.name) ? findRunning(item) : undefined;
      if (found === undefined) return Supervision.start(host, item, digest);
      // The machine's state was wiped and the mesh says it ran this: the process still running it is the one.
      const run = new Run(found.pid, found.startTicks, this.settings.now().toISOString(), true);
      this.watch(run);
      return Supervision.adopt(host, item, digest, run);
    }
    const sameBoot = record.boot_id === this.bootId;
    if (sameBoot && processState(record.pid, record.start_ticks) === "running") {
      const run = new Run(record.pid, record.start_ticks, record.started_at, true);
      this.watch(run);
      if (record.digest === digest) return Supervision.adopt(host, item, digest, run);
      this.log.info("service.changed", { service: item.name, pid: record.pid });
      await stopRun(run, record.stop_signal, record.stop_grace_ms, this.settings.killWaitMs);
      return Supervision.start(host, item, digest);
    }
    // It ended while no agent was watching (or before): the policy decides, as if this agent had seen it end.
    if (sameBoot) await this.stopLeftBehind(record);
    if (sameBoot && record.digest === digest) {
      const ending = record.ended ?? { code: null, signal: null, at: record.started_at, known: false };
      if (!restartsAfter(item.restart, ending)) return Supervision.down(host, item, digest, ending);
    }
    return Supervision.start(host, item, digest);
  }

  /** Stops a service no longer declared and forgets it; its log files stay for whoever asks why it ran. */
  private async remove(name: string): Promise<void> {
    const service = this.services.get(name);
    if (service !== undefined) {
      await service.stop();
      this.services.delete(name);
    } else {
      const record = readRecord(this.dirOf(name));
      if (
        record !== undefined &&
        record.boot_id === this.bootId &&
        processState(record.pid, record.start_ticks) === "running"
      ) {
        const run = new Run(record.pid, record.start_ticks, record.started_at, true);
        this.watch(run);
        await stopRun(run, record.stop_signal, record.stop_grace_ms, this.settings.killWaitMs);
      } else if (record !== undefined && record.boot_id === this.bootId) {
        await this.stopLeftBehind(record);
      }
    }
    forgetRecord(this.dirOf(name));
    this.log.info("service.removed", { service: name });
  }

  /** Stops what a recorded run of this boot that ended while no agent watched left of its process group. */
  private async stopLeftBehind(record: ServiceRecord): Promise<void> {
    const run = new Run(record.pid, record.start_ticks, record.started_at, true);
    run.end(record.ended ?? { code: null, signal: null, at: record.started_at, known: false });
    await stopLeftBehind(run, record, this.settings.killWaitMs, this.log, record.name);
  }

  private driftOf(item: ServiceItem): string | undefined {
    const digest = definitionDigest(item);
    const service = this.services.get(item.name);
    if (service !== undefined) return service.driftFrom(digest);
    const record = readRecord(this.dirOf(item.name));
    if (record === undefined) return "not running: not started yet";
    const alive =
      record.boot_id === this.bootId && processState(record.pid, record.start_ticks) === "running";
    if (!alive) return "not running: its process is gone and this agent has not restarted it";
    if (record.digest !== digest) return `running a different definition (pid ${record.pid})`;
    return undefined;
  }

  /** Every service this applier supervises or has a record of. */
  private knownNames(): string[] {
    const names = new Set(this.services.keys());
    const root = join(this.stateDir, "services");
    if (statSync(root, { throwIfNoEntry: false }) !== undefined) {
      for (const entry of readdirSync(root, { withFileTypes: true })) {
        if (entry.isDirectory() && statSync(join(root, entry.name, recordFile), { throwIfNoEntry: false }))
          names.add(entry.name);
      }
    }
    return [...names].sort();
  }

  private dirOf(name: string): string {
    return join(this.stateDir, "services", name);
  }

  private watch(run: Run): void {
    this.watched.add(run);
  }

  private host(): Host {
    return {
      settings: this.settings,
      log: this.log,
      bootId: this.bootId,
      dirOf: (name) => this.dirOf(name),
      watch: (run) => this.watch(run),
    };
  }

  private tick(): void {
    try {
      this.look();
    } catch (error) {
      this.log.error("service.watch_failed", { error: errorText(error) });
    }
  }

  private look(): void {
    for (const run of this.watched) {
      if (run.isOver) {
        this.watched.delete(run);
      } else if (processState(run.pid, run.startTicks) === "gone") {
        this.watched.delete(run);
        run.end({ code: null, signal: null, at: this.settings.now().toISOString(), known: false });
      }
    }
    for (const service of this.services.values()) service.rotateLogs();
  }
}

type Phase =
  | { kind: "starting" }
  | { kind: "running"; run: Run }
  | { kind: "waiting"; ending: Ending; until: Date; timer: NodeJS.Timeout }
  | { kind: "down"; ending: Ending }
  | { kind: "refused"; reason: string }
  | { kind: "stopping" }
  | { kind: "released" };

/** One declared service and its processes over time: the restart policy, the pauses, the record, the logs. */
class Supervision {
  private phase: Phase = { kind: "starting" };
  private restarts = 0;
  private backoffMs: number;
  private launching: Promise<void> | undefined;
  /** The stopping of what the run that ended last left of its process group; a restart or a stop waits for it. */
  private leftovers: Promise<void> = Promise.resolve();
  /** Set once a stop is asked for: a start still waiting on the leftovers then starts nothing. */
  private stopAsked = false;

  private constructor(
    private readonly host: Host,
    private item: ServiceItem,
    readonly digest: string,
  ) {
    this.backoffMs = host.settings.backoffInitialMs;
  }

  static async start(host: Host, item: ServiceItem, digest: string): Promise<Supervision> {
    const service = new Supervision(host, item, digest);
    await service.launch();
    return service;
  }

  static adopt(host: Host, item: ServiceItem, digest: string, run: Run): Supervision {
    const service = new Supervision(host, item, digest);
    host.log.info("service.adopted", { service: item.name, pid: run.pid });
    service.follow(run);
    service.writeRecord(run);
    return service;
  }

  static down(host: Host, item: ServiceItem, digest: string, ending: Ending): Supervision {
    const service = new Supervision(host, item, digest);
    service.phase = { kind: "down", ending };
    return service;
  }

  private get dir(): string {
    return this.host.dirOf(this.item.name);
  }

  /** The same definition declared again: new stop or restart settings are taken; nothing is restarted. */
  async settle(item: ServiceItem): Promise<void> {
    const before = this.item;
    this.item = item;
    await this.launching;
    const stopChanged =
      before.stop_signal !== item.stop_signal || before.stop_grace_ms !== item.stop_grace_ms;
    // The record carries how to stop it, for an agent that finds it no longer declared after a restart.
    if (this.phase.kind === "running" && stopChanged) this.writeRecord(this.phase.run);
    // A service left down by its old policy starts when the new one would have restarted it.
    else if (this.phase.kind === "down" && restartsAfter(item.restart, this.phase.ending))
      await this.launch();
    // A start that was refused (a missing program, say) is tried again with each apply.
    else if (this.phase.kind === "refused") await this.launch();
  }

  result(): ItemResult {
    const id = this.item.id;
    const phase = this.phase;
    switch (phase.kind) {
      case "running": {
        const { run } = phase;
        const restarts = `${this.restarts} restart${this.restarts === 1 ? "" : "s"}`;
        const adopted = run.adopted ? " (adopted)" : "";
        return {
          id,
          state: "applied",
          detail: `running pid ${run.pid} since ${run.startedAt}${adopted}, ${restarts}`,
        };
      }
      case "waiting": {
        const pause = Math.max(0, phase.until.getTime() - this.host.settings.now().getTime());
        const reason = this.withStderr(
          `${endingText(phase.ending)}; restart ${this.restarts + 1} in ${seconds(pause)}`,
        );
        return { id, state: "failed", reason };
      }
      case "down": {
        const policy = `not restarted (restart: ${this.item.restart})`;
        if (!isFailure(phase.ending))
          return { id, state: "applied", detail: `${endingText(phase.ending)}; ${policy}` };
        return { id, state: "failed", reason: this.withStderr(`${endingText(phase.ending)}; ${policy}`) };
      }
      case "refused":
        return { id, state: "failed", reason: boundText(phase.reason) };
      case "starting":
      case "stopping":
      case "released":
        return { id, state: "failed", reason: `service ${this.item.name} is ${phase.kind}` };
      default: {
        const unknown: never = phase;
        throw new Error(`unknown phase ${JSON.stringify(unknown)}`);
      }
    }
  }

  driftFrom(digest: string): string | undefined {
    const phase = this.phase;
    switch (phase.kind) {
      case "running":
        if (processState(phase.run.pid, phase.run.startTicks) === "gone")
          return "not running: its process is gone";
        return digest === this.digest ? undefined : `running a different definition (pid ${phase.run.pid})`;
      case "waiting":
        return this.withStderr(`not running: failed: ${endingText(phase.ending)}; restarting`);
      case "down":
        // A clean end its policy leaves down (a `never` or `on-failure` service that exited 0) is what was
        // declared, not drift; a failure is, so that it is reported.
        if (!isFailure(phase.ending)) return undefined;
        return this.withStderr(
          `not running: failed: ${endingText(phase.ending)}; restart: ${this.item.restart}`,
        );
      case "refused":
        return `not running: ${phase.reason}`;
      case "starting":
      case "stopping":
      case "released":
        return `not running: ${phase.kind}`;
      default: {
        const unknown: never = phase;
        throw new Error(`unknown phase ${JSON.stringify(unknown)}`);
      }
    }
  }

  /** Stops the service gracefully (its stop signal, then SIGKILL after the grace) and supervises it no more. */
  async stop(): Promise<void> {
    this.stopAsked = true;
    await this.launching;
    const phase = this.phase;
    this.phase = { kind: "stopping" };
    if (phase.kind === "waiting") clearTimeout(phase.timer);
    // What the run before left of its group goes too (a restart waiting on it no longer comes).
    await this.leftovers;
    if (phase.kind === "running") {
      const { stop_signal, stop_grace_ms } = this.stopWith;
      await stopRun(phase.run, stop_signal, stop_grace_ms, this.host.settings.killWaitMs);
      this.host.log.info("service.stopped", { service: this.item.name, pid: phase.run.pid });
    }
  }

  /** Lets go: a pending restart is dropped, a running process keeps running unwatched. */
  release(): void {
    if (this.phase.kind === "waiting") clearTimeout(this.phase.timer);
    this.phase = { kind: "released" };
  }

  rotateLogs(): void {
    if (this.phase.kind !== "running") return;
    for (const stream of ["stdout", "stderr"] as const) {
      try {
        rotateIfFull(join(this.dir, `${stream}.log`), this.host.settings);
      } catch (error) {
        this.host.log.warn("service.log_rotation_failed", {
          service: this.item.name,
          error: errorText(error),
        });
      }
    }
  }

  /** Starts a run, once what the run before left of its process group is stopped. */
  private launch(): Promise<void> {
    this.phase = { kind: "starting" };
    this.launching = this.leftovers
      // Stopped or let go of while the leftovers were stopped: nothing is started.
      .then(() => (this.stopAsked || this.phase.kind === "released" ? undefined : this.spawnRun()))
      .then((run) => {
        // Let go of while it started (the agent is closing): it runs on, recorded, for the next agent to adopt.
        if (run !== undefined && this.phase.kind !== "released") this.follow(run);
      })
      .catch((error: unknown) => {
        const reason = reasonOf(error, this.item.name);
        this.host.log.warn("service.start_failed", { service: this.item.name, reason });
        if (this.phase.kind !== "released") this.phase = { kind: "refused", reason };
      })
      .finally(() => (this.launching = undefined));
    return this.launching;
  }

  private follow(run: Run): void {
    this.phase = { kind: "running", run };
    void run.ended.then((ending) => this.onEnded(run, ending));
  }

  private async spawnRun(): Promise<Run> {
    const item = this.item;
    const [program, ...args] = item.command;
    await checkProgram(program);
    if (item.cwd !== undefined) await checkDirectory(item.cwd);
    const ids = idsFor(item, this.host.settings.accountsRoot);
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    for (const stream of ["stdout", "stderr"] as const)
      rotateIfFull(join(this.dir, `${stream}.log`), this.host.settings);
    const out = openSync(join(this.dir, "stdout.log"), "a", 0o640);
    const err = openSync(join(this.dir, "stderr.log"), "a", 0o640);
    try {
      // Its own session and process group, and no pipe to this agent: it outlives the agent, and a stop reaches
      // everything it started. The log files are handed over directly, so no output waits on the agent.
      const child = spawn(program, args, {
        cwd: item.cwd ?? "/",
        env: { ...item.env, PATH: item.env?.PATH ?? process.env.PATH ?? defaultPath },
        stdio: ["ignore", out, err],
        detached: true,
        ...ids,
      });
      const exited = new Promise<Ending>((resolve) =>
        child.once("exit", (code, signal) =>
          resolve({ code, signal, at: this.host.settings.now().toISOString(), known: true }),
        ),
      );
      await new Promise<void>((resolve, reject) => {
        child.once("spawn", resolve);
        child.once("error", reject);
      });
      child.on("error", (error) =>
        this.host.log.warn("service.process_error", { service: item.name, error: errorText(error) }),
      );
      child.unref();
      const pid = child.pid;
      if (pid === undefined) throw new Refusal(`${program} started without a process id`);
      const found = readProcStat(pid);
      const run = new Run(
        pid,
        found.kind === "found" ? found.startTicks : 0,
        this.host.settings.now().toISOString(),
        false,
      );
      void exited.then((ending) => run.end(ending));
      try {
        this.writeRecord(run);
      } catch (error) {
        // Unrecorded, the next agent would start it a second time: better not to run it at all.
        signalGroup(pid, "SIGKILL");
        throw error;
      }
      this.host.log.info("service.started", { service: item.name, pid, restarts: this.restarts });
      return run;
    } catch (error) {
      if (error instanceof Error && "errno" in error)
        throw new Refusal(`could not start ${program}: ${errorText(error)}`, { cause: error });
      throw error;
    } finally {
      closeSync(out);
      closeSync(err);
    }
  }

  private onEnded(run: Run, ending: Ending): void {
    if (this.phase.kind !== "running" || this.phase.run !== run) return; // stopping, released, or replaced
    const { name, restart } = this.item;
    this.host.log.warn("service.ended", { service: name, pid: run.pid, how: endingText(ending) });
    try {
      this.writeRecord(run, ending);
    } catch (error) {
      this.host.log.error("service.record_failed", { service: name, error: errorText(error) });
    }
    this.leftovers = stopLeftBehind(run, this.stopWith, this.host.settings.killWaitMs, this.host.log, name);
    if (!restartsAfter(restart, ending)) {
      this.phase = { kind: "down", ending };
      return;
    }
    const ranMs = Date.parse(ending.at) - Date.parse(run.startedAt);
    if (ranMs >= this.host.settings.stableAfterMs) this.backoffMs = this.host.settings.backoffInitialMs;
    const pause = this.backoffMs;
    this.backoffMs = Math.min(this.backoffMs * 2, this.host.settings.backoffMaxMs);
    const timer = setTimeout(() => {
      if (this.phase.kind !== "waiting") return;
      this.restarts += 1;
      void this.launch();
    }, pause).unref();
    const until = new Date(this.host.settings.now().getTime() + pause);
    this.phase = { kind: "waiting", ending, until, timer };
  }

  /** How this service is stopped: its signal, and the grace before SIGKILL. */
  private get stopWith(): { stop_signal: StopSignal; stop_grace_ms: number } {
    return {
      stop_signal: this.item.stop_signal ?? "SIGTERM",
      stop_grace_ms: this.item.stop_grace_ms ?? defaultStopGraceMs,
    };
  }

  private writeRecord(run: Run, ended?: Ending): void {
    const record: ServiceRecord = {
      name: this.item.name,
      pid: run.pid,
      start_ticks: run.startTicks,
      boot_id: this.host.bootId,
      digest: this.digest,
      started_at: run.startedAt,
      ...this.stopWith,
      ...(ended === undefined ? {} : { ended }),
    };
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    writePrivateFile(join(this.dir, recordFile), `${JSON.stringify(record, null, 2)}\n`);
  }

  /** `text` and as much of the end of stderr as fits in a reason. */
  private withStderr(text: string): string {
    const head = `${text}; stderr: `;
    const room = reasonMaxBytes - Buffer.byteLength(head);
    const tail = room > 16 ? stderrTail(this.dir, room) : "";
    return boundText(tail === "" ? text : head + tail);
  }
}

/**
 * Stops a service as a unit, its whole process group: `signal` to the group, and the stop is over once every process
 * of it is gone, not only the one that leads it (a child that ignores the signal would otherwise outlive the service,
 * holding its ports and files, reparented and forgotten). Whatever is left when the grace is over is killed.
 */
async function stopRun(run: Run, signal: StopSignal, graceMs: number, killWaitMs: number): Promise<void> {
  // A leader gone (ended, or adopted and no longer there) may have left its group behind: that is stopped the same
  // way, signalled as a group only (its own pid may name another process by now).
  const leaderGone = run.isOver || (run.adopted && processState(run.pid, run.startTicks) === "gone");
  if (leaderGone && leftBehind(run.pid, run.startTicks).length === 0) return;
  signalGroup(run.pid, signal, leaderGone);
  const signalledAt = performance.now();
  const leaderEnded = leaderGone || (await endsWithin(run, graceMs));
  if (leaderEnded && (await groupLeftBy(run.pid, signalledAt + graceMs)).length === 0) return;
  // Its leader may have ended during the grace too (an adopted one is not this agent's child: its pid is free then).
  signalGroup(
    run.pid,
    "SIGKILL",
    leaderGone || run.isOver || processState(run.pid, run.startTicks) === "gone",
  );
  const killedAt = performance.now();
  if (!leaderGone && !(await endsWithin(run, killWaitMs)))
    throw new Refusal(`pid ${run.pid} was still there ${killWaitMs} ms after SIGKILL`);
  // The rest of its group dies of the same SIGKILL, a moment later on a busy machine: the stop is over once it has.
  const left = await groupLeftBy(run.pid, killedAt + killWaitMs);
  if (left.length > 0)
    throw new Refusal(
      `pids ${left.join(", ")} of ${run.pid}'s group were still there ${killWaitMs} ms after SIGKILL`,
    );
}

/**
 * Stops what `run`'s process group holds once its leader ended (`leftBehind`), as a stop would, and says so. Never
 * rejects: a failure is logged, and what waits on it goes on.
 */
async function stopLeftBehind(
  run: Run,
  stopWith: { stop_signal: StopSignal; stop_grace_ms: number },
  killWaitMs: number,
  log: Logger,
  service: string,
): Promise<void> {
  try {
    const left = leftBehind(run.pid, run.startTicks);
    if (left.length === 0) return;
    log.warn("service.left_behind", { service, pid: run.pid, pids: left.slice(0, 10) });
    await stopRun(run, stopWith.stop_signal, stopWith.stop_grace_ms, killWaitMs);
  } catch (error) {
    log.error("service.left_behind_not_stopped", { service, pid: run.pid, error: errorText(error) });
  }
}

/**
 * Waits until process group `group` has no live process, or `deadline` (monotonic ms) passes: what is left then.
 * Looked at often at first (most groups end within milliseconds of their signal), then every 200 ms.
 */
async function groupLeftBy(group: number, deadline: number): Promise<number[]> {
  for (let pauseMs = 10; ; pauseMs = Math.min(pauseMs * 2, 200)) {
    const left = groupMembers(group);
    if (left.length === 0 || performance.now() >= deadline) return left;
    await new Promise((resolve) =>
      setTimeout(resolve, Math.min(pauseMs, Math.max(1, deadline - performance.now()))),
    );
  }
}

/**
 * What is left of the process group a service's process led once that process ended: none when its pid names
 * another process now (the group was gone, and the pid given again). While any process of the group lives, its id
 * is given to no other process.
 */
function leftBehind(pid: number, startTicks: number): number[] {
  const leader = readProcStat(pid);
  if (leader.kind === "found" && leader.startTicks !== startTicks) return [];
  return groupMembers(pid);
}

/** The live (not zombie) processes of process group `group`, as /proc says now. */
function groupMembers(group: number): number[] {
  const members: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let text: string;
    try {
      text = readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch (error) {
      // Ended between the listing and the read.
      if (error instanceof Error && "code" in error && (error.code === "ENOENT" || error.code === "ESRCH"))
        continue;
      throw error;
    }
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    if (Number(fields[2]) === group && fields[0] !== "Z" && fields[0] !== "X") members.push(Number(entry));
  }
  return members;
}

async function endsWithin(run: Run, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  const ended = await Promise.race([run.ended.then(() => true as const), late]);
  clearTimeout(timer);
  return ended;
}

/**
 * Sends `signal` to the process group the service leads; to the process alone when it left that group, unless
 * `groupOnly` (its leader is gone, and its pid may name another process by now).
 */
function signalGroup(pid: number, signal: NodeJS.Signals, groupOnly = false): void {
  for (const target of groupOnly ? [-pid] : [-pid, pid]) {
    try {
      process.kill(target, signal);
      return;
    } catch (error) {
      if (!(error instanceof Error && "code" in error && error.code === "ESRCH")) throw error;
    }
  }
}

type ProcStat = { kind: "found"; state: string; startTicks: number } | { kind: "gone" };

function readProcStat(pid: number): ProcStat {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch (error) {
    if (error instanceof Error && "code" in error && (error.code === "ENOENT" || error.code === "ESRCH"))
      return { kind: "gone" };
    throw error;
  }
  // The command name (field 2) may hold spaces and parentheses, so fields are counted from its closing one.
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  const state = fields[0] ?? "?";
  const startTicks = Number(fields[19]);
  if (!Number.isSafeInteger(startTicks)) throw new Error(`/proc/${pid}/stat has no start time`);
  return { kind: "found", state, startTicks };
}

/**
 * The running process whose command line is exactly the item's argv (and, when the item names a user by id, runs as
 * it), the oldest when several are: what a service whose record was lost still runs as.
 */
function findRunning(item: ServiceItem): { pid: number; startTicks: number } | undefined {
  const wanted = `${item.command.join("\0")}\0`;
  let best: { pid: number; startTicks: number } | undefined;
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    const cmdline = readProc(pid, "cmdline");
    if (cmdline.kind === "gone" || cmdline.text !== wanted) continue;
    if (
      typeof item.user === "number" &&
      !new RegExp(`^Uid:\\s+${item.user}\\s`, "m").test(textOf(readProc(pid, "status")))
    )
      continue;
    const stat = readProcStat(pid);
    if (stat.kind === "gone" || stat.state === "Z" || stat.state === "X") continue;
    if (best === undefined || stat.startTicks < best.startTicks) best = { pid, startTicks: stat.startTicks };
  }
  return best;
}

function textOf(read: { kind: "found"; text: string } | { kind: "gone" }): string {
  return read.kind === "found" ? read.text : "";
}

/** A file of /proc/<pid>, or that the process has gone meanwhile. */
function readProc(pid: number, file: string): { kind: "found"; text: string } | { kind: "gone" } {
  try {
    return { kind: "found", text: readFileSync(`/proc/${pid}/${file}`, "utf8") };
  } catch (error) {
    if (error instanceof Error && "code" in error && (error.code === "ENOENT" || error.code === "ESRCH"))
      return { kind: "gone" };
    throw error;
  }
}

/** "running" only for the very process that was started: same pid, same start time, not a zombie. */
function processState(pid: number, startTicks: number): "running" | "gone" {
  const found = readProcStat(pid);
  if (found.kind === "gone" || found.startTicks !== startTicks) return "gone";
  return found.state === "Z" || found.state === "X" ? "gone" : "running";
}

function readRecord(dir: string): ServiceRecord | undefined {
  const path = join(dir, recordFile);
  if (statSync(path, { throwIfNoEntry: false }) === undefined) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    throw new Refusal(`the service record ${path} cannot be read: ${errorText(error)}`, { cause: error });
  }
  const parsed = recordSchema.safeParse(value);
  // Without its record it cannot tell whether its old process still runs, so it refuses rather than start another.
  if (!parsed.success)
    throw new Refusal(
      `the service record ${path} is damaged (${parsed.error.issues[0]?.message ?? "invalid"}); stop the old process if one runs, then remove the file`,
    );
  return parsed.data;
}

function forgetRecord(dir: string): void {
  const path = join(dir, recordFile);
  if (statSync(path, { throwIfNoEntry: false }) !== undefined) unlinkSync(path);
}

function restartsAfter(policy: RestartPolicy, ending: Ending): boolean {
  switch (policy) {
    case "always":
      return true;
    case "on-failure":
      return isFailure(ending);
    case "never":
      return false;
    default: {
      const unknown: never = policy;
      throw new Error(`unknown restart policy ${String(unknown)}`);
    }
  }
}

/** A non-zero code or a signal; an end nobody saw counts as a failure, since a clean one cannot be shown. */
function isFailure(ending: Ending): boolean {
  return !ending.known || ending.signal !== null || ending.code !== 0;
}

function endingText(ending: Ending): string {
  if (!ending.known) return `ended by ${ending.at}, exit status unknown (this agent did not start it)`;
  if (ending.signal !== null) return `killed by ${ending.signal} at ${ending.at}`;
  return `exited with code ${ending.code ?? "?"} at ${ending.at}`;
}

/** What the process is: its argv, environment, directory and identity. Stop and restart settings are not. */
function definitionDigest(item: ServiceItem): string {
  const env = Object.entries(item.env ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const definition = { command: item.command, env, cwd: item.cwd, user: item.user, group: item.group };
  return `sha256:${createHash("sha256").update(JSON.stringify(definition)).digest("hex")}`;
}

async function checkProgram(program: string): Promise<void> {
  const stats = await stat(program).catch((error: unknown) => {
    throw new Refusal(`program ${program} ${missingReason(error)}`, { cause: error });
  });
  if (!stats.isFile()) throw new Refusal(`program ${program} is not a regular file`);
  await access(program, fsConstants.X_OK).catch((error: unknown) => {
    const mode = (stats.mode & 0o7777).toString(8).padStart(4, "0");
    throw new Refusal(`program ${program} is not executable (mode ${mode})`, { cause: error });
  });
}

async function checkDirectory(cwd: string): Promise<void> {
  const stats = await stat(cwd).catch((error: unknown) => {
    throw new Refusal(`working directory ${cwd} ${missingReason(error)}`, { cause: error });
  });
  if (!stats.isDirectory()) throw new Refusal(`working directory ${cwd} is not a directory`);
}

function missingReason(error: unknown): string {
  const code = error instanceof Error && "code" in error ? error.code : undefined;
  if (code === "ENOENT") return "does not exist";
  if (code === "EACCES") return "cannot be reached: permission denied";
  if (code === "ENOTDIR") return "does not exist (a parent is not a directory)";
  return `cannot be looked at: ${errorText(error)}`;
}

/**
 * The uid and gid to start as. As root: the declared user (its primary group unless a group is declared). As anyone
 * else: only oneself, since switching user needs root.
 */
function idsFor(item: ServiceItem, accountsRoot: string): { uid?: number; gid?: number } {
  if (item.user === undefined && item.group === undefined) return {};
  const users = item.user === undefined ? undefined : readAccounts(join(accountsRoot, "etc", "passwd"));
  const user = item.user === undefined || users === undefined ? undefined : lookUp(users, item.user, "user");
  let gid: number | undefined;
  if (item.group !== undefined)
    gid = lookUp(readAccounts(join(accountsRoot, "etc", "group")), item.group, "group").id;
  else if (user !== undefined) {
    if (user.gid === undefined)
      throw new Refusal(
        `user ${item.user} has no entry in /etc/passwd to take a primary group from; declare the group`,
      );
    gid = user.gid;
  }
  const uid = user?.id;
  const myUid = process.getuid?.();
  const myGid = process.getgid?.();
  if (myUid !== 0) {
    if (uid !== undefined && uid !== myUid)
      throw new Refusal(
        `mesh-host runs as uid ${myUid ?? "?"}, not root, so it cannot start a service as user ${item.user} (uid ${uid})`,
      );
    if (item.group !== undefined && gid !== myGid)
      throw new Refusal(
        `mesh-host runs as uid ${myUid ?? "?"}, not root, so it cannot start a service in group ${item.group} (gid ${gid})`,
      );
    return {};
  }
  return { ...(uid === undefined ? {} : { uid }), ...(gid === undefined ? {} : { gid }) };
}

type Account = { name: string; id: number; gid?: number };

function readAccounts(path: string): Account[] {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new Refusal(`cannot read ${path} to look up accounts: ${errorText(error)}`, { cause: error });
  }
  return text.split("\n").flatMap((line): Account[] => {
    const [name, , id, gid] = line.split(":");
    if (name === undefined || name === "" || id === undefined || !/^\d+$/.test(id)) return [];
    return [
      { name, id: Number(id), ...(gid !== undefined && /^\d+$/.test(gid) ? { gid: Number(gid) } : {}) },
    ];
  });
}

function lookUp(accounts: Account[], wanted: string | number, what: "user" | "group"): Account {
  const found = accounts.find((account) =>
    typeof wanted === "number" ? account.id === wanted : account.name === wanted,
  );
  if (found !== undefined) return found;
  // A numeric id needs no entry to be used; a name does.
  if (typeof wanted === "number") return { name: String(wanted), id: wanted };
  throw new Refusal(`no ${what} named ${wanted} in /etc/${what === "user" ? "passwd" : "group"}`);
}

/**
 * Rotates a log file the service writes to by copy and truncate: the service holds the file open (in append mode)
 * and may outlive this agent, so the file cannot be renamed from under it. A few lines written between the copy and
 * the truncation can be lost; that is the price of not piping output through the agent.
 */
function rotateIfFull(path: string, settings: Pick<Settings, "logMaxBytes" | "logKeep">): void {
  const size = statSync(path, { throwIfNoEntry: false })?.size;
  if (size === undefined || size < settings.logMaxBytes) return;
  for (let index = settings.logKeep - 1; index >= 1; index -= 1) {
    const older = `${path}.${index}`;
    if (statSync(older, { throwIfNoEntry: false }) !== undefined) renameSync(older, `${path}.${index + 1}`);
  }
  if (settings.logKeep > 0) copyFileSync(path, `${path}.1`);
  truncateSync(path, 0);
}

/** The last lines of the service's stderr, at most `maxBytes` of UTF-8 (the current file, else the rotated one). */
function stderrTail(dir: string, maxBytes: number): string {
  for (const name of ["stderr.log", "stderr.log.1"]) {
    const path = join(dir, name);
    const size = statSync(path, { throwIfNoEntry: false })?.size ?? 0;
    if (size === 0) continue;
    const length = Math.min(size, maxBytes);
    const buffer = Buffer.alloc(length);
    const fd = openSync(path, "r");
    try {
      readSync(fd, buffer, 0, length, size - length);
    } finally {
      closeSync(fd);
    }
    // Cut at a line start when one is near, and never inside a character.
    let text = buffer.toString("utf8").replace(/^\uFFFD+/, "");
    const newline = text.indexOf("\n");
    if (length < size && newline >= 0 && newline < text.length - 1) text = text.slice(newline + 1);
    return text.trimEnd().split("\n").join(" | ");
  }
  return "";
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;
}

function serviceItems(items: readonly DeclaredItem[]): ServiceItem[] {
  return items.filter((item): item is ServiceItem => item.type === "service");
}

function reasonOf(error: unknown, name: string): string {
  if (error instanceof Refusal) return error.message;
  return `service ${name}: ${errorText(error)}`;
}
