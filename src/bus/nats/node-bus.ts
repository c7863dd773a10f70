/** A node on NATS: its own identity, its own subjects, and nothing else (the server enforces that). */
import type { NatsConnection } from "@nats-io/transport-node";
import {
  NoRespondersError,
  PermissionViolationError,
  RequestError,
  TimeoutError,
} from "@nats-io/transport-node";
import {
  controlSubject,
  declarationSubject,
  inboxPrefix,
  nodeSubjects,
  receiptSubject,
} from "../../link/index.js";
import type { EnrolmentBus, NodeBus, NodeDelivery } from "../bus.js";
import { BrokerRefusedIdentity, BusError, NobodyAnswers } from "../errors.js";
import type { Logger } from "../../log.js";
import { errorText } from "../../log.js";
import type { NatsIdentity } from "./connect.js";
import { asBusError, connectNats } from "./connect.js";

export class NatsNodeBus implements NodeBus {
  private constructor(
    private readonly nc: NatsConnection,
    private readonly node: string,
  ) {}

  /** Connects as the node; the connection reconnects by itself after any outage, and `log` is told of both. */
  static async open(url: string, node: string, identity: NatsIdentity, log?: Logger): Promise<NatsNodeBus> {
    const nc = await connectNats({
      url,
      identity,
      name: `mesh-host ${node}`,
      inboxPrefix: inboxPrefix(node),
      reconnect: true,
    });
    if (log !== undefined) {
      NatsNodeBus.tellConnection(nc, url, log).catch((error: unknown) =>
        log.warn("broker.status_unread", { broker: url, error: errorText(error) }),
      );
    }
    return new NatsNodeBus(nc, node);
  }

  /** Logs each loss of the connection and each return, until it closes. */
  private static async tellConnection(nc: NatsConnection, broker: string, log: Logger): Promise<void> {
    for await (const status of nc.status()) {
      if (status.type === "disconnect") log.warn("broker.disconnected", { broker });
      else if (status.type === "reconnect") log.info("broker.reconnected", { broker });
    }
  }

  async consumeNode(handle: (message: NodeDelivery) => Promise<void>): Promise<void> {
    const subscription = this.nc.subscribe(nodeSubjects(this.node));
    // A flush still waiting when the connection closes is never answered: the close ends the wait instead (and the
    // subscription, closed with the connection, ends the loop below at once).
    try {
      await Promise.race([this.nc.flush(), this.nc.closed()]);
      for await (const msg of subscription) {
        if (msg.subject === declarationSubject(this.node))
          await handle({ kind: "declaration", body: msg.data });
        else if (msg.subject === receiptSubject(this.node)) await handle({ kind: "receipt", body: msg.data });
        // Anything else under the node's subjects (replies to its own requests) is answered elsewhere.
      }
    } catch (error) {
      // A refused subscription ends here, in the bus's words (the connection itself may stay open).
      throw asBusError(error, "the broker");
    }
  }

  async publishReport(body: Uint8Array): Promise<void> {
    // A plain publish: no reply subject, so the broker answers nobody, and no message id (see NodeBus). Flushing
    // makes a broken connection show here rather than later.
    this.nc.publish(controlSubject("report", this.node), body);
    try {
      await this.nc.flush();
    } catch (error) {
      throw asBusError(error, "the broker");
    }
  }

  async publishAlive(body: Uint8Array): Promise<void> {
    // An alive that is lost is replaced by the next one; it is not worth waiting for the stream's answer.
    this.nc.publish(controlSubject("alive", this.node), body);
    await Promise.resolve();
  }

  async closed(): Promise<Error | undefined> {
    const result = await this.nc.closed();
    return result instanceof Error ? asBusError(result, "the broker") : undefined;
  }

  async close(): Promise<void> {
    if (!this.nc.isClosed()) await this.nc.close();
  }
}

/** A joining node's one question, asked with the token's identity. */
export class NatsEnrolmentBus implements EnrolmentBus {
  private constructor(
    private readonly nc: NatsConnection,
    private readonly node: string,
    private readonly url: string,
  ) {}

  static async open(url: string, node: string, identity: NatsIdentity): Promise<NatsEnrolmentBus> {
    const nc = await connectNats({
      url,
      identity,
      name: `mesh-host join ${node}`,
      inboxPrefix: inboxPrefix(node),
      reconnect: false,
    });
    return new NatsEnrolmentBus(nc, node, url);
  }

  async ask(body: Uint8Array, timeoutMs: number): Promise<Uint8Array> {
    const subject = controlSubject("enrol", this.node);
    // A refused publish is dropped silently and only reported on the status stream; without watching it, a token
    // for another node would wait out the whole timeout instead of being refused at once.
    const refused = this.refusal();
    try {
      const reply = await Promise.race([
        this.nc.request(subject, body, { timeout: timeoutMs }),
        refused.promise,
      ]);
      return reply.data;
    } catch (error) {
      // The client wraps a no-responders status in a RequestError; a timeout comes as its own class.
      if (error instanceof NoRespondersError || (error instanceof RequestError && error.isNoResponders())) {
        throw new NobodyAnswers(`no control plane is answering at ${this.url}`, { cause: error });
      }
      if (error instanceof TimeoutError) {
        throw new BusError(
          "timeout",
          `the control plane at ${this.url} did not answer within ${timeoutMs} ms`,
          {
            cause: error,
          },
        );
      }
      throw asBusError(error, this.url);
    } finally {
      refused.stop();
    }
  }

  private refusal(): { promise: Promise<never>; stop(): void } {
    const statuses = this.nc.status()[Symbol.asyncIterator]();
    // Only ever awaited inside Promise.race, which also handles a rejection that comes after the race is decided.
    const promise = (async (): Promise<never> => {
      for (;;) {
        const next = await statuses.next();
        if (next.done === true) return new Promise<never>(() => undefined);
        const status = next.value;
        // A refused publish of the question, or a refused subscription to where the answer would come.
        if (status.type === "error" && status.error instanceof PermissionViolationError) {
          throw new BrokerRefusedIdentity(`the broker refused this identity: ${status.error.message}`, {
            cause: status.error,
          });
        }
      }
    })();
    return { promise, stop: () => void statuses.return?.() };
  }

  async close(): Promise<void> {
    if (!this.nc.isClosed()) await this.nc.close();
  }
}
