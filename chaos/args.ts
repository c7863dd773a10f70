/** `npm run chaos -- [--nodes 200] [--pause 30s] [--faults a,b] [--short]`: the fault suite's flags, checked once. */
import { parseArgs } from "node:util";
import { parseDuration } from "../src/config/duration.js";

/** Every fault the suite knows, in the order it runs them. */
export const faultNames = [
  "broker-stop",
  "broker-kill",
  "control-kill",
  "store-cut",
  "rabbitmq-stop",
] as const;
export type FaultName = (typeof faultNames)[number];

export interface ChaosOptions {
  nodes: number;
  faults: FaultName[];
  /** How long each fault that lasts (a paused broker, a cut store, a stopped RabbitMQ) lasts. */
  pauseMs: Record<FaultName, number>;
  /** The mesh's out-of-touch threshold: shorter than the pauses, so a false out-of-touch would show. */
  outOfTouchAfterMs: number;
  /** How often each lab node says alive: well inside the threshold, so a real silence is the only way out. */
  aliveEveryMs: number;
  /** How long any one wait may take before the run says what did not happen (a guard against a hang). */
  deadlineMs: number;
  short: boolean;
  /** Keep each mesh's data dir and logs, even when every check passed. */
  keep: boolean;
}

export class ChaosUsageError extends Error {
  override name = "ChaosUsageError";
}

/**
 * The lease's gate closes 12 s after the last renewal with the default timings (15s/5s/3s): a broker paused for
 * longer than that ends the acting control plane, which is the behaviour worth seeing; the short form keeps above it.
 */
const shortPauses: Record<FaultName, number> = {
  "broker-stop": 20_000,
  "broker-kill": 0,
  "control-kill": 0,
  "store-cut": 15_000,
  "rabbitmq-stop": 15_000,
};

export function parseChaosArgs(argv: readonly string[]): ChaosOptions {
  let values;
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: {
        nodes: { type: "string" },
        pause: { type: "string" },
        faults: { type: "string" },
        "out-of-touch-after": { type: "string", default: "10s" },
        "alive-every": { type: "string", default: "2s" },
        deadline: { type: "string", default: "5m" },
        short: { type: "boolean", default: false },
        keep: { type: "boolean", default: false },
      },
      strict: true,
    }));
  } catch (error) {
    throw new ChaosUsageError((error as Error).message);
  }
  const short = values.short === true;
  const nodes = whole(values.nodes ?? (short ? "20" : "200"), "--nodes", 1, 5000);
  const faults = values.faults === undefined ? [...faultNames] : faultsOf(values.faults);
  const given = values.pause === undefined ? undefined : duration(values.pause, "--pause");
  const pauseMs = Object.fromEntries(
    faultNames.map((fault) => [
      fault,
      // A kill has no length: it is over when it is done.
      fault === "broker-kill" || fault === "control-kill"
        ? 0
        : (given ?? (short ? shortPauses[fault] : 30_000)),
    ]),
  ) as Record<FaultName, number>;
  const outOfTouchAfterMs = duration(values["out-of-touch-after"], "--out-of-touch-after");
  const aliveEveryMs = duration(values["alive-every"], "--alive-every");
  if (aliveEveryMs * 2 > outOfTouchAfterMs)
    throw new ChaosUsageError(
      "--alive-every must be at most half of --out-of-touch-after: a slow alive is no fault",
    );
  return {
    nodes,
    faults,
    pauseMs,
    outOfTouchAfterMs,
    aliveEveryMs,
    deadlineMs: duration(values.deadline, "--deadline"),
    short,
    keep: values.keep === true,
  };
}

function faultsOf(text: string): FaultName[] {
  const wanted = text.split(",").map((fault) => fault.trim());
  for (const fault of wanted) {
    if (!(faultNames as readonly string[]).includes(fault))
      throw new ChaosUsageError(`--faults: "${fault}" is not one of ${faultNames.join(", ")}`);
  }
  return faultNames.filter((fault) => wanted.includes(fault));
}

function duration(text: string, flag: string): number {
  try {
    return parseDuration(text, flag);
  } catch (error) {
    throw new ChaosUsageError((error as Error).message);
  }
}

function whole(text: string, flag: string, min: number, max: number): number {
  const value = /^\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < min || value > max)
    throw new ChaosUsageError(`${flag}: "${text}" is not a whole number from ${min} to ${max}`);
  return value;
}
