/**
 * Simulated nodes (`mesh lab`) sharing a connection. One connection per node is what a fleet has; thousands of them
 * in one process are not what is being measured. A group of lab nodes shares one connection whose identity is the
 * writers table's `lab` role for exactly that group: each node's own subjects, and no other node's.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { headers } from "@nats-io/transport-node";
import { controlSubject, declarationSubject, nodeSubjects, receiptSubject } from "../../link/index.js";
import type { NodeBus, NodeDelivery } from "../bus.js";
import { loadOrCreateAuthority, newUserKey, userJwt } from "./authority.js";
import { asBusError, connectNats } from "./connect.js";

/** One connection shared by a group of lab nodes, each with its own NodeBus over it. */
export class NatsLabConnection {
  private constructor(
    private readonly nc: NatsConnection,
    readonly nodes: readonly string[],
  ) {}

  /** Mints the group's identity with the mesh's account key (kept in `authorityDir`, the control plane's). */
  static async open(authorityDir: string, url: string, nodes: readonly string[]): Promise<NatsLabConnection> {
    const authority = loadOrCreateAuthority(authorityDir);
    const key = newUserKey();
    const jwt = await userJwt(authority, {
      name: `lab ${nodes[0] ?? ""} to ${nodes.at(-1) ?? ""}`,
      userPublicKey: key.publicKey,
      role: "lab",
      node: nodes,
    });
    const nc = await connectNats({
      url,
      identity: { jwt, seed: key.seed },
      name: `mesh lab ${nodes.length} nodes`,
      reconnect: true,
    });
    return new NatsLabConnection(nc, nodes);
  }

  /** The node's side of the broker over the shared connection. */
  nodeBus(node: string): NodeBus {
    if (!this.nodes.includes(node)) throw new Error(`node ${node} is not in this lab connection's group`);
    return new SharedNodeBus(this.nc, node);
  }

  async close(): Promise<void> {
    if (!this.nc.isClosed()) await this.nc.close();
  }
}

/** A node's bus over a shared connection: closing it ends the node's subscription, not the connection. */
class SharedNodeBus implements NodeBus {
  private subscription: Subscription | undefined;
  private ended: (error: Error | undefined) => void = () => undefined;
  private readonly ending: Promise<Error | undefined>;

  constructor(
    private readonly nc: NatsConnection,
    private readonly node: string,
  ) {
    this.ending = new Promise((resolve) => (this.ended = resolve));
    void nc
      .closed()
      .then((result) => this.ended(result instanceof Error ? asBusError(result, "the broker") : undefined));
  }

  async consumeNode(handle: (message: NodeDelivery) => Promise<void>): Promise<void> {
    const subscription = this.nc.subscribe(nodeSubjects(this.node));
    this.subscription = subscription;
    await this.nc.flush();
    for await (const msg of subscription) {
      if (msg.subject === declarationSubject(this.node))
        await handle({ kind: "declaration", body: msg.data });
      else if (msg.subject === receiptSubject(this.node)) await handle({ kind: "receipt", body: msg.data });
    }
  }

  publishReport(body: Uint8Array, id: string): Promise<void> {
    const header = headers();
    header.set("Nats-Msg-Id", id);
    try {
      this.nc.publish(controlSubject("report", this.node), body, { headers: header });
    } catch (error) {
      return Promise.reject(asBusError(error, "the broker"));
    }
    // Many nodes share the connection: its own flushing batches their reports instead of one round trip each.
    return Promise.resolve();
  }

  publishAlive(body: Uint8Array): Promise<void> {
    try {
      this.nc.publish(controlSubject("alive", this.node), body);
    } catch (error) {
      return Promise.reject(asBusError(error, "the broker"));
    }
    return Promise.resolve();
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
