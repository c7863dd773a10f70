/**
 * The Bus in the mesh's words. The control plane and the agent see only these interfaces; each broker has its
 * adapter behind them, and nothing outside src/bus/ touches a broker client.
 */
import type { NodeCredential, TokenCredential } from "../link/index.js";

/** A node-published message taken from the control queue. The node is the one its subject or routing names. */
export interface ControlDelivery {
  kind: "report" | "alive";
  /**
   * The node the broker says published it (the subject's node; on RabbitMQ the validated user), or undefined when
   * the subject names no valid node — the handler refuses such a message.
   */
  node: string | undefined;
  body: Uint8Array;
  /** True when the broker delivers it again (the consumer died before acknowledging). */
  redelivered: boolean;
  /** When the broker received it: liveness is about when a node spoke, not when we got round to reading it. */
  receivedAt: Date;
  /**
   * The broker identity that published it, where the broker vouches for it (RabbitMQ checks a message's user_id
   * against its connection's account). Where it does not (NATS), `receivedAt` is the broker's own time instead.
   */
  identity?: string;
  /**
   * Set when the broker routed the message in a way its permissions did not check (RabbitMQ: `CC` headers add
   * routing keys past the topic permissions), saying so; the handler refuses it.
   */
  misrouted?: string;
}

/** What a handler decided: `done` acknowledges (also for refused input), `retry` asks for a later redelivery. */
export type DeliveryOutcome = "done" | "retry";

/** An enrolment request from a token's identity; the answer goes back to the requester alone. */
export interface EnrolRequest {
  node: string;
  body: Uint8Array;
  /** As for a delivery: set when the broker routed the question past its permissions; it is refused. */
  misrouted?: string;
}

/** The answer to an enrolment, and what to do once it is on its way (revoking the token's identity, say). */
export interface EnrolAnswer {
  reply: Uint8Array;
  afterReply?: () => Promise<void>;
}

/** Decides a batch of deliveries: one outcome for each, in the same order. */
export type ControlHandler = (batch: readonly ControlDelivery[]) => Promise<DeliveryOutcome[]>;

/**
 * The most deliveries handed to the control plane at once: one transaction and one acknowledgement each. 512 rather
 * than 256: a backlog of 200,000 alives and reports from 10,000 nodes on NATS was drained about 4 % sooner (four runs
 * a side, alternated); the consumers' 1,024 unacknowledged messages still hold two batches, one handled while the
 * next arrives.
 */
export const controlBatchMax = 512;

/** The control plane's side of the broker. */
export interface ControlBus {
  /** Creates what the mesh needs on the broker (streams, queues, consumers). Idempotent. */
  assert(): Promise<void>;
  /** Answers enrolment requests as they come; returns when the subscription is in place. */
  answerEnrolments(answer: (request: EnrolRequest) => Promise<EnrolAnswer>): Promise<void>;
  /**
   * Consumes the control queue until closed. What has arrived is handed over in batches, in arrival order (at most
   * `controlBatchMax` at once); the handler gives one outcome per delivery, and each is acknowledged by it.
   */
  consumeControl(handle: ControlHandler): Promise<void>;
  /** Sends a signed declaration envelope straight to the node's own queue. */
  publishDeclaration(node: string, envelope: Uint8Array): Promise<void>;
  /** Sends many, each to its node's queue, waiting for the broker once for all of them. */
  publishDeclarations(batch: readonly { node: string; envelope: Uint8Array }[]): Promise<void>;
  /** Tells a node its report was taken, so it stops sending it again. */
  publishReceipt(node: string, receipt: Uint8Array): Promise<void>;
  /** Announces a decision on `mesh.event.<kind>`. */
  publishEvent(kind: string, body: Uint8Array): Promise<void>;
  /** Calls `listener` each time the connection comes back after a loss (the broker may have restarted). */
  onReconnect(listener: () => void): void;
  /**
   * How many node messages wait in the control queue, not yet handled. One round trip to the broker each: an answer
   * is also the proof that the control plane hears the broker now.
   */
  backlog(): Promise<number>;
  close(): Promise<void>;
}

/** What arrives in a node's queue. */
export interface NodeDelivery {
  kind: "declaration" | "receipt";
  body: Uint8Array;
}

/** A node's side of the broker, on its own identity. */
export interface NodeBus {
  /** Delivers everything sent to the node's queue, in order, until closed. */
  consumeNode(handle: (message: NodeDelivery) => Promise<void>): Promise<void>;
  /**
   * Sends a report towards the control plane's queue. It is not final until a receipt for it arrives. It carries
   * no message id for the broker to deduplicate by: on JetStream such ids are shared by every publisher of the
   * stream, so a node could choose another node's next id and have that node's report dropped. A repeat is
   * refused by the ordering rule instead.
   */
  publishReport(body: Uint8Array): Promise<void>;
  publishAlive(body: Uint8Array): Promise<void>;
  /** Resolves when the connection is closed for good (closed by us, or refused by the broker). */
  closed(): Promise<Error | undefined>;
  close(): Promise<void>;
}

/** A token's side of the broker: one question, one answer. */
export interface EnrolmentBus {
  ask(body: Uint8Array, timeoutMs: number): Promise<Uint8Array>;
  close(): Promise<void>;
}

// The credentials' types come from their schemas in the wire contract: the token's and the enrol reply's.
export type { NodeCredential, TokenCredential } from "../link/index.js";

/**
 * Broker identities, compiled from the writers table: one per token (expiring with it), one per node, and their
 * revocation. `user` is the broker's name for the identity, kept in the store so it can be revoked later.
 */
export interface BrokerIdentities {
  readonly url: string;
  /** A token's identity; on brokers that take passwords, the token's secret is its password. */
  forToken(token: {
    id: string;
    node: string;
    secret: string;
    expiresAt: Date;
  }): Promise<{ user: string; credential: TokenCredential }>;
  /** `nodeUser` is the broker user key the node made itself (NATS); brokers that name users themselves ignore it. */
  forNode(node: string, nodeUser: string | undefined): Promise<{ user: string; credential: NodeCredential }>;
  /** Makes the broker refuse exactly these users from now on (the full current set, user → since when). */
  revoke(revoked: ReadonlyMap<string, Date>): Promise<void>;
  close(): Promise<void>;
}
