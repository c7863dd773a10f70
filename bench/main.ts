/**
 * `npm run bench`: the control plane's figures, each beside a baseline measured in the same run, in one table,
 * and the same figures as JSON under bench/results/. It runs this process, the simulated fleet's, with a young
 * generation of 64 MiB (`--max-semi-space-size=64`) and `gc()` at hand (`--expose-gc`, before each held round): see
 * the README's benchmarks.
 *
 *   npm run bench -- [--nodes 1000] [--broker nats|amqp]
 *                    [--only enrolment,steady,fanout,convergence,plan,ingest,failover]
 *                    [--steady-window 60] [--alive-every 15] [--reports-per-node 19] [--ingest-trials 3, 7 on amqp]
 *                    [--ingest-order node|turns]
 *                    [--join-concurrency N]
 *                    [--plan-fleet 10000] [--trials N --ttl 15s --renew 5s --margin 3s] [--profile]
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { PerformanceObserver } from "node:perf_hooks";
import { freePort, openIdentities } from "../src/bus/index.js";
import { parseDuration } from "../src/config/duration.js";
import { compileMeshOptions } from "../src/config/options.js";
import type { SentDeclaration } from "../src/control/declarations.js";
import { loadOrCreateSigningKey } from "../src/keys/index.js";
import type { JoinOutcome } from "../src/lab/lab.js";
import { Lab } from "../src/lab/lab.js";
import { percentile, spread } from "../src/lab/figures.js";
import type { DeclaredItem } from "../src/link/index.js";
import { declarationEncoder, emptyDigest, encodeMessage, itemsDigest } from "../src/link/index.js";
import { createLogger, errorText } from "../src/log.js";
import { openStore } from "../src/store/index.js";
import type { BenchOptions, IngestOrder } from "./args.js";
import { benchParts, BenchUsageError, parseBenchArgs } from "./args.js";
import { runFailover } from "./failover.js";
import { handleInterrupts, interrupted, once, stopWhenInterrupted } from "./interrupt.js";
import type { ServeProcess } from "./mesh.js";
import type { RoundCpu } from "./mesh.js";
import {
  brokerCpuSeconds,
  cpuSeconds,
  cpuSince,
  cpuText,
  root,
  roundCpu,
  roundCpuTotal,
  roundFloorMs,
  rssMiB,
  runMesh,
  runMeshTimed,
  startServe,
} from "./mesh.js";
import type { BenchBroker, Drained } from "./broker.js";
import { startBenchBroker, warmUpShare } from "./broker.js";
import { outlookFigures, planMeshFigures, rolloutCpuFigure } from "./plan-figures.js";
import { signingRate } from "./signing.js";
import type { Rollout } from "./plan-mesh.js";
import { benchPlanOnMesh, rolloutOf } from "./plan-mesh.js";
import { benchProfileSets, median as medianOf, planDeclarationBytes, timeOutlook } from "./plan.js";
import type { Figure } from "./table.js";
import { formatFigureTable } from "./table.js";
import { sleep, waitFor, waitForAsync } from "./wait.js";

const say = (line: string) => process.stderr.write(`${line}\n`);

/**
 * How long serve's lease is while the ingest part runs: it is stopped (SIGSTOP) while a backlog is sent, and
 * must still hold the lease when it is let go. The seed's 15 s would lapse while 10,000 nodes' backlog is sent.
 */
const drainLeaseTtl = "300s";

/**
 * In how many turns the broker's own work of the joins and the mesh's joins alternate (RabbitMQ), a share of the
 * fleet each. With one turn each, the broker alone went first on a broker just started, and the mesh met one already
 * worn by a thousand accounts and queues made and deleted.
 */
const enrolmentTurns = 4;

/**
 * How long serve may be stopped for the ingest part's warm drain. On NATS the consumer's ack wait is 30 s: what
 * serve was handed just before it stopped is handed again after that, and counted twice. On RabbitMQ serve's
 * connection beats every 10 s and the broker closes it after two missed beats. The stop is kept well inside each.
 */
const warmStopAtMostMs = { nats: 20_000, amqp: 12_000 } as const;

/** How long the broker may be waited for to come to rest before a drain. */
const restAtMostMs = 5_000;
/** How long a held round waits at most for the round before it to settle (`machineAtRest`). */
const heldRestAtMostMs = 15_000;

/** Milliseconds this process (the simulated fleet) has spent paused in garbage collection since it started. */
let fleetGcMs = 0;
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) fleetGcMs += entry.duration;
}).observe({ entryTypes: ["gc"] });

/** What the fleet is declared in the fan-out rounds, as the control plane composes it. */
const benchItems: DeclaredItem[] = [
  {
    type: "file",
    id: "file:/etc/bench",
    path: "/etc/bench",
    content: "declared by the benchmark, round 1\n",
  },
];

handleInterrupts(say);

let options: BenchOptions;
try {
  options = parseBenchArgs(process.argv.slice(2));
} catch (error) {
  if (!(error instanceof BenchUsageError)) throw error;
  process.stderr.write(`bench: ${error.message}\n`);
  process.exit(2);
}

const figures: Figure[] = [];
/** The broker's name and version, once it runs. */
let brokerVersion = "not started";
const extra: Record<string, unknown> = {};
/** What the plan part found unequal that must be equal: printed loudly, and the run exits 1. */
const planMismatches: string[] = [];
const has = (part: BenchOptions["parts"][number]) => options.parts.includes(part);
const meshParts = options.parts.filter((part) => part !== "failover");
/**
 * `mesh declare` waits until the acting control plane has sent what it wrote, 10 s by default; a roll-out to 9,800
 * nodes on RabbitMQ takes longer (the broker's persistent publishing bounds it), so the bench gives it the time.
 */
const declareTimeout = ["--timeout", "300s"];

if (has("plan")) {
  // In this process before anything else runs, so its CPU is allot's and compose's alone.
  const timing = timeOutlook(options.planFleet, 7);
  const shown = outlookFigures(timing);
  say(shown.line);
  extra.plan_outlook = shown.json;
  figures.push(...shown.figures);
}

/** Why the run stopped part-way, if it did: the figures measured before are still printed and written. */
let failure: string | undefined;
if (meshParts.length > 0) {
  try {
    await benchMesh();
  } catch (error) {
    failure = error instanceof Error ? error.message : String(error);
    extra.failure = failure;
    say(`the run failed part-way (${failure}); the figures measured before it are kept`);
  }
}
// An interrupted run starts nothing more.
if (has("failover") && interrupted() === undefined) {
  const f = options.failover;
  say(`failover: ${f.trials} trial(s), lease ${f.ttl}/${f.renew}/${f.margin}`);
  const times = await runFailover({ ...f, log: say });
  // The failover part runs on a nats-server of its own: named when no other part named the broker.
  if (meshParts.length === 0) brokerVersion = times.broker;
  const s = spread(times.killToActMs);
  const fromExpiry = spread(times.expiryToActMs);
  const leaseLeft = spread(times.killToExpiryMs);
  extra.failover = {
    ...f,
    times_ms: times.killToActMs,
    expiry_to_act_ms: times.expiryToActMs,
    kill_to_expiry_ms: times.killToExpiryMs,
  };
  if (s !== undefined) {
    const note = f.shortened
      ? `${f.trials} trials, lease ${f.ttl}/${f.renew}/${f.margin} (shortened inside the table; --only failover runs 10 on 15s/5s/3s)`
      : `${f.trials} trials, lease ${f.ttl}/${f.renew}/${f.margin}`;
    const ttlMs = parseDuration(f.ttl, "--ttl");
    figures.push(
      {
        part: "failover",
        what: "kill -9 → next acting, p50",
        value: s.p50,
        unit: "ms",
        baseline: { value: ttlMs, what: "lease TTL" },
        ...(leaseLeft === undefined
          ? {}
          : { limit: { value: leaseLeft.p50, what: "the lease's life left, p50" } }),
        note,
      },
      {
        part: "failover",
        what: "kill -9 → next acting, max",
        value: s.max,
        unit: "ms",
        baseline: { value: ttlMs, what: "lease TTL" },
        ...(leaseLeft === undefined
          ? {}
          : { limit: { value: leaseLeft.max, what: "the lease's life left, max" } }),
      },
    );
  }
  if (fromExpiry !== undefined) {
    // From the moment the killed holder's last renewal expired (the broker's time of writing + the life the holder
    // wrote) to the next holder's `control.serving`: what the takeover itself costs, whatever the lease's TTL.
    figures.push(
      {
        part: "failover",
        what: "lease expiry → next acting, p50",
        value: fromExpiry.p50,
        unit: "ms",
        target: "≤ 250 ms",
      },
      {
        part: "failover",
        what: "lease expiry → next acting, max",
        value: fromExpiry.max,
        unit: "ms",
        target: "≤ 1 s",
      },
    );
  }
}

if (interrupted() !== undefined) {
  // The signal's handler is stopping what the run started, and exits when it has: a cut-short run writes no results.
  await new Promise<never>(() => undefined);
}

// In the table's order of parts, whenever each was measured.
const partOrder = (part: string) => (benchParts as readonly string[]).indexOf(part);
figures.sort((a, b) => partOrder(a.part) - partOrder(b.part));
const table = formatFigureTable(figures);
const result = {
  benchmark: "mesh",
  commit: execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd: root, encoding: "utf8" }).trim(),
  dirty:
    // Other runs' results are not the code measured: runs one after another are judged by the code alone.
    execFileSync("git", ["status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"], {
      cwd: root,
      encoding: "utf8",
    }).trim() !== "",
  date: new Date().toISOString(),
  node: process.version,
  // The flags this process (the simulated fleet's) ran with: `npm run bench` gives its young generation 64 MiB.
  fleet_node_flags: process.execArgv.filter((flag) => flag !== "--import" && flag !== "tsx"),
  broker: brokerVersion,
  cores: cpus().length,
  cpu_model: cpus()[0]?.model ?? "unknown",
  nodes: options.nodes,
  parts: options.parts,
  figures,
  ...extra,
};
const out = join(root, "bench", "results");
mkdirSync(out, { recursive: true });
// One current file per configuration (broker, fleet size, parts), replaced by each run of it: results are figures of
// the code as it is, not a history (git keeps that).
const defaultParts = parseBenchArgs(["--broker", options.broker]).parts;
const partsNamed =
  options.parts.length === defaultParts.length && options.parts.every((part) => defaultParts.includes(part))
    ? ""
    : `-${options.parts.join("+")}`;
// A backlog sent in turns is another configuration: its file stands beside the one sent node by node.
const orderNamed = options.parts.includes("ingest") && options.ingestOrder === "turns" ? "-turns" : "";
const file = join(out, `bench-${options.broker}-${options.nodes}${partsNamed}${orderNamed}.json`);
writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
process.stdout.write(
  `mesh bench, ${options.nodes} nodes — commit ${result.commit}${result.dirty ? " (with local changes)" : ""}, ` +
    `${result.node}, ${result.broker}, ${result.cores} cores\n\n${table}\nfigures written to ${file}\n`,
);
if (failure !== undefined) {
  process.stderr.write(`bench: the run failed part-way: ${failure}\n`);
  process.exitCode = 1;
}
if (planMismatches.length > 0) {
  process.stderr.write(`bench: plan: ${planMismatches.length} MISMATCH(ES):\n`);
  for (const mismatch of planMismatches) process.stderr.write(`  ${mismatch}\n`);
  process.exitCode = 1;
}

async function benchMesh(): Promise<void> {
  const N = options.nodes;
  const dir = mkdtempSync(join(tmpdir(), "mesh-bench-"));
  const data = join(dir, "data");
  const profileDir = options.profile ? join(root, "bench", "results", "profiles") : undefined;
  const broker = await startBenchBroker(options.broker, data, dir, N);
  brokerVersion = broker.version;
  // A broker restarted with more file descriptors than the machine gives it is a condition of these figures.
  if (broker.fdLimitRaised !== undefined) extra.rabbitmq_fd_limit_raised_for_the_run = broker.fdLimitRaised;
  const stopBroker = once(() => broker.stop());
  let serve: ServeProcess = startServe(data, broker.url, profileDir);
  /** The plan part's second control plane, until it has taken over from `serve`. */
  let standby: ServeProcess | undefined;
  // Interrupted: the processes and the broker; the lab's connections and the store end with this process.
  const unname = stopWhenInterrupted(async () => {
    await standby?.stop();
    await serve.stop();
    await stopBroker();
    rmSync(dir, { recursive: true, force: true });
  });
  await serve.serving;
  const meshOptions = compileMeshOptions({ dataDir: data, flags: {}, env: {} });
  const store = await openStore(meshOptions.storeUrl, { historyLimit: meshOptions.historyLimit });
  const signing = loadOrCreateSigningKey(join(data, "keys"));
  // The physical limit of a fan-out: one core's Ed25519 signing rate over the bytes of a declaration such as the
  // rounds below send, measured here while nothing else of the bench runs.
  const signedBytes = declarationEncoder(
    benchItems,
    itemsDigest(benchItems),
  )({
    node: "bench-00001",
    epoch: 1,
    sequence: 1,
    issued_at: new Date().toISOString(),
  });
  const oneCoreSigning = signingRate(signedBytes, signing.privateKey);
  say(
    `signing: ${oneCoreSigning.toFixed(0)} Ed25519 signatures/s on one core (${signedBytes.byteLength} bytes)`,
  );
  extra.signing_rate_one_core = oneCoreSigning;
  const signingLimit = { value: oneCoreSigning, what: "Ed25519 signing, one core" };
  const log = createLogger({ level: "warn" });

  // Convergence is timed by each node: its declaration applied, then the control plane's receipt for its report.
  const appliedNodes = new Set<string>();
  const converged = new Map<string, number>();
  const lab = new Lab({
    nodes: N,
    prefix: "bench",
    aliveEveryMs: options.aliveEveryMs,
    // RabbitMQ checks each message's user against its connection's: there every node has a connection of its own.
    connections: options.broker === "nats" ? "shared" : "own",
    groupSize: 20,
    joinConcurrency: options.joinConcurrency,
    joinTimeoutMs: 300_000,
    dataDir: data,
    // Varied profiles only when the plan part runs: the other parts' figures stay those of a uniform fleet.
    ...(has("plan") ? { profiles: benchProfileSets() } : {}),
    log,
    onEvent: (node, event) => {
      if (event.kind === "applied") appliedNodes.add(node);
      else if (event.verdict === "kept" && appliedNodes.has(node) && !converged.has(node))
        converged.set(node, performance.now());
    },
  });
  /** What stopped the run, if anything did: said with whatever stopping the parts met after it, never hidden by it. */
  let failed: { error: unknown } | undefined;
  try {
    // Enrolment: tokens issued beforehand (as `mesh token issue` does), then every node joins at once.
    const identities = openIdentities(data, { url: broker.url });
    let started = performance.now();
    const tokens = await lab.issueTokens(store, identities, signing.fingerprint, 3_600_000);
    await identities.close();
    say(`issued ${N} tokens in ${((performance.now() - started) / 1000).toFixed(1)} s`);
    if (has("enrolment")) {
      // Baseline: the broker's share of a join — each token's identity connecting (as the mesh connects) and
      // leaving, as many at once. RabbitMQ also makes an account and a queue per join: there the baseline is all of
      // the broker's work for each join, done with the client libraries alone.
      started = performance.now();
      await mapLimit([...tokens.values()], options.joinConcurrency, (token) => broker.connectAndLeave(token));
      const connectMs = performance.now() - started;
      // Where the broker does more for a join (RabbitMQ), its own work and the mesh's joins take turns, a share of
      // the fleet at a time: a broker's state drifts over a run (accounts and queues made and deleted, its memory),
      // and neither side should meet only the fresher or only the more worn broker.
      const turns = broker.joinAlone === undefined ? 1 : enrolmentTurns;
      const all = [...tokens].map(([node, token], index) => ({ node, token, index }));
      let aloneMs: number | undefined;
      let brokerAloneMs: number | null = broker.joinAlone === undefined ? null : 0;
      let totalMs = 0;
      let brokerJoinsMs: number | null = 0;
      let joinersMs = 0;
      let serveJoinsMs = 0;
      const joins: JoinOutcome[] = [];
      for (let turn = 0; turn < turns; turn++) {
        const share = all.slice(
          Math.floor((turn * all.length) / turns),
          Math.floor(((turn + 1) * all.length) / turns),
        );
        if (broker.joinAlone !== undefined) {
          const alone = broker.joinAlone;
          const brokerBefore = brokerCpu(broker.pid);
          started = performance.now();
          await mapLimit(share, options.joinConcurrency, (one) => alone.one(one.token, one.index));
          aloneMs = (aloneMs ?? 0) + (performance.now() - started);
          const brokerMs = cpuMsSince(brokerBefore, brokerCpu(broker.pid));
          brokerAloneMs = brokerMs === null || brokerAloneMs === null ? null : brokerAloneMs + brokerMs;
          await alone.clear(share.map((one) => one.index));
        }
        const brokerBefore = brokerCpu(broker.pid);
        const serveBefore = cpuSeconds(serve.pid);
        const ownBefore = process.cpuUsage();
        started = performance.now();
        joins.push(...(await lab.join(new Map(share.map((one) => [one.node, one.token])))));
        totalMs += performance.now() - started;
        const brokerMs = cpuMsSince(brokerBefore, brokerCpu(broker.pid));
        brokerJoinsMs = brokerMs === null || brokerJoinsMs === null ? null : brokerJoinsMs + brokerMs;
        const own = process.cpuUsage(ownBefore);
        joinersMs += (own.user + own.system) / 1000;
        serveJoinsMs += (cpuSeconds(serve.pid) - serveBefore) * 1000;
      }
      if (aloneMs !== undefined) {
        say(
          `the broker alone: ${N} joins' worth of its work in ${(aloneMs / 1000).toFixed(1)} s, in ${turns} turns`,
        );
      }
      const failed = joins.filter((j) => j.error !== undefined);
      const per = spread(joins.filter((j) => j.error === undefined).map((j) => j.ms));
      say(
        `enrolment: ${joins.length - failed.length}/${N} joined in ${(totalMs / 1000).toFixed(1)} s; CPU: ` +
          `serve ${serveJoinsMs.toFixed(0)} ms, the broker ${brokerJoinsMs?.toFixed(0) ?? "?"} ms, ` +
          `the joining machines (this process) ${joinersMs.toFixed(0)} ms` +
          (aloneMs === undefined ? "" : ` (the broker alone: ${brokerAloneMs?.toFixed(0) ?? "?"} ms)`),
      );
      extra.enrolment = {
        failed: failed.length,
        first_errors: failed.slice(0, 3),
        connect_baseline_ms: connectMs,
        serve_cpu_ms: serveJoinsMs,
        joiners_cpu_ms: joinersMs,
        broker_cpu_ms: brokerJoinsMs,
        broker_alone_cpu_ms: brokerAloneMs,
        ...(aloneMs === undefined ? {} : { broker_alone_ms: aloneMs }),
      };
      const note =
        `${options.joinConcurrency} at once` +
        (turns > 1 ? `; taking turns with the broker alone, ${turns} turns` : "") +
        (failed.length > 0 ? `; ${failed.length} failed` : "");
      figures.push({
        part: "enrolment",
        what: `${N} joins, total`,
        value: totalMs / 1000,
        unit: "s",
        baseline:
          aloneMs === undefined
            ? { value: connectMs / 1000, what: "token identities connect+close" }
            : { value: aloneMs / 1000, what: "the broker's work of each join, without the mesh" },
        target: N === 1000 ? "≤ 10 s" : "",
        note,
      });
      if (per !== undefined) {
        figures.push(
          { part: "enrolment", what: "per join, p50", value: per.p50, unit: "ms" },
          { part: "enrolment", what: "per join, p99", value: per.p99, unit: "ms" },
        );
      }
    } else {
      await lab.join(tokens);
    }
    await lab.start();
    say(`lab running: ${lab.status().running} nodes`);

    if (has("steady")) {
      // Let every node's alive cycle come round once before the window opens.
      await sleep(options.aliveEveryMs + 2000);
      const before = cpuSeconds(serve.pid);
      await sleep(options.steadyMs);
      const share = (cpuSeconds(serve.pid) - before) / (options.steadyMs / 1000);
      const rss = rssMiB(serve.pid);
      say(`steady: ${(share * 100).toFixed(1)} % of a core, ${rss.toFixed(0)} MiB`);
      figures.push(
        {
          part: "steady",
          what: `serve CPU, ${N} nodes alive every ${options.aliveEveryMs / 1000} s`,
          value: share * 100,
          unit: "% of a core",
          baseline: { value: 10, what: "target for 10,000 nodes" },
          note: `over ${options.steadyMs / 1000} s from /proc/<pid>/stat`,
        },
        { part: "steady", what: "serve RSS", value: rss, unit: "MiB" },
      );
    }

    const sent = new Map<string, SentDeclaration>();
    // The ingest part alone (`--only ingest`) sends no declaration first: its nodes hold nothing and report so.
    if (has("fanout") || has("convergence")) {
      const files = [{ path: "/etc/bench", content: "declared by the benchmark\n" }];
      const declarationFile = join(dir, "bench-declaration.json");
      writeFileSync(declarationFile, JSON.stringify({ files }));
      const nodes = lab.names;
      // As an operator does it: `mesh declare --all` in a process of its own, timed from its start (loading
      // included) to its exit; convergence is timed from the same start.
      // Baseline: the same command declaring to one node, so the process's own start is seen apart.
      const first = nodes[0] ?? "";
      // A path of its own: `mesh declare <node>` keeps a pin for that node beside the fleet's, and the two may not
      // declare one item differently (the rounds below change /etc/bench's content each time).
      const oneFile = join(dir, "bench-declaration-one.json");
      writeFileSync(
        oneFile,
        JSON.stringify({ files: [{ path: "/etc/bench-one", content: "declared by the benchmark\n" }] }),
      );
      let startedAt = performance.now();
      const one = await runMeshTimed(data, ["declare", first, "-f", oneFile, "--json", ...declareTimeout]);
      const oneMs = one.endedAt - startedAt;
      // A minute, and more for a larger fleet: its first node may be among the last to settle in after joining.
      await waitFor(() => converged.has(first), 60_000 + nodes.length * 10);
      converged.delete(first);
      appliedNodes.delete(first);
      // The fleet is declared to several times (the machine is shared and noisy), each time something new; the
      // round with the median slowest node is the one shown, and the worst round is shown beside it.
      // Counted once: the lab's status reads every node's state, which at 10,000 nodes is work enough to slow the
      // very fleet being timed if it were asked every 20 ms.
      const running = lab.status().running;
      if (profileDir !== undefined) {
        // Profiled apart: a profiled round is slower, and would be the worst one.
        await runMesh(
          data,
          ["declare", "--all", "-f", declarationFile, "--json", ...declareTimeout],
          profileDir,
        );
        await waitFor(() => converged.size >= running, 300_000);
      }
      const rounds: {
        fanoutMs: number;
        converged: NonNullable<ReturnType<typeof spread>>;
        cpu: RoundCpu;
        rollout: Rollout | undefined;
      }[] = [];
      for (let round = 1; round <= options.rounds; round++) {
        writeFileSync(
          declarationFile,
          JSON.stringify({
            files: [{ path: "/etc/bench", content: `declared by the benchmark, round ${round}\n` }],
          }),
        );
        converged.clear();
        appliedNodes.clear();
        const cpuBefore = roundCpu(serve.pid, broker.pid);
        startedAt = performance.now();
        const all = await runMeshTimed(data, [
          "declare",
          "--all",
          "-f",
          declarationFile,
          "--json",
          ...declareTimeout,
        ]);
        const fanoutMs = all.endedAt - startedAt;
        await waitFor(() => converged.size >= running, 300_000);
        const cpu = cpuSince(cpuBefore, roundCpu(serve.pid, broker.pid));
        const c = spread([...converged.values()].map((t) => t - startedAt));
        if (c === undefined) throw new Error(`round ${round}: no node converged`);
        const rollout = rolloutOf(serve.stderr(), await store.plans.newest());
        say(
          `round ${round}: \`mesh declare --all\` ${fanoutMs.toFixed(0)} ms, slowest node ${c.max.toFixed(0)} ms; ` +
            `CPU ${cpuText(cpu)}` +
            (rollout === undefined
              ? ""
              : `; serve's roll-out ${rollout.ms} ms (compose ${rollout.composeMs}, send ${rollout.sendMs}), ` +
                `${rollout.cpuMs} ms of CPU`),
        );
        rounds.push({ fanoutMs, converged: c, cpu, rollout });
      }
      // The same roll-out sent to a held fleet (`Lab.hold`): its nodes read, verify and apply it only once it has
      // ended, so the roll-out has this machine's cores as it would beside a fleet of real machines. Convergence is
      // not timed in these rounds; each ends with the whole fleet holding what it was sent.
      const heldRollouts: Rollout[] = [];
      const heldSigning: number[] = [];
      /** How long each held round waited for the machine to come to rest (`machineAtRest`). */
      const heldRested: number[] = [];
      /** Each party's CPU from the command's start to serve's log of the roll-out, the fleet held throughout. */
      const heldCpu: RoundCpu[] = [];
      if (has("fanout")) {
        for (let round = 1; round <= options.rounds; round++) {
          writeFileSync(
            declarationFile,
            JSON.stringify({
              files: [{ path: "/etc/bench", content: `declared by the benchmark, held round ${round}\n` }],
            }),
          );
          converged.clear();
          appliedNodes.clear();
          heldRested.push(await machineAtRest(serve.pid, broker.pid));
          // The signing limit again, just before: this machine's speed drifts over a run (other guests share it).
          heldSigning.push(signingRate(signedBytes, signing.privateKey, 500));
          const cpuBefore = roundCpu(serve.pid, broker.pid);
          const gcBefore = fleetGcMs;
          lab.hold();
          let rollout: Rollout | undefined;
          let cpu: RoundCpu | undefined;
          try {
            await runMesh(data, ["declare", "--all", "-f", declarationFile, "--json", ...declareTimeout]);
            const revision = await store.plans.newest();
            await waitFor(() => (rollout = rolloutOf(serve.stderr(), revision)) !== undefined, 300_000);
            cpu = cpuSince(cpuBefore, roundCpu(serve.pid, broker.pid));
          } finally {
            lab.release();
          }
          const gcMs = fleetGcMs - gcBefore;
          await waitFor(() => converged.size >= running, 300_000);
          if (rollout === undefined || cpu === undefined)
            throw new Error(`held round ${round}: serve logged no roll-out`);
          say(
            `held round ${round}: serve's roll-out ${rollout.ms} ms (compose ${rollout.composeMs}, send ` +
              `${rollout.sendMs}), ${rollout.cpuMs} ms of CPU; signing just before ` +
              `${(heldSigning.at(-1) ?? 0).toFixed(0)}/s on one core; CPU while held ${cpuText(cpu)}, the fleet's ` +
              `process paused ${gcMs.toFixed(0)} ms of it collecting; the machine came to rest before it in ` +
              `${(heldRested.at(-1) ?? 0).toFixed(0)} ms`,
          );
          heldRollouts.push(rollout);
          heldCpu.push(cpu);
        }
      }
      const byMax = [...rounds].sort((x, y) => x.converged.max - y.converged.max);
      const median = byMax[Math.floor((byMax.length - 1) / 2)] ?? byMax[0];
      const worst = byMax.at(-1);
      if (median === undefined || worst === undefined) throw new Error("no round was run");
      const fanoutMs = median.fanoutMs;
      extra.rounds = rounds.map((r) => ({
        fanout_ms: r.fanoutMs,
        convergence_ms: r.converged,
        cpu_s: r.cpu,
        rollout: r.rollout ?? null,
      }));
      if (heldRollouts.length > 0) {
        extra.held_rollouts = heldRollouts;
        extra.held_rested_ms = heldRested;
        extra.signing_rate_beside_held_rounds = heldSigning;
        extra.cpu_s_while_held = heldCpu;
      }
      const rolloutRates = rounds
        .flatMap((r) => (r.rollout === undefined ? [] : [r.rollout.sent / (r.rollout.ms / 1000)]))
        .sort((a, b) => a - b);
      const rolloutRate = rolloutRates[Math.floor((rolloutRates.length - 1) / 2)];
      const rolloutCpuRates = rounds
        .flatMap((r) =>
          r.rollout === undefined ? [] : [r.rollout.sent / (Math.max(r.rollout.cpuMs, 1) / 1000)],
        )
        .sort((a, b) => a - b);
      const rolloutCpuRate = rolloutCpuRates[Math.floor((rolloutCpuRates.length - 1) / 2)];
      for (const node of nodes) {
        const latest = await store.declarations.latest(node);
        if (latest !== undefined) sent.set(node, latest);
      }
      {
        // Baseline: the same number of envelopes of the same size, published raw by the same client library.
        const envelope = (await store.declarations.latest(nodes[0] ?? ""))?.envelope ?? "";
        const rawMs = await broker.publishRaw(nodes.length, new TextEncoder().encode(envelope));
        say(
          `fan-out: ${nodes.length} declarations in ${fanoutMs.toFixed(0)} ms; converged ${median.converged.count}`,
        );
        if (has("fanout")) {
          // What the command adds for each further node: its whole run less its run for one node.
          const marginalMs = Math.max(fanoutMs - oneMs, 1);
          const rawPublish = {
            value: nodes.length / (rawMs / 1000),
            what: "raw publish, same bytes, to each node's own queue",
          };
          if (rolloutRate !== undefined) {
            figures.push({
              part: "fanout",
              what: "`mesh declare --all`'s roll-out: declarations composed, signed, recorded, sent",
              value: rolloutRate,
              unit: "/s",
              baseline: rawPublish,
              limit: signingLimit,
              target: "≥ 0.5×",
              note: `median of ${rolloutRates.length} round(s), as \`mesh serve\` logged each (plan.rolled_out)`,
            });
          }
          if (rolloutCpuRate !== undefined) {
            const which = `median of ${rolloutCpuRates.length} round(s)`;
            figures.push(rolloutCpuFigure("fanout", rolloutCpuRate, signingLimit, which));
          }
          if (heldRollouts.length > 0) {
            const heldLimit = {
              value: medianOf(heldSigning),
              what: "Ed25519 signing, one core, beside each",
            };
            const heldRate = medianOf(heldRollouts.map((r) => r.sent / (r.ms / 1000)));
            figures.push({
              part: "fanout",
              what: "the same roll-out to a held fleet (its nodes verify and apply after it)",
              value: heldRate,
              unit: "/s",
              baseline: rawPublish,
              limit: heldLimit,
              target: "≥ 0.5×",
              note:
                `median of ${heldRollouts.length} round(s), the simulated fleet not sharing the cores meanwhile; ` +
                "the limit measured just before each, their median",
            });
            figures.push(
              rolloutCpuFigure(
                "fanout",
                medianOf(heldRollouts.map((r) => r.sent / (Math.max(r.cpuMs, 1) / 1000))),
                heldLimit,
                `the held rounds, median of ${heldRollouts.length}`,
              ),
            );
          }
          figures.push(
            {
              part: "fanout",
              what: "the same from the command's side: each further node",
              value: (nodes.length - 1) / (marginalMs / 1000),
              unit: "/s",
              baseline: rawPublish,
              limit: signingLimit,
              note: "`mesh declare --all` less `mesh declare <one node>`",
            },
            {
              part: "fanout",
              what: `\`mesh declare --all\` to ${nodes.length} nodes, start to exit`,
              value: fanoutMs,
              unit: "ms",
              baseline: { value: oneMs, what: "the same to one node" },
            },
          );
          extra.fanout = { all_ms: fanoutMs, one_ms: oneMs, raw_publish_ms: rawMs };
        }
        if (has("convergence")) {
          const c = median.converged;
          // The round's floor: the simulated fleet and the broker share these cores with the mesh, and what they use
          // of them is time no control plane could give back.
          const floorOf = (cpu: RoundCpu) => {
            const floorMs = roundFloorMs(cpu, cpus().length);
            return floorMs === undefined
              ? {}
              : {
                  limit: {
                    value: floorMs,
                    what: `the simulated fleet's and the broker's CPU in the round over the ${cpus().length} cores`,
                  },
                };
          };
          const note = `${c.count}/${running} nodes; the median of ${rounds.length} round(s)`;
          figures.push(
            {
              part: "convergence",
              what: "declare → applied and kept, p50",
              value: c.p50,
              unit: "ms",
              baseline: { value: fanoutMs, what: "`mesh declare --all` exits" },
              note,
            },
            {
              part: "convergence",
              what: "declare → applied and kept, p99",
              value: c.p99,
              unit: "ms",
              baseline: { value: fanoutMs, what: "`mesh declare --all` exits" },
            },
            {
              part: "convergence",
              what: "declare → applied and kept, max",
              value: c.max,
              unit: "ms",
              baseline: { value: fanoutMs, what: "`mesh declare --all` exits" },
              ...floorOf(median.cpu),
              target: N >= 10_000 ? "≤ 1.5 s" : "",
            },
            {
              part: "convergence",
              what: `declare → applied and kept, max, worst of ${rounds.length} round(s)`,
              value: worst.converged.max,
              unit: "ms",
              baseline: { value: worst.fanoutMs, what: "`mesh declare --all` exits" },
              ...floorOf(worst.cpu),
              target: N >= 10_000 ? "≤ 5 s" : "",
            },
            {
              part: "convergence",
              what: "CPU of the median round: the mesh, the simulated fleet, the broker",
              value: roundCpuTotal(median.cpu),
              unit: "s",
              baseline: {
                value: (median.converged.max / 1000) * cpus().length,
                what: `the cores' time until the slowest node (${cpus().length} cores)`,
              },
              note: cpuText(median.cpu),
            },
          );
        }
      }
    }

    if (has("plan")) {
      // The plan's limit: one core's signing rate over a declaration of the plan's (the median in length), not over
      // `mesh declare --all`'s, which is several times shorter.
      const planBytes = planDeclarationBytes(lab.names);
      const planSigning = signingRate(planBytes, signing.privateKey);
      say(
        `signing: ${planSigning.toFixed(0)} Ed25519 signatures/s on one core (${planBytes.byteLength} bytes, the plan's)`,
      );
      extra.plan_signing = { rate: planSigning, bytes: planBytes.byteLength };
      const planSigningLimit = {
        value: planSigning,
        what: `Ed25519 signing, one core, ${planBytes.byteLength}-byte declarations`,
      };
      /** Each party's CPU while the fleet was held for a roll-out of the plan (its apply's whole run). */
      const planHeldCpu: RoundCpu[] = [];
      let heldSince: RoundCpu | undefined;
      let heldGcSince = 0;
      const measured = await benchPlanOnMesh({
        data,
        dir,
        store,
        names: lab.names,
        running: () => lab.runningNodes(),
        applied: appliedNodes,
        converged,
        serve,
        startStandby: () => (standby = startServe(data, broker.url, profileDir)),
        settleMs: options.aliveEveryMs + 2000,
        rounds: options.rounds,
        held: {
          hold: () => {
            heldSince = roundCpu(serve.pid, broker.pid);
            heldGcSince = fleetGcMs;
            lab.hold();
          },
          release: () => {
            // Let go first, whatever the reading below meets (it runs where the apply's own failure is told).
            lab.release();
            const since = heldSince;
            heldSince = undefined;
            if (since === undefined) return;
            let cpu: RoundCpu;
            try {
              cpu = cpuSince(since, roundCpu(serve.pid, broker.pid));
            } catch (error) {
              say(`plan: CPU while the fleet was held not read: ${errorText(error)}`);
              return;
            }
            planHeldCpu.push(cpu);
            say(
              `plan: CPU while the fleet was held ${cpuText(cpu)}, the fleet's process paused ` +
                `${(fleetGcMs - heldGcSince).toFixed(0)} ms of it collecting`,
            );
          },
          atRest: () => machineAtRest(serve.pid, broker.pid),
          signingRate: () => signingRate(planBytes, signing.privateKey, 500),
          signedBytes: planBytes.byteLength,
        },
        say,
      });
      if (standby !== undefined) {
        serve = standby;
        standby = undefined;
      }
      planMismatches.push(...measured.mismatches);
      const shown = planMeshFigures(measured, N, planSigningLimit);
      extra.plan = shown.json;
      extra.plan_cpu_s_while_held = planHeldCpu;
      figures.push(...shown.figures);
      // The ingest backlog is sent as the nodes holding what they hold now.
      for (const node of lab.names) {
        const latest = await store.declarations.latest(node);
        if (latest !== undefined) sent.set(node, latest);
      }
    }

    if (has("ingest")) {
      // The same backlog drained by a plain consumer of the same client library and by serve (parsed, checked,
      // ordered, stored, receipted), in turns: the broker's speed at a drain swings by twice from one to the next
      // (RabbitMQ's most), so each is drained `ingestTrials` times and the medians compared.
      // The simulated fleet stops first: the receipts serve sends would otherwise land on agents sharing these
      // cores, work the raw consumer is never given. Its nodes' identities stay, and the backlog is sent as them.
      await lab.stop();
      const R = options.reportsPerNode;
      const trials: IngestTrial[] = [];
      for (let trial = 0; trial < options.ingestTrials; trial++) {
        await serve.stop();
        // Each backlog's reports follow the last one's, as a node's next reports would.
        const sequences = (trial * 3 + 1) * 1_000_000;
        await preload(broker, lab, sent, R, sequences, options.ingestOrder);
        const rested = [await brokerAtRest(broker.pid)];
        // The raw consumer runs in this process, which does nothing else meanwhile: its CPU is the consumer's.
        const rawCpuBefore = process.cpuUsage();
        const brokerBeforeRaw = brokerCpu(broker.pid);
        const raw = await broker.drainRaw();
        const rawCpu = process.cpuUsage(rawCpuBefore);
        const brokerRawMs = cpuMsSince(brokerBeforeRaw, brokerCpu(broker.pid));
        const rawCpuMs = (rawCpu.user + rawCpu.system) / 1000;
        await preload(broker, lab, sent, R, sequences + 1_000_000, options.ingestOrder);
        rested.push(await brokerAtRest(broker.pid));
        const pending = await broker.queued();
        const metricsAddress = `127.0.0.1:${await freePort()}`;
        // A lease long enough to be stopped through the third backlog's sending (below) and act again at once.
        serve = startServe(data, broker.url, profileDir, metricsAddress, { MESH_LEASE_TTL: drainLeaseTtl });
        await serve.serving;
        // First as a serve just started meets a backlog (a restart, a takeover): its code and caches cold, where the
        // raw consumer's client has run the lab in this process.
        const fresh = await measureServeDrain(serve, broker, metricsAddress, pending, {
          handled: 0,
          receipts: 0,
        });
        // Then as a serve that has been running meets one, as the raw consumer's warm client did.
        const warm = await drainWarm(
          serve,
          broker,
          lab,
          sent,
          R,
          metricsAddress,
          sequences + 2_000_000,
          options.ingestOrder,
        );
        const told = (what: string, drained: MeasuredDrain) =>
          `${what} ${drained.messages} in ${drained.ms.toFixed(0)} ms (${drained.cpuMs.toFixed(0)} ms of CPU, ` +
          `the broker's ${drained.brokerCpuMs?.toFixed(0) ?? "?"}; ${drained.receipts} receipts sent), steady ` +
          `${drainRate(drained.steady).toFixed(0)} msg/s`;
        say(
          `ingest, trial ${trial + 1} of ${options.ingestTrials}: ` +
            `${"drained" in warm ? told("serve running", warm.drained) : `no warm drain (${warm.unusable})`}; ` +
            `${told("serve just started", fresh)}; raw ${raw.messages} in ${raw.ms.toFixed(0)} ms, steady ` +
            `${drainRate(raw.steady).toFixed(0)} msg/s (${rawCpuMs.toFixed(0)} ms of CPU, the broker's ` +
            `${brokerRawMs?.toFixed(0) ?? "?"})` +
            (warm.stoppedMs === undefined ? "" : `; serve was stopped ${warm.stoppedMs.toFixed(0)} ms`) +
            `; the broker came to rest before each drain in ${[...rested, warm.restedMs ?? 0]
              .map((ms) => ms.toFixed(0))
              .join(", ")} ms`,
        );
        trials.push({
          ...serveDrainRecord(pending, fresh),
          warm:
            "drained" in warm
              ? { ...serveDrainRecord(warm.backlog, warm.drained), serve_stopped_ms: warm.stoppedMs }
              : { unusable: warm.unusable, serve_stopped_ms: warm.stoppedMs ?? null },
          raw_messages: raw.messages,
          raw_ms: raw.ms,
          raw_steady: raw.steady,
          raw_cpu_ms: rawCpuMs,
          broker_cpu_ms_raw: brokerRawMs,
          broker_rest_ms: { raw: rested[0], fresh: rested[1], warm: warm.restedMs ?? null },
        });
      }
      const median = (values: readonly number[]): number => {
        // The middle one, or of an even count the mean of the two in the middle.
        const low = percentile(values, 50);
        const high = percentile(values, 50 + 50 / values.length);
        if (low === undefined || high === undefined)
          throw new Error("the ingest part has no drain to take the median of");
        return values.length % 2 === 1 ? low : (low + high) / 2;
      };
      const warmDrains = trials.flatMap((trial) => ("serve_ms" in trial.warm ? [trial.warm] : []));
      const rates = {
        rawSteady: median(
          trials.map((trial) => drainRate({ messages: trial.raw_steady.messages, ms: trial.raw_steady.ms })),
        ),
        raw: median(trials.map((trial) => drainRate({ messages: trial.raw_messages, ms: trial.raw_ms }))),
        fresh: median(trials.map((trial) => drainRate({ messages: trial.backlog, ms: trial.serve_ms }))),
        freshSteady: median(trials.map((trial) => drainRate(trial.serve_steady))),
        warm:
          warmDrains.length === 0
            ? undefined
            : median(warmDrains.map((warm) => drainRate({ messages: warm.backlog, ms: warm.serve_ms }))),
        warmSteady:
          warmDrains.length === 0
            ? undefined
            : median(warmDrains.map((warm) => drainRate(warm.serve_steady))),
      };
      extra.ingest = {
        trials,
        median_msg_per_s: rates,
        warm_up_share: warmUpShare,
        reports_per_node: R,
        order: options.ingestOrder,
      };
      const backlog = trials[0]?.backlog ?? 0;
      const consumer = `raw ${broker.kind === "nats" ? "JetStream" : "AMQP"} consume+ack`;
      const firstShare =
        `timed after the first ${warmUpShare * 100} %` +
        (options.ingestOrder === "turns" ? ", the nodes' messages sent in turns" : "");
      const ofTrials = `median of ${trials.length} drains`;
      if (rates.warm !== undefined && rates.warmSteady !== undefined) {
        figures.push(
          {
            part: "ingest",
            what: `alive+report through serve (${R} reports : 1 alive), steady, serve running`,
            value: rates.warmSteady,
            unit: "msg/s",
            limit: { value: rates.rawSteady, what: `${consumer}, steady` },
            target: "≥ 0.8×",
            note:
              `backlog of ${backlog} met by a serve already running (stopped while it was sent), ${firstShare}; ` +
              `each side the ${ofTrials}` +
              (warmDrains.length < trials.length ? ` (serve running: ${warmDrains.length} usable)` : ""),
          },
          {
            part: "ingest",
            what: "the same, whole drain",
            value: rates.warm,
            unit: "msg/s",
            limit: { value: rates.raw, what: `${consumer}, whole drain` },
            target: "≥ 0.8×",
          },
          {
            part: "ingest",
            what: "whole drain by a serve just started (code and caches cold; the raw client warm)",
            value: rates.fresh,
            unit: "msg/s",
            limit: { value: rates.raw, what: `${consumer}, whole drain` },
            note: `backlog of ${backlog}: a restart or takeover meeting a backlog`,
          },
        );
      } else {
        const unusable = trials
          .map((trial) => ("unusable" in trial.warm ? trial.warm.unusable : ""))
          .join("; ");
        figures.push(
          {
            part: "ingest",
            what: `alive+report through serve (${R} reports : 1 alive), steady, serve just started`,
            value: rates.freshSteady,
            unit: "msg/s",
            limit: { value: rates.rawSteady, what: `${consumer}, steady` },
            target: "≥ 0.8×",
            note: `backlog of ${backlog}, ${firstShare}, each side the ${ofTrials}; no drain by a serve already running: ${unusable}`,
          },
          {
            part: "ingest",
            what: "the same, whole drain (serve's warm-up included)",
            value: rates.fresh,
            unit: "msg/s",
            limit: { value: rates.raw, what: `${consumer}, whole drain` },
            target: "≥ 0.8×",
          },
        );
      }
    }
  } catch (error) {
    failed = { error };
  }
  const unstopped: string[] = [];
  for (const [what, stop] of [
    ["the lab", () => lab.stop()],
    ["the store", () => store.close()],
    ["the standby", async () => standby?.stop()],
    ["serve", () => serve.stop()],
    ["the broker", stopBroker],
  ] as const) {
    await stop().catch((error: unknown) =>
      unstopped.push(`${what}: ${error instanceof Error ? error.message : String(error)}`),
    );
  }
  unname();
  rmSync(dir, { recursive: true, force: true });
  const stopping = unstopped.length === 0 ? "" : `stopping failed too (${unstopped.join("; ")})`;
  if (failed !== undefined) {
    const { error } = failed;
    if (stopping === "") throw error;
    throw new Error(`${error instanceof Error ? error.message : String(error)}; ${stopping}`, {
      cause: error,
    });
  }
  if (stopping !== "") throw new Error(stopping);
}

/**
 * Waits until the broker's CPU over a quarter of a second is under a tenth of a core, at most `atMostMs`, and
 * returns how long it waited: what the broker still does after a backlog was sent (writing it out, collecting) is
 * then not charged to whichever drain follows. Every drain, raw or serve's, starts so.
 */
async function brokerAtRest(pid: number | undefined, atMostMs = restAtMostMs): Promise<number> {
  if (pid === undefined) return 0;
  return cpuAtRest(() => brokerCpu(pid), 25, atMostMs);
}

/**
 * Collects the simulated fleet's garbage, then waits until serve, the broker and this process (the fleet) together use
 * under a quarter of a core over a quarter of a second, at most `atMostMs`, and returns how long it waited. A held
 * roll-out starts so: the round before it ends when every node holds what it was sent, and the reports that follow
 * (serve storing them, the fleet taking their receipts) would otherwise share the cores with the roll-out timed as the
 * control plane's alone.
 */
async function machineAtRest(servePid: number, brokerPid: number | undefined, atMostMs = heldRestAtMostMs) {
  collectFleet();
  const busy = () => {
    const { serve, fleet, broker } = roundCpu(servePid, brokerPid);
    return serve + fleet + (broker ?? 0);
  };
  return cpuAtRest(busy, 62.5, atMostMs);
}

/**
 * Collects this process's garbage (the simulated fleet's) at once, when node was started with `--expose-gc` (`npm run
 * bench` does so): a held round starts after it, so that a major collection of the fleet's heap, grown over the run,
 * does not fall within the roll-out timed as the control plane's alone.
 */
function collectFleet(): void {
  (globalThis as { gc?: () => void }).gc?.();
}

/** Waits until `cpuSeconds` grows by less than `underMs` over a quarter of a second, at most `atMostMs`. */
async function cpuAtRest(
  cpuSeconds: () => number | null,
  underMs: number,
  atMostMs: number,
): Promise<number> {
  const startedAt = performance.now();
  for (;;) {
    const before = cpuSeconds();
    await sleep(250);
    const used = cpuMsSince(before, cpuSeconds());
    const waited = performance.now() - startedAt;
    if (used === null || used < underMs || waited >= atMostMs) return waited;
  }
}

/** The broker's CPU seconds so far, or null when it is not a process of this machine the bench knows. */
function brokerCpu(pid: number | undefined): number | null {
  return pid === undefined ? null : brokerCpuSeconds(pid);
}

/** Milliseconds of CPU between two readings, or null when either is missing. */
function cpuMsSince(before: number | null, after: number | null): number | null {
  return before === null || after === null ? null : (after - before) * 1000;
}

/** Publishes one alive and `perNode` reports for each node, as that node, and waits until the broker holds them. */
async function preload(
  broker: BenchBroker,
  lab: Lab,
  sent: ReadonlyMap<string, SentDeclaration>,
  perNode: number,
  firstReportSequence: number,
  order: IngestOrder,
): Promise<void> {
  await aroundBacklog(broker, lab, sent, perNode, firstReportSequence, order, (sending) => sending());
}

/**
 * Opens a connection as each node, gives `around` the sending of a backlog (one alive and `perNode` reports per
 * node, and the wait until the broker holds them), and closes the connections after whatever `around` did.
 */
async function aroundBacklog<T>(
  broker: BenchBroker,
  lab: Lab,
  sent: ReadonlyMap<string, SentDeclaration>,
  perNode: number,
  firstReportSequence: number,
  order: IngestOrder,
  around: (sending: () => Promise<void>) => Promise<T>,
): Promise<T> {
  const before = await broker.queued();
  const asNodes = await broker.openAsNodes(lab.names, (node) => lab.identityOf(node));
  const sending = async () => {
    const alive = (node: string) => {
      const held = sent.get(node);
      return encodeMessage({
        kind: "alive",
        node,
        sent_at: new Date().toISOString(),
        holds: { epoch: held?.epoch ?? 0, sequence: held?.sequence ?? 0 },
      });
    };
    const report = (node: string, k: number) => {
      const held = sent.get(node);
      return encodeMessage({
        kind: "report",
        node,
        epoch: held?.epoch ?? 0,
        sequence: held?.sequence ?? 0,
        report_sequence: firstReportSequence + k,
        digest: held?.digest ?? emptyDigest,
        outcome: "applied",
        items: held === undefined ? [] : [{ id: "file:/etc/bench", state: "applied" }],
        sent_at: new Date().toISOString(),
      });
    };
    if (order === "turns") {
      // Every node's alive, then every node's first report, and so on: each turn sent whole before the next.
      await asNodes.send((node, bus) => bus.publishAlive(alive(node)));
      for (let k = 0; k < perNode; k++) await asNodes.send((node, bus) => bus.publishReport(report(node, k)));
    } else {
      // A node's messages are sent one after another on its connection without waiting for each confirm (the
      // broker keeps their order): waiting for each, RabbitMQ took ~26 s for 1,000 nodes' backlog.
      await asNodes.send(async (node, bus) => {
        const sends = [bus.publishAlive(alive(node))];
        for (let k = 0; k < perNode; k++) sends.push(bus.publishReport(report(node, k)));
        await Promise.all(sends);
      });
    }
    // On RabbitMQ every message a node sent was confirmed: the broker holds it. On NATS a node's publishing is
    // flushed, not confirmed: the stream is asked. Alives keep one per node there, so the backlog grows by the
    // reports at least.
    if (broker.kind === "nats") {
      const expected = before + lab.names.length * perNode;
      await waitForAsync(async () => (await broker.queued()) >= expected, 60_000, 100);
    }
  };
  let result: T;
  try {
    result = await around(sending);
  } catch (error) {
    await asNodes
      .close()
      .catch((closing: unknown) => say(`closing the nodes' connections failed as well: ${String(closing)}`));
    throw error;
  }
  await asNodes.close();
  return result;
}

/** What serve's drain of a backlog met while running gave, or why there is none. */
type WarmDrain =
  | { drained: MeasuredDrain; backlog: number; stoppedMs: number; restedMs: number }
  | { unusable: string; stoppedMs?: number; restedMs?: number };

/**
 * Serve, warm from the drain before, meets a backlog as one that has been running does (its store was down a
 * while, the fleet sent a burst): stopped (SIGSTOP) while the nodes send it over connections opened before, let go
 * (SIGCONT) once the broker holds it all, and timed from that moment; the connections close after the drain. A stop
 * longer than `warmStopAtMostMs`, or a count that does not settle at exactly the backlog, and the drain is not used.
 */
async function drainWarm(
  serve: ServeProcess,
  broker: BenchBroker,
  lab: Lab,
  sent: ReadonlyMap<string, SentDeclaration>,
  perNode: number,
  metricsAddress: string,
  firstReportSequence: number,
  order: IngestOrder,
): Promise<WarmDrain> {
  if (serve.pid <= 0) throw new Error("mesh serve has no process id to stop");
  // Whatever the drain before left (an alive that landed late) is handled before the count is read.
  await waitForAsync(async () => (await broker.queued()) === 0, 60_000, 100);
  const handledBefore = await handledBy(metricsAddress);
  const receiptsBefore = await counterOf(metricsAddress, "mesh_receipts_sent_total");
  // Every message sent is one serve handles: the backlog holds nothing else, and alives keep one per node.
  const backlog = lab.names.length * (perNode + 1);
  let stoppedMs = 0;
  let restedMs = 0;
  const drained = await aroundBacklog(
    broker,
    lab,
    sent,
    perNode,
    firstReportSequence,
    order,
    async (sending) => {
      process.kill(serve.pid, "SIGSTOP");
      const stoppedAt = performance.now();
      try {
        await sending();
        // The wait is part of the stop: it leaves the stop's bound two seconds.
        const left = warmStopAtMostMs[broker.kind] - (performance.now() - stoppedAt) - 2_000;
        restedMs = await brokerAtRest(broker.pid, Math.max(0, Math.min(restAtMostMs, left)));
      } finally {
        process.kill(serve.pid, "SIGCONT");
        stoppedMs = performance.now() - stoppedAt;
      }
      return measureServeDrain(serve, broker, metricsAddress, backlog, {
        handled: handledBefore,
        receipts: receiptsBefore,
      });
    },
  );
  await waitForAsync(async () => (await broker.queued()) === 0, 60_000, 100);
  const handled = (await handledBy(metricsAddress)) - handledBefore;
  const atMostMs = warmStopAtMostMs[broker.kind];
  if (stoppedMs > atMostMs) {
    const within = broker.kind === "nats" ? "the consumer's ack wait" : "two of serve's heartbeats";
    return {
      unusable:
        `sending the backlog kept serve stopped ${(stoppedMs / 1000).toFixed(1)} s, beyond the ` +
        `${atMostMs / 1000} s kept within ${within}`,
      stoppedMs,
      restedMs,
    };
  }
  if (handled !== backlog) {
    return { unusable: `serve handled ${handled} messages of a backlog of ${backlog}`, stoppedMs, restedMs };
  }
  return { drained, backlog, stoppedMs, restedMs };
}

/** Messages a second of a drain. */
function drainRate(drained: { messages: number; ms: number }): number {
  return drained.messages / (drained.ms / 1000);
}

/** A drain by serve, as the JSON keeps it. */
interface ServeDrainRecord {
  backlog: number;
  serve_ms: number;
  serve_cpu_ms: number;
  serve_steady: { messages: number; ms: number };
  broker_cpu_ms_serve: number | null;
  serve_receipts: number;
}

function serveDrainRecord(backlog: number, drained: MeasuredDrain): ServeDrainRecord {
  return {
    backlog,
    serve_ms: drained.ms,
    serve_cpu_ms: drained.cpuMs,
    serve_steady: drained.steady,
    broker_cpu_ms_serve: drained.brokerCpuMs,
    serve_receipts: drained.receipts,
  };
}

/** One turn of the ingest part: the raw consumer's drain, then serve's just started, then serve's running. */
interface IngestTrial extends ServeDrainRecord {
  warm:
    (ServeDrainRecord & { serve_stopped_ms: number }) | { unusable: string; serve_stopped_ms: number | null };
  raw_messages: number;
  raw_ms: number;
  raw_steady: { messages: number; ms: number };
  raw_cpu_ms: number;
  broker_cpu_ms_raw: number | null;
  broker_rest_ms: { raw: number | undefined; fresh: number | undefined; warm: number | null };
}

interface MeasuredDrain extends Drained {
  cpuMs: number;
  brokerCpuMs: number | null;
  /** Receipts serve sent from the drain's start until every message was handled. */
  receipts: number;
}

/**
 * Times serve's drain of `total` more messages than the `from` it had handled, with its CPU and the broker's, and
 * the receipts it sent meanwhile (beyond the `receiptsFrom` it had sent, read before the backlog was let go).
 */
async function measureServeDrain(
  serve: ServeProcess,
  broker: BenchBroker,
  metricsAddress: string,
  total: number,
  from: { handled: number; receipts: number },
): Promise<MeasuredDrain> {
  const cpuBefore = cpuSeconds(serve.pid);
  const brokerBefore = brokerCpu(broker.pid);
  const drained = await timeServeDrain(serve, metricsAddress, total, from.handled);
  const cpuMs = (cpuSeconds(serve.pid) - cpuBefore) * 1000;
  const brokerCpuMs = cpuMsSince(brokerBefore, brokerCpu(broker.pid));
  const receipts = (await counterOf(metricsAddress, "mesh_receipts_sent_total")) - from.receipts;
  return { ...drained, cpuMs, brokerCpuMs, receipts };
}

/**
 * Times serve's drain of a backlog of `total` by its /metrics, counting from the `from` messages it had handled
 * before: whole, and after its warm-up share, as the raw drain is timed. It asks often until that share is passed
 * and near the end, seldom in between, so the asking costs serve little.
 */
async function timeServeDrain(
  serve: ServeProcess,
  metricsAddress: string,
  total: number,
  from: number,
): Promise<Drained> {
  const started = performance.now();
  const deadline = Date.now() + 600_000;
  let warm: { at: number; handled: number } | undefined;
  for (;;) {
    const handledInAll = await handledBy(metricsAddress).catch((error: unknown) => {
      const ended = serve.ended();
      throw ended === undefined ? error : new Error(`mesh serve ${ended}`);
    });
    const handled = handledInAll - from;
    const at = performance.now();
    if (warm === undefined && handled >= total * warmUpShare) warm = { at, handled };
    if (handled >= total) {
      const from = warm ?? { at: started, handled: 0 };
      return {
        messages: total,
        ms: at - started,
        steady: { messages: total - from.handled, ms: at - from.at },
      };
    }
    if (Date.now() > deadline) throw new Error(`serve handled ${handled} of ${total} in ten minutes`);
    const perMs = handled / Math.max(at - started, 1);
    // Often until the warm-up share is passed, so that the steady rate is timed from there, as the raw drain's is
    // (a drain of 20,000 takes ~600 ms warm: asking every 200 ms put the mark near half-way).
    const atMostMs = warm === undefined ? 10 : 200;
    await sleep(perMs > 0 ? Math.min(atMostMs, Math.max(5, (total - handled) / perMs / 4)) : 10);
  }
}

/** How many control messages serve has handled so far, from its /metrics. */
async function handledBy(metricsAddress: string): Promise<number> {
  return counterOf(metricsAddress, "mesh_control_messages_total");
}

/** A counter of serve's /metrics. */
async function counterOf(metricsAddress: string, name: string): Promise<number> {
  const text = await (await fetch(`http://${metricsAddress}/metrics`)).text();
  const match = new RegExp(`^${name} (\\d+)$`, "m").exec(text);
  if (match === null) throw new Error(`serve's /metrics has no ${name}`);
  return Number(match[1]);
}

async function mapLimit<T>(
  items: readonly T[],
  limit: number,
  work: (item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) await work(items[next++] as T);
    }),
  );
}
