/**
 * The mesh a fault is tried on: `mesh up` (its own nats-server, or the control plane alone on RabbitMQ), a
 * `mesh lab` fleet on it, the store read the way `mesh node list` reads it, and `mesh` commands run as an operator
 * runs them. Every wait here is event-driven (a log line, a lab summary) or a cheap poll, with a deadline that only
 * guards against a hang: on a busy machine the figures stretch, the checks do not.
 */
import { execFileSync, spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { createWriteStream, writeFileSync } from "node:fs";
import { join } from "node:path";
import { formatDuration } from "../src/config/duration.js";
import { compileMeshOptions } from "../src/config/options.js";
import { livenessOf } from "../src/control/liveness.js";
import type { Store } from "../src/store/index.js";
import { openStore } from "../src/store/index.js";
import { root, runMesh } from "../bench/mesh.js";

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** One line `mesh up` (or its control plane) logged, with when this process read it. */
export interface LogLine {
  readAt: number;
  event: string;
  fields: Record<string, unknown>;
}

/** The lab's JSON summary (`mesh lab --json`, event `lab.summary`). */
export interface LabSummary {
  nodes: number;
  joined: number;
  running: number;
  applied: number;
  latest: { epoch: number; sequence: number; nodes: number } | null;
  reporting: number;
  refused: number;
  reportsSent: number;
  stopped: { node: string; error: string }[];
}

export interface FleetSettings {
  /** Where this mesh keeps its data dir and logs. */
  dir: string;
  nodes: number;
  outOfTouchAfterMs: number;
  aliveEveryMs: number;
  deadlineMs: number;
  /** `mesh up --broker URL` (RabbitMQ); otherwise the mesh's own nats-server. */
  broker?: string;
  /** The store the control plane is given (through the proxy, say). */
  controlStore?: string;
  /** The same store as the suite and its commands reach it (directly): they read while the control plane cannot. */
  store?: string;
  say: (line: string) => void;
}

/** Liveness of the whole fleet at one moment, judged as `mesh node list` judges it. */
export interface FleetLiveness {
  at: number;
  here: number;
  /** Here, and heard from after the given moment. */
  heardSince: number;
  outOfTouch: string[];
  total: number;
}

export class Fleet {
  readonly data: string;
  private readonly lines: LogLine[] = [];
  private up: ChildProcess | undefined;
  private upExit: Promise<void> = Promise.resolve();
  private lab: ChildProcess | undefined;
  private labExit: Promise<void> = Promise.resolve();
  private labOut = "";
  private summary: LabSummary | undefined;
  private summaryWaiters: Array<() => void> = [];
  private lineWaiters: Array<() => void> = [];
  private store: Store | undefined;
  private declarations = 0;
  /** How many accounts the store keeps per node. */
  historyLimit = 0;

  constructor(private readonly settings: FleetSettings) {
    this.data = join(settings.dir, "data");
  }

  /** The global flags every command on this mesh is given. */
  private get globals(): string[] {
    return this.settings.store === undefined ? [] : ["--store", this.settings.store];
  }

  get upPid(): number {
    return this.up?.pid ?? 0;
  }

  /** Starts `mesh up` and waits for its control plane to act; then the lab, and waits until every node runs. */
  async start(): Promise<void> {
    const { settings } = this;
    const where =
      settings.broker === undefined ? ["up", "--nats-port", "0"] : ["up", "--broker", settings.broker];
    const store = settings.controlStore === undefined ? [] : ["--store", settings.controlStore];
    const threshold = ["--out-of-touch-after", formatDuration(settings.outOfTouchAfterMs)];
    const log = createWriteStream(join(settings.dir, "mesh-up.log"));
    const up = spawn(
      process.execPath,
      [`${root}bin/mesh.js`, "--data", this.data, ...store, ...threshold, ...where],
      {
        env: { ...process.env, MESH_HOME: "" },
        stdio: ["ignore", "ignore", "pipe"],
      },
    );
    this.up = up;
    this.upExit = new Promise((resolve) => up.once("exit", () => resolve()));
    let partial = "";
    up.stderr?.on("data", (chunk: Buffer) => {
      log.write(chunk);
      const text = partial + chunk.toString("utf8");
      const complete = text.split("\n");
      partial = complete.pop() ?? "";
      for (const line of complete) this.take(line);
    });
    await this.waitForLine("the control plane to act", (line) => line.event === "control.serving");
    settings.say(`mesh up is acting (pid ${up.pid ?? "?"})`);
    const options = compileMeshOptions({ dataDir: this.data, flags: { store: settings.store }, env: {} });
    this.store = await openStore(options.storeUrl, { historyLimit: options.historyLimit });
    this.historyLimit = options.historyLimit;
    await this.startLab();
  }

  private async startLab(): Promise<void> {
    const { settings } = this;
    const args = [
      `${root}bin/mesh.js`,
      "--data",
      this.data,
      ...this.globals,
      "lab",
      "--nodes",
      String(settings.nodes),
      "--json",
      "--alive-every",
      formatDuration(settings.aliveEveryMs),
      "--summary-every",
      "500ms",
      // Pure-JS nkey signing makes many simultaneous connects outlast the server's authentication timeout.
      "--join-concurrency",
      "20",
      "--join-timeout",
      formatDuration(settings.deadlineMs),
    ];
    const log = createWriteStream(join(settings.dir, "mesh-lab.log"));
    const lab = spawn(process.execPath, args, {
      env: { ...process.env, MESH_HOME: "" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.lab = lab;
    this.labExit = new Promise((resolve) => lab.once("exit", () => resolve()));
    lab.stderr?.on("data", (chunk: Buffer) => log.write(chunk));
    let partial = "";
    lab.stdout?.on("data", (chunk: Buffer) => {
      log.write(chunk);
      const text = partial + chunk.toString("utf8");
      const complete = text.split("\n");
      partial = complete.pop() ?? "";
      for (const line of complete) this.takeLab(line);
    });
    const started = Date.now();
    const ready = await this.waitForLab(
      "every lab node to join and run",
      (s) => s.running === settings.nodes,
    );
    settings.say(
      `lab: ${ready.running} nodes running, joined in ${((Date.now() - started) / 1000).toFixed(1)} s`,
    );
  }

  private take(text: string): void {
    if (!text.startsWith("{")) return;
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (error) {
      // A line cut by a process killed mid-write: kept in the log file, not counted.
      this.settings.say(`an unreadable log line (${(error as Error).message}): ${text.slice(0, 200)}`);
      return;
    }
    if (typeof parsed !== "object" || parsed === null) return;
    const { event, ...fields } = parsed as { event?: unknown };
    if (typeof event !== "string") return;
    this.lines.push({ readAt: Date.now(), event, fields });
    for (const wake of this.lineWaiters.splice(0)) wake();
  }

  private takeLab(text: string): void {
    if (!text.startsWith("{")) return;
    let parsed: { event?: string } & LabSummary;
    try {
      parsed = JSON.parse(text) as { event?: string } & LabSummary;
    } catch (error) {
      this.settings.say(`an unreadable lab line (${(error as Error).message}): ${text.slice(0, 200)}`);
      return;
    }
    if (parsed.event === "lab.joined") {
      const joined = parsed as unknown as { joined: number; failed: number };
      if (joined.failed > 0) this.settings.say(`lab: ${joined.failed} node(s) could not join`);
    }
    if (parsed.event !== "lab.summary" && parsed.event !== "lab.stopped") return;
    this.summary = parsed;
    for (const wake of this.summaryWaiters.splice(0)) wake();
  }

  /** Where the log stands now: count from here with `linesSince`. */
  mark(): number {
    return this.lines.length;
  }

  linesSince(mark: number, event?: string): LogLine[] {
    return this.lines.slice(mark).filter((line) => event === undefined || line.event === event);
  }

  /** How many times each event was logged since the mark. */
  eventCounts(mark: number): Record<string, number> {
    const counts: Record<string, number> = {};
    for (const line of this.lines.slice(mark)) counts[line.event] = (counts[line.event] ?? 0) + 1;
    return counts;
  }

  async waitForLine(what: string, check: (line: LogLine) => boolean, from = 0): Promise<LogLine> {
    return this.until(what, () => this.lines.slice(from).find(check), this.lineWaiters);
  }

  /** The lab's newest summary once it satisfies `check` (at once if it does already). */
  async waitForLab(what: string, check: (summary: LabSummary) => boolean): Promise<LabSummary> {
    return this.until(
      what,
      () => (this.summary !== undefined && check(this.summary) ? this.summary : undefined),
      this.summaryWaiters,
    );
  }

  labStatus(): LabSummary | undefined {
    return this.summary;
  }

  private async until<T>(what: string, found: () => T | undefined, waiters: Array<() => void>): Promise<T> {
    const deadline = Date.now() + this.settings.deadlineMs;
    for (;;) {
      const value = found();
      if (value !== undefined) return value;
      const ended = this.ended();
      if (ended !== undefined) throw new Error(`waiting for ${what}: ${ended}`);
      if (Date.now() > deadline)
        throw new Error(`${what} did not happen within ${formatDuration(this.settings.deadlineMs)}`);
      // Woken by the next line or summary, or after a while to look at the deadline and the processes.
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 1000);
        waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Why the run cannot go on: `mesh up` or the lab ended. */
  private ended(): string | undefined {
    for (const [name, child] of [
      ["mesh up", this.up],
      ["mesh lab", this.lab],
    ] as const) {
      if (child !== undefined && (child.exitCode !== null || child.signalCode !== null))
        return `${name} exited (${child.exitCode ?? child.signalCode}); its log is in ${this.settings.dir}`;
    }
    return undefined;
  }

  /** Every node's liveness now, read from the store and judged with `mesh node list`'s own function. */
  async liveness(heardAfter = 0): Promise<FleetLiveness> {
    const store = this.openedStore();
    const now = new Date();
    const [nodes, hearing] = await Promise.all([store.nodes.list(), store.hearing.read()]);
    let here = 0;
    let heardSince = 0;
    const outOfTouch: string[] = [];
    for (const node of nodes) {
      const reading = livenessOf(node.lastSeen, now, this.settings.outOfTouchAfterMs, hearing);
      if (reading.liveness === "out_of_touch") outOfTouch.push(node.name);
      if (reading.liveness !== "here") continue;
      here++;
      if (node.lastSeen !== null && Date.parse(node.lastSeen) > heardAfter) heardSince++;
    }
    return { at: now.getTime(), here, heardSince, outOfTouch, total: nodes.length };
  }

  /** Polls liveness until `check` holds; returns the reading that did. */
  async waitForLiveness(
    what: string,
    check: (reading: FleetLiveness) => boolean,
    heardAfter = 0,
  ): Promise<FleetLiveness> {
    const deadline = Date.now() + this.settings.deadlineMs;
    for (;;) {
      const reading = await this.liveness(heardAfter);
      if (check(reading)) return reading;
      const ended = this.ended();
      if (ended !== undefined) throw new Error(`waiting for ${what}: ${ended}`);
      if (Date.now() > deadline)
        throw new Error(
          `${what} did not happen within ${formatDuration(this.settings.deadlineMs)} ` +
            `(${reading.here}/${reading.total} here, ${reading.heardSince} heard since the fault ended)`,
        );
      await sleep(250);
    }
  }

  openedStore(): Store {
    if (this.store === undefined) throw new Error("the fleet has not started");
    return this.store;
  }

  /** `mesh …` on this mesh, as an operator runs it. */
  mesh(args: readonly string[]): Promise<string> {
    return runMesh(this.data, [...this.globals, ...args]);
  }

  /**
   * `mesh declare --all` of a file of its own (so each declaration is new), tried again while it fails — while the
   * mesh recovers, a command may find no controller to act under, and an operator tries again. Returns the
   * (epoch, sequence) every node was sent, and how many attempts it took.
   */
  async declareAll(
    tag: string,
  ): Promise<{ epoch: number; sequence: number; attempts: number; errors: string[] }> {
    const file = join(this.settings.dir, `declaration-${++this.declarations}.json`);
    writeFileSync(file, JSON.stringify({ files: [{ path: "/etc/chaos", content: `${tag}\n` }] }));
    const deadline = Date.now() + this.settings.deadlineMs;
    const errors: string[] = [];
    for (let attempts = 1; ; attempts++) {
      try {
        const sent = JSON.parse(await this.mesh(["declare", "--all", "-f", file, "--json"])) as Array<{
          node: string;
          epoch: number;
          sequence: number;
        }>;
        const [first] = sent;
        if (first === undefined) throw new Error("mesh declare --all declared to no node");
        const mixed = sent.find((one) => one.epoch !== first.epoch || one.sequence !== first.sequence);
        // Every node of a fresh mesh got every declaration: one order for all, as the lab's summary counts them.
        if (mixed !== undefined)
          throw new Error(
            `nodes were sent different orders: ${first.node} ${first.epoch}/${first.sequence}, ` +
              `${mixed.node} ${mixed.epoch}/${mixed.sequence}`,
          );
        if (sent.length !== this.settings.nodes)
          throw new Error(`declared to ${sent.length} nodes, not ${this.settings.nodes}`);
        return { epoch: first.epoch, sequence: first.sequence, attempts, errors };
      } catch (error) {
        const message = (error as Error).message.split("\n").slice(0, 2).join(" ");
        errors.push(message);
        if (Date.now() > deadline) throw new Error(`mesh declare --all: ${message}`, { cause: error });
        this.settings.say(`declare attempt ${attempts} failed, trying again: ${message.slice(0, 300)}`);
        await sleep(1000);
      }
    }
  }

  /** The nats-server `mesh up` runs (its config file is in the data dir), or undefined when none runs. */
  brokerPid(): number | undefined {
    return pids(["-f", join(this.data, "nats", "server", "nats-server.conf")])[0];
  }

  /** The control plane `mesh up` runs as its child, or undefined while none runs. */
  controlPid(): number | undefined {
    return pids(["-P", String(this.upPid), "-f", "serve --under-up"])[0];
  }

  async stop(): Promise<void> {
    const stopping = async (child: ChildProcess | undefined, exited: Promise<void>) => {
      if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
      await exited;
      clearTimeout(timer);
    };
    await stopping(this.lab, this.labExit);
    await stopping(this.up, this.upExit);
    await this.store?.close();
  }
}

/** Process ids `pgrep` finds (none: an empty list; pgrep says so with exit code 1). */
function pids(args: readonly string[]): number[] {
  try {
    return execFileSync("pgrep", args, { encoding: "utf8" })
      .split("\n")
      .filter((line) => line.trim() !== "")
      .map(Number);
  } catch (error) {
    if ((error as { status?: number }).status === 1) return [];
    throw error;
  }
}
