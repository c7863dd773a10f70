/**
 * The fault suite: each fault done to a mesh under a running lab fleet, and what it cost. Per fault, on a settled
 * mesh: a declaration goes out (so reports are in flight when the fault begins), the fault, then
 *   (a) the time from the fault's end until every node is here again, heard from since the end;
 *   (b) no report lost: every declaration kept has its node's applied report kept, each node's kept reports run
 *       without a gap, and no report waits for its receipt;
 *   (c) no false out-of-touch: `node.out_of_touch` in the control plane's log, and nodes read out of touch from
 *       the store while it lasted, both zero (the threshold is shorter than the pauses);
 *   (d) a declaration made after recovery: the time until every lab node holds it;
 * and the control plane ends no more often than the fault demands (a store or broker outage pauses it).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { scratchDatabase } from "../test/support/postgres.js";
import type { ScratchDatabase } from "../test/support/postgres.js";
import { rabbitApiUrl, scratchVhost } from "../test/support/rabbit.js";
import type { ScratchVhost } from "../test/support/rabbit.js";
import type { ChaosOptions, FaultName } from "./args.js";
import type { Fault, MeshKind } from "./faults.js";
import { faults, meshKinds } from "./faults.js";
import type { LabSummary } from "./fleet.js";
import { Fleet, sleep } from "./fleet.js";
import { CuttableProxy } from "./proxy.js";

export interface FaultResult {
  fault: FaultName;
  what: string;
  mesh: MeshKind;
  nodes: number;
  pause_ms: number;
  /** From the fault's end until every node was here and heard from since the end. */
  all_here_s: number | null;
  /** From the fault's end until every node held the declaration sent just before the fault. */
  in_flight_declaration_s: number | null;
  /** From `mesh declare --all` after recovery until every lab node held it. */
  convergence_s: number | null;
  declare_attempts: number | null;
  reports_lost: number | null;
  reports_lost_examples: string[];
  /** `node.out_of_touch` lines the control plane logged from the fault's start to the end of the checks. */
  false_out_of_touch: number | null;
  /** Nodes read out of touch from the store (as `mesh node list` reads them) in the same time. */
  out_of_touch_seen: string[];
  /** Declarations the lab's nodes refused in the same time (counted, not a failure in itself). */
  refusals: number | null;
  /** How many times each event was logged by `mesh up` and its control plane in the same time. */
  events: Record<string, number>;
  notes: Record<string, unknown>;
  failures: string[];
}

export async function runChaos(options: ChaosOptions, say: (line: string) => void): Promise<FaultResult[]> {
  const results: FaultResult[] = [];
  for (const kind of meshKinds) {
    const wanted = options.faults.map((name) => faults[name]).filter((fault) => fault.mesh === kind);
    if (wanted.length === 0) continue;
    results.push(...(await onMesh(kind, wanted, options, say)));
  }
  return results;
}

/** Starts the mesh a group of faults needs, does each fault to it in turn, and takes it all down again. */
async function onMesh(
  kind: MeshKind,
  wanted: readonly Fault[],
  options: ChaosOptions,
  say: (line: string) => void,
): Promise<FaultResult[]> {
  const dir = mkdtempSync(join(tmpdir(), `mesh-chaos-${kind}-`));
  const results: FaultResult[] = [];
  let database: ScratchDatabase | undefined;
  let vhost: ScratchVhost | undefined;
  let proxy: CuttableProxy | undefined;
  let fleet: Fleet | undefined;
  say(
    `— ${kind}: mesh up${meshWords(kind)}, ${options.nodes} lab nodes; faults ${wanted.map((f) => f.name).join(", ")}`,
  );
  try {
    const base = {
      dir,
      nodes: options.nodes,
      outOfTouchAfterMs: options.outOfTouchAfterMs,
      aliveEveryMs: options.aliveEveryMs,
      deadlineMs: options.deadlineMs,
      say,
    };
    switch (kind) {
      case "nats":
        fleet = new Fleet(base);
        break;
      case "postgres": {
        database = await scratchDatabase();
        const direct = new URL(database.url);
        proxy = new CuttableProxy({ host: direct.hostname, port: Number(direct.port || 5432) });
        await proxy.listen();
        const proxied = new URL(database.url);
        proxied.port = String(proxy.port);
        fleet = new Fleet({ ...base, store: database.url, controlStore: proxied.toString() });
        break;
      }
      case "rabbitmq":
        await enoughDescriptors(options.nodes);
        vhost = await scratchVhost();
        fleet = new Fleet({ ...base, broker: vhost.url });
        break;
      default: {
        const unknown: never = kind;
        throw new Error(`no mesh of kind ${String(unknown)}`);
      }
    }
    await fleet.start();
    for (const fault of wanted) {
      say(`· ${fault.name}: ${fault.what}`);
      const result = await tryFault(fleet, fault, options, proxy, say);
      say(
        `  ${fault.name}: ${result.failures.length === 0 ? "passed" : `FAILED (${result.failures.join("; ")})`}`,
      );
      results.push(result);
    }
  } catch (error) {
    const message = `the ${kind} mesh could not run: ${(error as Error).message}`;
    say(message);
    for (const fault of wanted.slice(results.length)) results.push(emptyResult(fault, options, [message]));
  } finally {
    await fleet?.stop();
    await proxy?.close();
    await database?.drop();
    await vhost?.drop();
    if (!options.keep && results.every((result) => result.failures.length === 0))
      rmSync(dir, { recursive: true, force: true });
    else say(`the ${kind} mesh's logs are kept in ${dir}`);
  }
  return results;
}

function meshWords(kind: MeshKind): string {
  switch (kind) {
    case "nats":
      return " (own nats-server, SQLite)";
    case "postgres":
      return " (own nats-server, PostgreSQL through a proxy)";
    case "rabbitmq":
      return " --broker amqp://… (a vhost of its own, SQLite)";
    default: {
      const unknown: never = kind;
      return unknown;
    }
  }
}

function emptyResult(fault: Fault, options: ChaosOptions, failures: string[]): FaultResult {
  return {
    fault: fault.name,
    what: fault.what,
    mesh: fault.mesh,
    nodes: options.nodes,
    pause_ms: options.pauseMs[fault.name],
    all_here_s: null,
    in_flight_declaration_s: null,
    convergence_s: null,
    declare_attempts: null,
    reports_lost: null,
    reports_lost_examples: [],
    false_out_of_touch: null,
    out_of_touch_seen: [],
    refusals: null,
    events: {},
    notes: {},
    failures,
  };
}

/** One fault with its measurements; a step that fails is a failure of this fault, and the next fault still runs. */
async function tryFault(
  fleet: Fleet,
  fault: Fault,
  options: ChaosOptions,
  proxy: CuttableProxy | undefined,
  say: (line: string) => void,
): Promise<FaultResult> {
  const result = emptyResult(fault, options, []);
  const seconds = (ms: number) => Math.round(ms / 100) / 10;
  const N = options.nodes;
  const holds = (order: { epoch: number; sequence: number }) => (s: LabSummary) =>
    s.latest !== null &&
    s.latest.epoch === order.epoch &&
    s.latest.sequence === order.sequence &&
    s.latest.nodes === N;

  // Settled: every node runs, holds the newest declaration, waits for no receipt, and is heard now.
  const before = await fleet.waitForLab(
    "the fleet to settle before the fault",
    (s) => s.running === N && s.reporting === N && (s.latest === null || s.latest.nodes === N),
  );
  await fleet.waitForLiveness(
    "every node to be heard before the fault",
    (r) => r.heardSince === N,
    Date.now(),
  );

  const mark = fleet.mark();
  const watch = watchOutOfTouch(fleet);
  let endedAt: number | undefined;
  try {
    const inFlight = await fleet.declareAll(`${fault.name}: sent just before the fault`);
    const done = await fault.inject({ fleet, proxy, pauseMs: options.pauseMs[fault.name], say });
    endedAt = done.endedAt;
    result.notes = { ...done.notes, fault_lasted_ms: done.endedAt - done.startedAt };

    const here = await fleet.waitForLiveness(
      "every node to be here again, heard from since the fault ended",
      (r) => r.here === N && r.heardSince === N,
      done.endedAt,
    );
    result.all_here_s = seconds(here.at - done.endedAt);
    say(`  every node here again ${result.all_here_s} s after the fault ended`);

    await fleet.waitForLab("the declaration sent before the fault to reach every node", holds(inFlight));
    result.in_flight_declaration_s = seconds(Date.now() - done.endedAt);

    const declaredAt = Date.now();
    const after = await fleet.declareAll(`${fault.name}: sent after recovery`);
    result.declare_attempts = after.attempts;
    if (after.errors.length > 0) result.notes.declare_errors = after.errors.slice(0, 3);
    await fleet.waitForLab("the declaration made after recovery to reach every node", holds(after));
    result.convergence_s = seconds(Date.now() - declaredAt);
    say(`  the declaration after recovery held by every node in ${result.convergence_s} s`);

    const settled = await fleet.waitForLab(
      "every report to have its receipt",
      (s) => s.reporting === s.running && s.running === N,
    );
    result.refusals = settled.refused - before.refused;
    const lost = await reportsLost(fleet);
    result.reports_lost = lost.lost;
    result.reports_lost_examples = lost.examples;
    if (lost.lost > 0) result.failures.push(`${lost.lost} report(s) lost: ${lost.examples.join("; ")}`);
  } catch (error) {
    result.failures.push((error as Error).message);
  } finally {
    const seen = await watch.stop();
    result.out_of_touch_seen = seen.nodes;
    if (seen.error !== undefined) result.notes.liveness_read_failed = seen.error;
    const lines = fleet.linesSince(mark, "node.out_of_touch");
    result.false_out_of_touch = lines.length;
    result.events = fleet.eventCounts(mark);
    // Why a supervised process ended is worth reading beside the counts: a crash is not a pause.
    const ends = [...fleet.linesSince(mark, "control.ended"), ...fleet.linesSince(mark, "broker.ended")];
    if (ends.length > 0)
      result.notes.ended = ends.slice(0, 5).map((line) => `${line.event}: ${String(line.fields.reason)}`);
    const controlEnds = fleet.linesSince(mark, "control.ended").length;
    if (fault.controlMayEnd !== undefined && controlEnds > fault.controlMayEnd)
      result.failures.push(
        `the control plane ended ${controlEnds} time(s), at most ${fault.controlMayEnd} expected ` +
          `(${String(fleet.linesSince(mark, "control.ended")[0]?.fields.reason)}; see mesh-up.log)`,
      );
    if (lines.length > 0) {
      const first = lines[0];
      const when =
        first === undefined || endedAt === undefined
          ? ""
          : `, the first ${seconds(first.readAt - endedAt)} s after the fault ended`;
      result.failures.push(`${lines.length} node.out_of_touch line(s) logged${when}`);
    }
    if (seen.nodes.length > 0)
      result.failures.push(
        `${seen.nodes.length} node(s) read out of touch: ${seen.nodes.slice(0, 5).join(", ")}`,
      );
    const stopped = fleet.labStatus()?.stopped ?? [];
    if (stopped.length > 0)
      result.failures.push(
        `${stopped.length} lab node(s) stopped: ${stopped[0]?.node ?? ""} ${stopped[0]?.error ?? ""}`,
      );
  }
  return result;
}

/**
 * Reads every node's liveness once a second until stopped, as `mesh node list` would show it: the nodes ever read
 * out of touch. A failed read (the store busy) is kept and the watch goes on.
 */
function watchOutOfTouch(fleet: Fleet): { stop(): Promise<{ nodes: string[]; error?: string }> } {
  const nodes = new Set<string>();
  let error: string | undefined;
  let stopping = false;
  const watching = (async () => {
    while (!stopping) {
      try {
        for (const node of (await fleet.liveness()).outOfTouch) nodes.add(node);
      } catch (failure) {
        error ??= (failure as Error).message;
      }
      await sleep(1000);
    }
  })();
  return {
    stop: async () => {
      stopping = true;
      await watching;
      return { nodes: [...nodes].sort(), ...(error === undefined ? {} : { error }) };
    },
  };
}

/**
 * Reports lost, node by node, from the store: a kept declaration without its node's applied report, or a gap in the
 * node's kept report sequence (each report a node makes takes the next number, so a gap is a report never kept).
 */
async function reportsLost(fleet: Fleet): Promise<{ lost: number; examples: string[] }> {
  const store = fleet.openedStore();
  let lost = 0;
  const examples: string[] = [];
  for (const node of await store.nodes.namesIn("enrolled")) {
    const [declarations, accounts] = await Promise.all([
      store.declarations.history(node),
      store.accounts.history(node),
    ]);
    const applied = new Set(
      accounts.filter((a) => a.outcome === "applied").map((a) => `${a.epoch}/${a.sequence}`),
    );
    const unreported = declarations.filter((d) => !applied.has(`${d.epoch}/${d.sequence}`));
    const sequences = [
      ...new Set(accounts.flatMap((a) => (a.reportSequence === null ? [] : [a.reportSequence]))),
    ].sort((a, b) => a - b);
    const lowest = sequences[0] ?? 1;
    const highest = sequences.at(-1) ?? 0;
    // Each node's history is bounded; a full one starts wherever its trim left it.
    const trimmed = accounts.length >= fleet.historyLimit;
    const gaps = highest - (trimmed ? lowest : 1) + 1 - sequences.length;
    const missing = Math.max(unreported.length, gaps);
    if (missing === 0) continue;
    lost += missing;
    if (examples.length < 5) {
      const without = unreported.map((d) => `${d.epoch}/${d.sequence}`).join(", ");
      examples.push(
        `${node}: report sequences ${sequences.join(",")}` +
          (without === "" ? "" : `; no applied report for ${without}`),
      );
    }
  }
  return { lost, examples };
}

/**
 * RabbitMQ here starts with ~1,024 file descriptors, and one out of them breaks for everyone on it: each lab node
 * holds a connection of its own there (lab nodes share connections on NATS only), so a fleet too large is refused.
 */
async function enoughDescriptors(nodes: number): Promise<void> {
  const api = new URL(rabbitApiUrl);
  const authorization = `Basic ${Buffer.from(`${decodeURIComponent(api.username)}:${decodeURIComponent(api.password)}`).toString("base64")}`;
  const response = await fetch(`${api.origin}/api/nodes`, { headers: { authorization } });
  const [node] = (await response.json()) as Array<{ fd_total?: number; fd_used?: number }>;
  const free = (node?.fd_total ?? 0) - (node?.fd_used ?? 0);
  if (free < nodes + 200)
    throw new Error(
      `RabbitMQ has ${free} free file descriptors and ${nodes} lab nodes need a connection each, with room to spare: ` +
        "run rabbitmq-stop with fewer --nodes",
    );
}
