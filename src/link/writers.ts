import { ContractError } from "./errors.js";
import {
  anyNodeSubjectToken,
  assertNodeName,
  controlQueue,
  controlQueueKinds,
  controlRoutingKey,
  defaultExchangeResource,
  meshExchange,
  natsPattern,
  nodeQueue,
} from "./names.js";
import type { ControlQueueKind } from "./names.js";

/**
 * The writers table: the one statement of who may publish what and read where. The broker enforces it, because
 * natsPermissions and rabbitPermissions compile every account's permissions from it and from nothing else.
 */

/** The identities that connect to the broker. */
export const roles = ["control", "token", "node", "lab"] as const;
/**
 * `control`: the control plane. `token`: a joining node, before it has its own identity. `node`: an enrolled node.
 * `lab`: one connection shared by a group of simulated nodes (`mesh lab`), when one connection per node would be
 * too many; it may do for each named node what that node may do, and nothing for any other.
 */
export type Role = (typeof roles)[number];

/**
 * What travels on the broker on its own. A declaration is not among them: it only ever travels inside its signed
 * envelope. `event` stands for the control plane's announcements on `mesh.event.<kind>`.
 */
export const publishedKinds = [
  "enrol",
  "enrol_reply",
  "declaration_envelope",
  "receipt",
  "report",
  "alive",
  "event",
] as const;
/** A kind that can be published. */
export type PublishedKind = (typeof publishedKinds)[number];

/** Where messages are read from: the control plane's queue, a node's own queue, or only a node's replies. */
export const places = ["control_queue", "node_queue", "node_replies"] as const;
/** A place messages are read from. */
export type Place = (typeof places)[number];

/** One role's row in the writers table. */
export interface WritersRow {
  /** The kinds this role may publish. */
  readonly publishes: readonly PublishedKind[];
  /** The places this role may read. */
  readonly reads: readonly Place[];
  /**
   * `node`: the identity belongs to one node and its permissions name it. `nodes`: it acts for a named group of
   * nodes, each named in its permissions. `fleet`: it acts for every node.
   */
  readonly scope: "node" | "nodes" | "fleet";
  /** Whether this role sets up the broker (streams, key-value buckets, exchange, queues) and keeps the lease. */
  readonly managesBroker: boolean;
}

/** The writers table as a type, so a variant can be compiled (tests show every permission comes from a row). */
export type WritersTable = Readonly<Record<Role, WritersRow>>;

/** Who may publish and read what. A node may publish exactly enrol (with its token), report and alive. */
export const writersTable = {
  token: { publishes: ["enrol"], reads: ["node_replies"], scope: "node", managesBroker: false },
  node: { publishes: ["report", "alive"], reads: ["node_queue"], scope: "node", managesBroker: false },
  lab: { publishes: ["report", "alive"], reads: ["node_queue"], scope: "nodes", managesBroker: false },
  control: {
    publishes: ["enrol_reply", "declaration_envelope", "receipt", "event"],
    reads: ["control_queue"],
    scope: "fleet",
    managesBroker: true,
  },
} as const satisfies WritersTable;

/** True when the table lets `role` publish `kind`; the bus asks before it sends anything. */
export function mayPublish(role: Role, kind: PublishedKind, table: WritersTable = writersTable): boolean {
  return table[role].publishes.includes(kind);
}

/** True when the table lets `role` read `place`. */
export function mayRead(role: Role, place: Place, table: WritersTable = writersTable): boolean {
  return table[role].reads.includes(place);
}

/** NATS user permissions, as carried in a user JWT's `pub` and `sub` allow-lists. */
export interface NatsPermissions {
  pub: { allow: string[] };
  sub: { allow: string[] };
}

/**
 * What a role that sets up the broker needs on NATS beyond the table's kinds. The control plane runs on JetStream:
 * `$JS.API.>` to define streams and consumers and to fetch from them, `$KV.>` to write the lease bucket,
 * `$JS.ACK.>` to acknowledge what it consumed, `_INBOX.>` to publish and receive replies of its own requests
 * (JetStream API answers, key-value reads, the CLI's questions to `serve`).
 */
const natsBrokerSetup = {
  pub: ["$JS.API.>", "$KV.>", "$JS.ACK.>", "_INBOX.>"],
  sub: ["_INBOX.>"],
} as const;

/**
 * Compiles the NATS permissions of `role` from the table. `node` is required for the roles scoped to one node (a
 * list of names for a role scoped to a group) and refused for the control plane, whose permissions span the fleet.
 */
export function natsPermissions(
  role: Role,
  node?: string | readonly string[],
  table: WritersTable = writersTable,
): NatsPermissions {
  const row = table[role];
  const slots = nodesNamed(role, row, node) ?? [anyNodeSubjectToken];
  const pub = slots.flatMap((slot) => row.publishes.map((kind) => natsPublishSubject(kind, slot)));
  const sub = slots.flatMap((slot) => row.reads.flatMap((place) => natsReadSubjects(place, slot)));
  if (row.managesBroker) {
    pub.push(...natsBrokerSetup.pub);
    sub.push(...natsBrokerSetup.sub);
  }
  return { pub: { allow: unique(pub) }, sub: { allow: unique(sub) } };
}

function natsPublishSubject(kind: PublishedKind, slot: string): string {
  switch (kind) {
    case "enrol":
    case "report":
    case "alive":
      return natsPattern.toControl(kind, slot);
    case "enrol_reply":
      return natsPattern.replies(slot);
    case "declaration_envelope":
      return natsPattern.declaration(slot);
    case "receipt":
      return natsPattern.receipt(slot);
    case "event":
      return natsPattern.events;
    default: {
      const unknown: never = kind;
      throw new ContractError(`no subject for kind ${String(unknown)}`);
    }
  }
}

function natsReadSubjects(place: Place, slot: string): string[] {
  switch (place) {
    case "control_queue":
      return controlQueueKinds.map((kind) => natsPattern.toControl(kind, slot));
    case "node_queue":
      return [natsPattern.addressedTo(slot)];
    case "node_replies":
      return [natsPattern.replies(slot)];
    default: {
      const unknown: never = place;
      throw new ContractError(`no subject for place ${String(unknown)}`);
    }
  }
}

/** RabbitMQ permissions of one user on the mesh's vhost: resource regexes and topic regexes on `mesh`. */
export interface RabbitPermissions {
  configure: string;
  write: string;
  read: string;
  topic: { exchange: typeof meshExchange; write: string; read: string };
}

/** Any node's queue, for a role acting across the fleet. */
const anyNodeQueuePattern = "node\\.[a-z0-9-]+";
/** Any event's routing key on `mesh`. */
const anyEventRoutingKey = "event\\..+";

/**
 * Compiles the RabbitMQ permissions of `role` from the table: `write` names the exchanges its kinds go through,
 * `read` the queues of its places, and the topic permissions the routing keys on `mesh`. A role that sets up the
 * broker also configures the exchange and every queue, writes and reads what binding the control queue needs.
 */
export function rabbitPermissions(
  role: Role,
  node?: string | readonly string[],
  table: WritersTable = writersTable,
): RabbitPermissions {
  const row = table[role];
  const group = nodesNamed(role, row, node);
  if (group !== undefined && group.length !== 1) {
    // RabbitMQ names the node a message comes from by the user that published it (user_id), so one user can
    // speak for one node only.
    throw new ContractError(`${role} permissions on RabbitMQ name exactly one node, not ${group.length}`);
  }
  const named = group?.[0];
  const queue = named === undefined ? anyNodeQueuePattern : escapeRegex(nodeQueue(named));
  const routes = row.publishes.map((kind) => rabbitRoute(kind));
  const readQueues = row.reads.flatMap((place) => rabbitReadQueues(place, queue));
  const boundKeys = row.reads.includes("control_queue") ? controlQueueKinds.map(routingKeyPattern) : [];

  const configure: string[] = [];
  const write = routes.map((route) => escapeRegex(route.exchange));
  const read = [...readQueues];
  if (row.managesBroker) {
    // Declaring needs configure; binding the control queue to `mesh` needs write on the queue and read on `mesh`.
    configure.push(escapeRegex(meshExchange), escapeRegex(controlQueue), anyNodeQueuePattern);
    write.push(escapeRegex(controlQueue));
    read.push(escapeRegex(meshExchange));
  }
  return {
    configure: anchored(configure),
    write: anchored(write),
    read: anchored(read),
    topic: {
      exchange: meshExchange,
      write: anchored(routes.flatMap((route) => (route.routingKey === undefined ? [] : [route.routingKey]))),
      read: anchored(boundKeys),
    },
  };
}

/** The queues (as regexes) a place is on RabbitMQ, given the regex of the node queue in scope. */
function rabbitReadQueues(place: Place, nodeQueuePattern: string): string[] {
  switch (place) {
    case "control_queue":
      return [escapeRegex(controlQueue)];
    case "node_queue":
      return [nodeQueuePattern];
    case "node_replies":
      // Answers come by direct reply-to, the asking channel's own pseudo-queue, which needs no read permission.
      // Read on the node's queue here would let a token for an enrolled node take that node's declarations.
      return [];
    default: {
      const unknown: never = place;
      throw new ContractError(`no queue for place ${String(unknown)}`);
    }
  }
}

/** The exchange a kind is published to and, on the topic exchange, the regex of its routing key. */
function rabbitRoute(kind: PublishedKind): { exchange: string; routingKey?: string } {
  switch (kind) {
    case "enrol":
    case "report":
    case "alive":
      return { exchange: meshExchange, routingKey: routingKeyPattern(kind) };
    case "event":
      return { exchange: meshExchange, routingKey: anyEventRoutingKey };
    case "enrol_reply":
    case "declaration_envelope":
    case "receipt":
      // Straight to the node's queue through the default exchange: no per-node binding to leave behind.
      return { exchange: defaultExchangeResource };
    default: {
      const unknown: never = kind;
      throw new ContractError(`no route for kind ${String(unknown)}`);
    }
  }
}

function routingKeyPattern(kind: ControlQueueKind): string {
  return escapeRegex(controlRoutingKey(kind));
}

/** The nodes a role's permissions are for: the checked names, or undefined for a role acting across the fleet. */
function nodesNamed(
  role: Role,
  row: WritersRow,
  node: string | readonly string[] | undefined,
): string[] | undefined {
  switch (row.scope) {
    case "fleet":
      if (node !== undefined)
        throw new ContractError(`${role} permissions span the fleet and take no node name`);
      return undefined;
    case "node":
      if (node === undefined) throw new ContractError(`${role} permissions need the node's name`);
      if (typeof node !== "string") throw new ContractError(`${role} permissions name one node, not a list`);
      assertNodeName(node);
      return [node];
    case "nodes": {
      const names = typeof node === "string" ? [node] : node;
      if (names === undefined || names.length === 0)
        throw new ContractError(`${role} permissions need the node's name (one or more)`);
      for (const name of names) assertNodeName(name);
      return unique(names);
    }
    default: {
      const unknown: never = row.scope;
      throw new ContractError(`unknown scope ${String(unknown)}`);
    }
  }
}

/** Escapes every regex metacharacter, so a name matches only itself. */
export function escapeRegex(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/** `^$` for nothing, `^a$` for one, `^(a|b)$` for several: the whole name must match. */
function anchored(alternatives: readonly string[]): string {
  const distinct = unique(alternatives);
  if (distinct.length === 0) return "^$";
  if (distinct.length === 1) return `^${distinct[0]}$`;
  return `^(${distinct.join("|")})$`;
}

function unique(values: readonly string[]): string[] {
  return [...new Set(values)];
}
