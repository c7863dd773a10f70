/** `mesh lab` options: checked once, each refusal a usage error that says what would be accepted. */
import { parseDuration } from "../config/duration.js";
import { UsageError } from "../errors.js";
import { nodeNameProblem } from "../link/index.js";

/** How many simulated nodes one lab may run. */
export const maxLabNodes = 100_000;
/** Up to this many nodes, each gets its own broker connection unless told otherwise. */
export const ownConnectionsUpTo = 500;
/**
 * Lab nodes per shared connection. Its identity names each of them; a group whose identity is longer than a CONNECT
 * line holds is split over more connections.
 */
export const defaultGroupSize = 20;

/** `own`: one connection per node, on its own identity. `shared`: groups of nodes share a `lab` identity. */
export const connectionModes = ["own", "shared"] as const;
export type ConnectionMode = (typeof connectionModes)[number];

export interface LabFlags {
  nodes: string;
  prefix?: string;
  aliveEvery?: string;
  connections?: string;
  groupSize?: string;
  joinConcurrency?: string;
  joinTimeout?: string;
}

export interface LabOptions {
  nodes: number;
  prefix: string;
  aliveEveryMs: number;
  connections: ConnectionMode;
  groupSize: number;
  joinConcurrency: number;
  joinTimeoutMs: number;
}

export function compileLabOptions(flags: LabFlags): LabOptions {
  const nodes = count(flags.nodes, "--nodes", 1, maxLabNodes);
  const prefix = flags.prefix ?? "lab";
  // The widest name must still be a node name: prefix, '-', the number.
  const problem = nodeNameProblem(labNodeName(prefix, nodes, nodes));
  if (problem !== undefined)
    throw new UsageError(`--prefix: "${prefix}" does not make node names (${problem})`);
  let connections: ConnectionMode;
  if (flags.connections === undefined || flags.connections === "auto") {
    connections = nodes <= ownConnectionsUpTo ? "own" : "shared";
  } else if ((connectionModes as readonly string[]).includes(flags.connections)) {
    connections = flags.connections as ConnectionMode;
  } else {
    throw new UsageError(`--connections: "${flags.connections}" is not one of auto, own, shared`);
  }
  return {
    nodes,
    prefix,
    aliveEveryMs: parseDuration(flags.aliveEvery ?? "15s", "--alive-every"),
    connections,
    groupSize: count(flags.groupSize ?? String(defaultGroupSize), "--group-size", 1, 100),
    joinConcurrency: count(flags.joinConcurrency ?? "100", "--join-concurrency", 1, 10_000),
    joinTimeoutMs: parseDuration(flags.joinTimeout ?? "60s", "--join-timeout"),
  };
}

/** A whole number from `min` to `max`, or a usage error naming the flag. */
export function count(text: string, flag: string, min: number, max: number): number {
  const value = /^\d+$/.test(text.trim()) ? Number(text.trim()) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new UsageError(`${flag}: "${text}" is not a whole number from ${min} to ${max}`);
  }
  return value;
}

/** The i-th lab node's name (1-based), zero-padded to the width of the largest, so names sort in order. */
export function labNodeName(prefix: string, index: number, total: number): string {
  return `${prefix}-${String(index).padStart(String(total).length, "0")}`;
}
