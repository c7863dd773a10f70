/**
 * Simulated nodes (`mesh lab`) sharing a connection. One connection per node is what a fleet has; thousands of them
 * in one process are not what is being measured. A group of lab nodes shares one connection whose identity is the
 * writers table's `lab` role for exactly that group: each node's own subjects, and no other node's.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { controlSubject, declarationSubject, nodeSubjects, receiptSubject } from "../../link/index.js";
import type { NodeBus, NodeDelivery } from "../bus.js";
import { MeshError } from "../../errors.js";
import { loadOrCreateAuthority, newUserKey, userJwt } from "./authority.js";
import { asBusError, connectNats, socketOf } from "./connect.js";

/**
 * nats-server's default `max_control_line`. The CONNECT line carries the identity's JWT, which names every node of the
 * group; a longer line is refused, and the client would only try again and again.
 */
export const maxControlLine = 4096;
/** What the CONNECT line holds besides the JWT: the signed nonce, the connection's name, the client's options. */
const connectLineRest = 640;

/**
 * The connections shared by a group of lab nodes, each with its own NodeBus over them. A group whose identity would
 * not fit a CONNECT line is split in halves until each part's does, so any group size works with any node names.
 */
export class NatsLabConnection {
  private constructor(
    /** Each node's connection, with what its nodes publish in the current turn of the event loop. */
    private readonly connections: ReadonlyMap<string, TurnPublisher>,
    /** Every connection opened, once each. */
    private readonly opened: readonly NatsConnection[],
  ) {}

  /** Mints each part's identity with the mesh's account key (kept in `authorityDir`, the control plane's). */
  static async open(authorityDir: string, url: string, nodes: readonly string[]): Promise<NatsLabConnection> {
    const authority = loadOrCreateAuthority(authorityDir);
    const connections = new Map<string, TurnPublisher>();
    const opened: NatsConnection[] = [];
    const openPart = async (part: readonly string[]): Promise<void> => {
      const key = newUserKey();
      const jwt = await userJwt(authority, {
        name: `lab ${part[0] ?? ""} to ${part.at(-1) ?? ""}`,
        userPublicKey: key.publicKey,
        role: "lab",
        node: part,
      });
      if (jwt.length + connectLineRest > maxControlLine) {
        if (part.length === 1) {
          throw new MeshError(
            "lab_identity_too_long",
            `the lab identity of node ${part[0] ?? ""} alone is ${jwt.length} bytes, more than a CONNECT line holds (${maxControlLine})`,
          );
        }
        const half = Math.ceil(part.length / 2);
        await openPart(part.slice(0, half));
        await openPart(part.slice(half));
        return;
      }
      const nc = await connectNats({
        url,
        identity: { jwt, seed: key.seed },
        name: `mesh lab ${part.length} nodes`,
        reconnect: true,
      });
      opened.push(nc);
      const publisher = new TurnPublisher(nc);
      for (const node of part) connections.set(node, publisher);
    };
    try {
      await openPart(nodes);
    } catch (error) {
      // The failure that stopped the opening is the one to tell, whatever closing the others says.
      await Promise.allSettled(opened.map((nc) => nc.close()));
      throw error;
    }
    return new NatsLabConnection(connections, opened);
  }

  /**
   * Stops reading from the broker on every connection of the group, until `resumeReading`: what the broker sends
   * meanwhile waits in the sockets, in order, and costs this process nothing until then. What the nodes publish
   * still goes out.
   */
  pauseReading(): void {
    for (const nc of this.opened) socketOf(nc)?.pause();
  }

  /** Reads again what the broker sent while paused, and on. */
  resumeReading(): void {
    for (const nc of this.opened) socketOf(nc)?.resume();
  }

  /** How many connections the group's nodes share. */
  get parts(): number {
    return this.opened.length;
  }

  /** The node's side of the broker over the connection its part shares. */
  nodeBus(node: string): NodeBus {
    const publisher = this.connections.get(node);
    if (publisher === undefined) throw new Error(`node ${node} is not in this lab connection's group`);
    return new SharedNodeBus(publisher, node);
  }

  /** Closes every connection, each whatever became of the others; the first failure is then thrown. */
  async close(): Promise<void> {
    const results = await Promise.allSettled(
      this.opened.filter((nc) => !nc.isClosed()).map((nc) => nc.close()),
    );
    const failed = results.find((result) => result.status === "rejected");
    if (failed !== undefined) throw asBusError(failed.reason, "the broker");
  }
}

/**
 * What the nodes of a shared connection publish, handed to the client together once per turn of the event loop: the
 * client writes what it was handed within one turn in one write. Handed over one by one, each node's report (made
 * as its own signature check came back) was a socket write of its own: an eighth of the lab's CPU while a fleet of
 * 10,000 applied.
 */
class TurnPublisher {
  private queued: { subject: string; body: Uint8Array; sent: (error: Error | undefined) => void }[] = [];

  constructor(readonly nc: NatsConnection) {}

  /** Resolves once the client has the message, as a publish on the connection itself would return. */
  publish(subject: string, body: Uint8Array): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.queued.length === 0) setImmediate(() => this.hand());
      this.queued.push({ subject, body, sent: (error) => (error === undefined ? resolve() : reject(error)) });
    });
  }

  private hand(): void {
    const queued = this.queued;
    this.queued = [];
    for (const { subject, body, sent } of queued) {
      try {
        this.nc.publish(subject, body);
        sent(undefined);
      } catch (error) {
        sent(asBusError(error, "the broker"));
      }
    }
  }
}

/** A node's bus over a shared connection: closing it ends the node's subscription, not the connection. */
class SharedNodeBus implements NodeBus {
  private subscription: Subscription | undefined;
  private ended: (error: Error | undefined) => void = () => undefined;
  private readonly ending: Promise<Error | undefined>;
  private readonly nc: NatsConnection;

  constructor(
    private readonly publisher: TurnPublisher,
    private readonly node: string,
  ) {
    const nc = publisher.nc;
    this.nc = nc;
    this.ending = new Promise((resolve) => (this.ended = resolve));
    void nc
      .closed()
      .then((result) => this.ended(result instanceof Error ? asBusError(result, "the broker") : undefined));
  }

  async consumeNode(handle: (message: NodeDelivery) => Promise<void>): Promise<void> {
    const declaration = declarationSubject(this.node);
    const receipt = receiptSubject(this.node);
    // Thousands of nodes share this process: each delivery is taken as it is read (no iterator of its own per node,
    // which cost the lab about twice as much CPU per delivery) and handled in order, one at a time.
    let handled = Promise.resolve();
    let failure: { error: unknown } | undefined;
    const subscription = this.nc.subscribe(nodeSubjects(this.node), {
      callback: (error, msg) => {
        if (error !== null) {
          failure ??= { error: asBusError(error, "the broker") };
          return;
        }
        const kind =
          msg.subject === declaration ? "declaration" : msg.subject === receipt ? "receipt" : undefined;
        if (kind === undefined || failure !== undefined) return;
        const body = msg.data;
        handled = handled.then(async () => {
          if (failure !== undefined) return;
          try {
            await handle({ kind, body });
          } catch (error) {
            // What the handler could not take ends the node's consuming, as it would end a loop over the deliveries.
            failure ??= { error };
            subscription.unsubscribe();
          }
        });
      },
    });
    this.subscription = subscription;
    try {
      await this.nc.flush();
    } catch (error) {
      // Not subscribed as far as anyone knows: nothing more is handled (the client would subscribe it again on a
      // reconnect), and the node is told why.
      failure ??= { error: asBusError(error, "the broker") };
      subscription.unsubscribe();
    }
    const closed = await subscription.closed;
    await handled;
    if (failure !== undefined) throw failure.error;
    if (closed instanceof Error) throw asBusError(closed, "the broker");
  }

  publishReport(body: Uint8Array): Promise<void> {
    // Many nodes share the connection: their reports go out together instead of one round trip each.
    return this.publisher.publish(controlSubject("report", this.node), body);
  }

  publishAlive(body: Uint8Array): Promise<void> {
    return this.publisher.publish(controlSubject("alive", this.node), body);
  }

  closed(): Promise<Error | undefined> {
    return this.ending;
  }

  close(): Promise<void> {
    this.subscription?.unsubscribe();
    this.ended(undefined);
    return Promise.resolve();
  }
}
