/** `npm run bench -- [--nodes 1000] [--only ingest,fanout,…] …`: the benchmark's flags, checked once. */
import { parseArgs } from "node:util";

export const benchParts = [
  "enrolment",
  "steady",
  "fanout",
  "convergence",
  "plan",
  "ingest",
  "failover",
] as const;
export type BenchPart = (typeof benchParts)[number];

export interface BenchOptions {
  nodes: number;
  /** Which broker the mesh runs on. */
  broker: "nats" | "amqp";
  parts: BenchPart[];
  /** How long the steady-state window is. */
  steadyMs: number;
  aliveEveryMs: number;
  /** Reports per node in the ingest backlog (beside one alive per node). */
  reportsPerNode: number;
  /**
   * The order the ingest backlog is sent in: `node`, each node's alive and reports back to back (a batch serve takes
   * holds a few nodes); `turns`, every node's alive, then every node's first report, and so on (a batch holds as
   * many nodes as messages, as when a fleet reports after a roll-out).
   */
  ingestOrder: IngestOrder;
  /** How many times the fleet is declared to, in the fan-out and convergence parts. */
  rounds: number;
  /** How many times the ingest part's backlog is drained by each side (the medians are compared). */
  ingestTrials: number;
  /** How many join at once in the enrolment part (default: all of them). */
  joinConcurrency: number;
  failover: { trials: number; ttl: string; renew: string; margin: string; shortened: boolean };
  /** How many nodes the plan part's in-process allot + compose is timed for (the mesh half uses `nodes`). */
  planFleet: number;
  /** Run serve (and the fleet's `mesh declare --all`) under --cpu-prof, profiles kept under bench/results/profiles/. */
  profile: boolean;
}

export const ingestOrders = ["node", "turns"] as const;
export type IngestOrder = (typeof ingestOrders)[number];

export class BenchUsageError extends Error {
  override name = "BenchUsageError";
}

export function parseBenchArgs(argv: readonly string[]): BenchOptions {
  let values;
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: {
        nodes: { type: "string", default: "1000" },
        broker: { type: "string", default: "nats" },
        only: { type: "string" },
        "steady-window": { type: "string", default: "60" },
        "alive-every": { type: "string", default: "15" },
        "reports-per-node": { type: "string", default: "19" },
        "join-concurrency": { type: "string" },
        rounds: { type: "string", default: "3" },
        "ingest-trials": { type: "string" },
        "ingest-order": { type: "string", default: "node" },
        trials: { type: "string" },
        ttl: { type: "string" },
        renew: { type: "string" },
        margin: { type: "string" },
        "plan-fleet": { type: "string", default: "10000" },
        profile: { type: "boolean", default: false },
      },
      strict: true,
    }));
  } catch (error) {
    throw new BenchUsageError((error as Error).message);
  }
  const nodes = whole(values.nodes, "--nodes", 1, 100_000);
  const ingestOrder = ingestOrders.find((order) => order === values["ingest-order"]);
  if (ingestOrder === undefined)
    throw new BenchUsageError(
      `--ingest-order: "${values["ingest-order"]}" is neither ${ingestOrders.join(" nor ")}`,
    );
  const broker = values.broker;
  if (broker !== "nats" && broker !== "amqp")
    throw new BenchUsageError(`--broker: "${broker}" is neither nats nor amqp`);
  // The failover part times the NATS KV lease; on RabbitMQ the lease is the store's, timed by the tests.
  const parts =
    values.only === undefined
      ? benchParts.filter((part) => broker === "nats" || part !== "failover")
      : partsOf(values.only);
  if (broker === "amqp" && parts.includes("failover"))
    throw new BenchUsageError("--only failover: the failover part runs on NATS only");
  // Alone, failover runs the full trials on the production lease timings; inside the whole table it is shortened.
  const alone = parts.length === 1 && parts[0] === "failover";
  const shortened = !alone && values.trials === undefined && values.ttl === undefined;
  const failover = {
    trials: whole(values.trials ?? (shortened ? "3" : "10"), "--trials", 1, 1000),
    ttl: values.ttl ?? (shortened ? "3s" : "15s"),
    renew: values.renew ?? (shortened ? "1s" : "5s"),
    margin: values.margin ?? (shortened ? "500ms" : "3s"),
    shortened,
  };
  return {
    nodes,
    broker,
    parts,
    steadyMs: whole(values["steady-window"], "--steady-window (seconds)", 1, 3600) * 1000,
    aliveEveryMs: whole(values["alive-every"], "--alive-every (seconds)", 1, 3600) * 1000,
    reportsPerNode: whole(values["reports-per-node"], "--reports-per-node", 1, 1000),
    rounds: whole(values.rounds, "--rounds", 1, 100),
    ingestOrder,
    // One RabbitMQ drain can cost the broker three times another of the same backlog (measured: a plain consumer's
    // 20,000 took 0.8 to 1.9 s of its CPU, most near 1.5 s): a median of three lands on an outlier too often.
    ingestTrials: whole(values["ingest-trials"] ?? (broker === "amqp" ? "7" : "3"), "--ingest-trials", 1, 20),
    // Pure-JS nkey signing makes a thousand simultaneous connects outlast the server's authentication timeout.
    joinConcurrency: whole(
      values["join-concurrency"] ?? String(Math.min(nodes, 20)),
      "--join-concurrency",
      1,
      100_000,
    ),
    failover,
    planFleet: whole(values["plan-fleet"], "--plan-fleet", 1, 1_000_000),
    profile: values.profile === true,
  };
}

function partsOf(text: string): BenchPart[] {
  const wanted = text.split(",").map((part) => part.trim());
  for (const part of wanted) {
    if (!(benchParts as readonly string[]).includes(part)) {
      throw new BenchUsageError(`--only: "${part}" is not one of ${benchParts.join(", ")}`);
    }
  }
  // Always in the table's order, each once.
  return benchParts.filter((part) => wanted.includes(part));
}

function whole(text: string, flag: string, min: number, max: number): number {
  const value = /^\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new BenchUsageError(`${flag}: "${text}" is not a whole number from ${min} to ${max}`);
  }
  return value;
}
