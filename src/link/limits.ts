import { maxMessageBytes } from "./parse.js";
import type { Role } from "./writers.js";

/**
 * What the broker lets one identity, one node and the whole fleet hold: the one place these numbers are written,
 * each with its reason. The NATS adapter compiles them into user JWTs, the account JWT and the streams' configs;
 * the RabbitMQ adapter into the control queue's policy. Measured on nats-server 2.9.10 and RabbitMQ 3.10.8.
 */

/**
 * Room for headers on top of the contract's largest body: NATS counts them in a message's size (a user's or an
 * account's `payload` and a stream's `max_msg_size` are checked against headers plus body, measured). The mesh sends
 * no headers today; this leaves room for an id or a trace header, not for a second body.
 */
export const headerRoomBytes = 1024;

/** The largest message the broker takes from an identity of the mesh, headers included. */
export const largestBrokerMessage = maxMessageBytes + headerRoomBytes;

/** What one connection of a role may hold and send. `unlimited` only for the control plane, our own process. */
export interface IdentityLimits {
  /** Subscriptions one connection may hold: `perNode` for each node the identity acts for, plus `spare`. */
  readonly subscriptions: { readonly perNode: number; readonly spare: number } | "unlimited";
  /** The largest message it may publish, headers included. */
  readonly messageBytes: number | "unlimited";
}

/**
 * Per-identity limits, compiled into NATS user JWTs. A connection at its subscription limit is refused each further
 * one (it stays open); a message over its size closes the connection. A user JWT cannot limit how many connections
 * its holder opens (nats-server 2.9.10 has no such claim).
 */
export const identityLimits = {
  // `mesh-host join` holds one subscription (its request's reply inbox, under node.<name>.reply), measured.
  token: { subscriptions: { perNode: 1, spare: 3 }, messageBytes: largestBrokerMessage },
  // `mesh-host run` holds one (`node.<name>.>`), measured; the spare ones cover a request inbox and a resubscribe.
  node: { subscriptions: { perNode: 1, spare: 3 }, messageBytes: largestBrokerMessage },
  // A lab connection holds one `node.<name>.>` per node of its group, as the agent does for one.
  lab: { subscriptions: { perNode: 1, spare: 3 }, messageBytes: largestBrokerMessage },
  // The control plane's subscriptions grow with its work (JetStream consumers, lease watchers, the CLI's questions).
  control: { subscriptions: "unlimited", messageBytes: "unlimited" },
} as const satisfies Readonly<Record<Role, IdentityLimits>>;

/** How many subscriptions one connection of `role`, acting for `nodes` nodes, may hold; undefined: no limit. */
export function subscriptionLimit(role: Role, nodes: number): number | undefined {
  const { subscriptions }: IdentityLimits = identityLimits[role];
  if (subscriptions === "unlimited") return undefined;
  return subscriptions.perNode * Math.max(1, nodes) + subscriptions.spare;
}

/** The largest message one identity of `role` may publish, headers included; undefined: no limit of its own. */
export function messageLimit(role: Role): number | undefined {
  const { messageBytes }: IdentityLimits = identityLimits[role];
  return messageBytes === "unlimited" ? undefined : messageBytes;
}

/** The fleet one control plane is built for (DESIGN.md §5); the backlogs below are sized for it. */
export const fleetNodes = 10_000;

/**
 * How many of one node's reports wait for the control plane at most. A newer report of the node pushes out its own
 * oldest, never another node's: its reports supersede each other by the ordering rule, and its agent sends the
 * pending one again until a receipt comes, so losing an older one is harmless. A node that behaves has one or two
 * waiting; 32 leaves room for a burst (the bench preloads 19 a node, a conformance test sends 20 at once) and holds
 * a flood to 32 MiB a node and to 32 messages ahead of another node's report.
 */
export const reportsKeptPerNode = 32;

/** How many reports a node that behaves has waiting, for sizing: its pending one and a few after a burst. */
const reportsWaitingPerNode = 4;

/** A report naming some four hundred items (~60 bytes each); larger ones fit too, fewer of them. */
const typicalReportBytes = 25 * 1024;

/**
 * The most the waiting reports may take: every node of the fleet with its waiting reports (10,000 × 4 × 25 KiB,
 * ~977 MiB). One node's share is at most 32 × 1 MiB, so it can push out another node's oldest report only together
 * with some 30 others flooding at once, and that node's agent sends it again. The broker sets this much disk aside
 * when the stream is made.
 */
export const reportBacklogBytes = fleetNodes * reportsWaitingPerNode * typicalReportBytes;

/**
 * The window in which the report stream drops a repeated `Nats-Msg-Id`: the server's minimum (2.9.10 refuses less
 * than 100 ms, and 0 means its default of 2 minutes). Reports carry no id; the ordering rule refuses repeats.
 */
export const reportDuplicateWindowMs = 100;

/** An alive as the agent sends it (measured: 142 bytes with a 17-character name), with room for a longer name. */
const typicalAliveBytes = 200;
/** The agent's default interval between alives. */
const aliveEveryS = 15;
/** How long a control plane may be away before RabbitMQ's control queue refuses more. */
const outageHoursHeld = 3;

/**
 * The most RabbitMQ's control queue may hold. The queue has no per-node limit, and every alive waits in it too
 * (NATS keeps only each node's newest): the fleet's waiting reports as above, plus three hours of the fleet's alives
 * (10,000 × 240 an hour × 200 bytes, 480 MB an hour) while no control plane consumes.
 */
export const controlQueueBacklogBytes =
  reportBacklogBytes + fleetNodes * (3600 / aliveEveryS) * typicalAliveBytes * outageHoursHeld;
