import { ContractError } from "./errors.js";

/**
 * Every name the mesh puts on the broker: node names, NATS subjects, RabbitMQ exchanges, routing keys and queues.
 * Nothing else in the code spells a subject or a queue by hand, so the writers table and the bus cannot drift apart.
 */

/** A node name is a DNS label, so it is also safe as one token of a NATS subject and inside a queue name. */
export const nodeNamePattern = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const nodeNameMaxLength = 63;

/** True when `name` is a valid node name: 1–63 of a-z, 0-9 and '-', neither first nor last being '-'. */
export function isNodeName(name: unknown): name is string {
  return typeof name === "string" && nodeNamePattern.test(name);
}

/** Throws a ContractError saying what is wrong unless `name` is a valid node name. */
export function assertNodeName(name: unknown): asserts name is string {
  const problem = nodeNameProblem(name);
  if (problem !== undefined) throw new ContractError(problem);
}

/** Says what is wrong with a node name, or undefined when there is nothing wrong. */
export function nodeNameProblem(name: unknown): string | undefined {
  if (typeof name !== "string") return `node name: expected a string, received ${typeof name}`;
  if (name.length === 0) return "node name: must not be empty";
  const shown = JSON.stringify(name.length > 70 ? `${name.slice(0, 70)}…` : name);
  if (name.length > nodeNameMaxLength) {
    return `node name ${shown}: is ${name.length} characters, at most ${nodeNameMaxLength} are allowed`;
  }
  if (!/^[a-z0-9-]+$/.test(name)) return `node name ${shown}: may hold only a-z, 0-9 and '-'`;
  if (name.startsWith("-") || name.endsWith("-")) return `node name ${shown}: must not start or end with '-'`;
  return undefined;
}

/** The kinds a node (or a token acting for one) publishes to the control plane. */
export const controlQueueKinds = ["enrol", "report", "alive"] as const;
/** A kind that travels from a node to the control plane's queue. */
export type ControlQueueKind = (typeof controlQueueKinds)[number];

/** Event kinds are one or more dot-separated tokens, so they stay inside `mesh.event.>` and `event.#`. */
const eventKindPattern = /^[a-z0-9_-]+(?:\.[a-z0-9_-]+)*$/;

function assertEventKind(kind: string): void {
  if (kind.length === 0 || kind.length > 128 || !eventKindPattern.test(kind)) {
    throw new ContractError(
      `event kind ${JSON.stringify(kind.slice(0, 70))}: expected dot-separated tokens of a-z, 0-9, '_' and '-'`,
    );
  }
}

/**
 * The patterns behind every subject and queue, with the node position left open so the writers table can fill it
 * with a wildcard for the control plane. Callers outside the contract use the checked functions below instead.
 */
export const natsPattern = {
  toControl: (kind: ControlQueueKind, node: string): string => `mesh.${kind}.${node}`,
  declaration: (node: string): string => `node.${node}.declaration`,
  receipt: (node: string): string => `node.${node}.receipt`,
  replies: (node: string): string => `node.${node}.reply.>`,
  addressedTo: (node: string): string => `node.${node}.>`,
  events: "mesh.event.>",
} as const;

/** The NATS wildcard standing for any single node name. */
export const anyNodeSubjectToken = "*";

/** NATS: the subject a node publishes `kind` on; the control plane reads it. */
export function controlSubject(kind: ControlQueueKind, node: string): string {
  assertNodeName(node);
  return natsPattern.toControl(kind, node);
}

/** NATS: where the control plane sends a node its signed declarations. */
export function declarationSubject(node: string): string {
  assertNodeName(node);
  return natsPattern.declaration(node);
}

/** NATS: where the control plane tells a node which of its reports it has taken. */
export function receiptSubject(node: string): string {
  assertNodeName(node);
  return natsPattern.receipt(node);
}

/**
 * NATS: the inbox prefix a node's clients set, so replies to its requests (the enrol reply first of all) land under
 * `node.<node>.reply.>` — the only place the token identity may read.
 */
export function inboxPrefix(node: string): string {
  assertNodeName(node);
  return `node.${node}.reply`;
}

/** NATS: every subject addressed to one node, its declarations and its replies. */
export function nodeSubjects(node: string): string {
  assertNodeName(node);
  return natsPattern.addressedTo(node);
}

/** NATS: the subject a control-plane event of `kind` is published on. */
export function eventSubject(kind: string): string {
  assertEventKind(kind);
  return `mesh.event.${kind}`;
}

/**
 * Reads a subject a node published on: `mesh.<kind>.<node>` for one of the control-queue kinds. Returns undefined
 * for any other subject, including one whose node position is not a valid node name.
 */
export function readControlSubject(subject: string): { kind: ControlQueueKind; node: string } | undefined {
  const tokens = subject.split(".");
  if (tokens.length !== 3 || tokens[0] !== "mesh") return undefined;
  const kind = controlQueueKinds.find((known) => known === tokens[1]);
  const node = tokens[2];
  if (kind === undefined || !isNodeName(node)) return undefined;
  return { kind, node };
}

/**
 * The node named by a subject a node published on, or undefined when the subject is not one (or, when `kind` is
 * given, is not of that kind).
 */
export function nodeOfSubject(subject: string, kind?: ControlQueueKind): string | undefined {
  const read = readControlSubject(subject);
  if (read === undefined || (kind !== undefined && read.kind !== kind)) return undefined;
  return read.node;
}

/** RabbitMQ: the topic exchange nodes publish to. */
export const meshExchange = "mesh";
/** RabbitMQ: the control plane's one queue, bound to `mesh` by the control-queue kinds' routing keys. */
export const controlQueue = "control";
/** RabbitMQ: the default exchange's name when publishing; it routes by queue name. */
export const defaultExchange = "";
/** RabbitMQ: the default exchange's name as a resource in permissions. */
export const defaultExchangeResource = "amq.default";

/** RabbitMQ: the routing key of a control-queue kind. The node is in the body, checked against `user_id`. */
export function controlRoutingKey(kind: ControlQueueKind): string {
  return kind;
}

/** RabbitMQ: the routing key of a control-plane event on the `mesh` exchange. */
export function eventRoutingKey(kind: string): string {
  assertEventKind(kind);
  return `event.${kind}`;
}

/**
 * RabbitMQ: a node's own queue. Declarations and enrol replies are published to it through the default exchange,
 * keyed by this name, so no per-node binding is left behind when a node is retired.
 */
export function nodeQueue(node: string): string {
  assertNodeName(node);
  return `node.${node}`;
}
