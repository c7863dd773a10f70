/**
 * A node on RabbitMQ: its own account, its own queue, and the `mesh` exchange with the routing keys `report` and
 * `alive` only (the broker enforces both). Every publish carries the account as `user_id`, which the broker checks.
 */
import { randomUUID } from "node:crypto";
import type { ConsumeMessage } from "amqplib";
import { IllegalOperationError } from "amqplib";
import { controlQueue, controlRoutingKey, meshExchange, nodeQueue } from "../../link/index.js";
import type { Logger } from "../../log.js";
import type { EnrolmentBus, NodeBus, NodeDelivery } from "../bus.js";
import { BusError, NobodyAnswers } from "../errors.js";
import type { AmqpAddress } from "./link.js";
import { AmqpLink, asAmqpError, PublishChannel, replyCodeOf } from "./link.js";

/** Declarations in flight to one node: it applies them one at a time anyway. */
const nodePrefetch = 16;
const directReplyTo = "amq.rabbitmq.reply-to";

export class AmqpNodeBus implements NodeBus {
  private readonly publisher: PublishChannel;
  private stopConsuming: () => void = () => undefined;

  private constructor(
    private readonly link: AmqpLink,
    private readonly node: string,
    private readonly user: string,
  ) {
    this.publisher = new PublishChannel(link);
  }

  /** Connects as the node; the connection comes back by itself after any outage, until the account is deleted. */
  static async open(
    address: AmqpAddress,
    node: string,
    credential: { username: string; password: string },
    log?: Logger,
  ): Promise<AmqpNodeBus> {
    const link = await AmqpLink.open({
      address,
      username: credential.username,
      password: credential.password,
      name: `mesh-host ${node}`,
      reconnect: true,
      ...(log === undefined ? {} : { log }),
    });
    return new AmqpNodeBus(link, node, credential.username);
  }

  async consumeNode(handle: (message: NodeDelivery) => Promise<void>): Promise<void> {
    const stopped = new Promise<void>((resolve) => (this.stopConsuming = resolve));
    let queue: Promise<void> = Promise.resolve();
    let fail: (error: unknown) => void = () => undefined;
    // A handler that throws ends the consumption with its error, as on any other bus.
    const failed = new Promise<never>((_resolve, reject) => (fail = reject));
    const consuming = this.link.onEveryConnection(async (connection) => {
      const channel = await connection.createChannel();
      await channel.prefetch(nodePrefetch);
      await channel.consume(
        nodeQueue(this.node),
        (message: ConsumeMessage | null) => {
          if (message === null) return;
          queue = queue
            .then(async () => {
              // Anything but a receipt is a declaration to check: a stray message is refused and reported there.
              const kind = message.properties.type === "receipt" ? "receipt" : "declaration";
              await handle({ kind, body: message.content });
              // Acknowledged once handled; if the connection went meanwhile, the broker delivers it again and the
              // agent knows a declaration it already applied.
              try {
                channel.ack(message);
              } catch (error) {
                if (!(error instanceof IllegalOperationError)) throw error;
              }
            })
            .catch((error: unknown) => fail(error));
        },
        { noAck: false },
      );
    });
    // A consume the broker refuses (another account's queue) fails here, in the bus's words; the connection stays.
    await consuming.catch((error: unknown) => {
      throw asAmqpError(error, this.link.where);
    });
    await Promise.race([stopped, this.link.closed(), failed]);
    await queue;
  }

  async publishReport(body: Uint8Array): Promise<void> {
    await this.publisher.publish(meshExchange, controlRoutingKey("report"), body, {
      persistent: true,
      userId: this.user,
      timestamp: Math.floor(Date.now() / 1000),
      contentType: "application/json",
    });
  }

  async publishAlive(body: Uint8Array): Promise<void> {
    await this.publisher.publish(meshExchange, controlRoutingKey("alive"), body, {
      persistent: false,
      userId: this.user,
      timestamp: Math.floor(Date.now() / 1000),
      contentType: "application/json",
    });
  }

  closed(): Promise<Error | undefined> {
    return this.link.closed();
  }

  async close(): Promise<void> {
    this.stopConsuming();
    await this.publisher.close();
    await this.link.close();
  }
}

/** Whether the broker said it has no such thing (404), itself or under one of the mesh's errors. */
function notFound(error: unknown): boolean {
  return replyCodeOf(error) === 404 || (error instanceof Error && replyCodeOf(error.cause) === 404);
}

/** A joining node's one question, asked with the token's account, answered through direct reply-to. */
export class AmqpEnrolmentBus implements EnrolmentBus {
  private constructor(
    private readonly link: AmqpLink,
    private readonly user: string,
  ) {}

  static async open(
    address: AmqpAddress,
    node: string,
    credential: { username: string; password: string },
  ): Promise<AmqpEnrolmentBus> {
    const link = await AmqpLink.open({
      address,
      username: credential.username,
      password: credential.password,
      name: `mesh-host join ${node}`,
      reconnect: false,
    });
    return new AmqpEnrolmentBus(link, credential.username);
  }

  async ask(body: Uint8Array, timeoutMs: number): Promise<Uint8Array> {
    const channel = await this.link.channel();
    let refusal: Error | undefined;
    const refused = new Promise<never>((_resolve, reject) => {
      channel.on("error", (error: Error) => {
        refusal = error;
        reject(asAmqpError(error, this.link.where));
      });
    });
    // Only ever awaited inside Promise.race; a refusal after the race is decided is already reported.
    refused.catch((error: unknown) => (refusal = error as Error));
    // A connection the broker closes fails no channel operation under way: without this the join would wait out
    // its whole timeout for an answer that can no longer come.
    const lost = this.link.closed().then((ended): never => {
      throw ended ?? new BusError("broker", `the connection to the broker at ${this.link.where} was closed`);
    });
    const nobody = () => new NobodyAnswers(`no control plane is answering at ${this.link.where}`);
    /** Whether the question went out: before it has, nothing was read, and a join may ask again. */
    let published = false;
    // Raced at once below (the race handles its settling later too, when the link is closed after the ask).
    try {
      const control = await Promise.race([channel.checkQueue(controlQueue), refused, lost]);
      if (control.consumerCount === 0) throw nobody();
      const correlationId = randomUUID();
      const answered = new Promise<Uint8Array>((resolve) => {
        void channel.consume(
          directReplyTo,
          (message) => {
            if (message !== null && message.properties.correlationId === correlationId)
              resolve(message.content);
          },
          { noAck: true },
        );
      });
      published = true;
      channel.publish(meshExchange, controlRoutingKey("enrol"), Buffer.from(body), {
        replyTo: directReplyTo,
        correlationId,
        userId: this.user,
        // A question nobody took in time is not answered later, when nobody waits (that would spend the token).
        expiration: String(timeoutMs),
        contentType: "application/json",
      });
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<never>((_resolve, reject) => {
        timer = setTimeout(
          () =>
            reject(
              new BusError(
                "timeout",
                `the control plane at ${this.link.where} did not answer within ${timeoutMs} ms`,
              ),
            ),
          timeoutMs,
        );
      });
      try {
        return await Promise.race([answered, refused, lost, timedOut]);
      } finally {
        clearTimeout(timer);
      }
    } catch (error) {
      // No control queue at all (no control plane ever ran on this vhost): nobody answers, as with no consumer.
      if (!published && [error, refusal].some(notFound)) throw nobody();
      if (error instanceof BusError) throw error;
      if (refusal !== undefined) throw asAmqpError(refusal, this.link.where);
      throw asAmqpError(error, this.link.where);
    } finally {
      // Closed after each question: a join asking again for minutes would otherwise hold a channel and its reply
      // consumer per question. One the broker closed (a refusal, a missing queue, the connection gone) is closed.
      if (refusal === undefined) {
        await channel.close().catch((error: unknown) => {
          if (!(error instanceof IllegalOperationError)) throw error;
        });
      }
    }
  }

  async close(): Promise<void> {
    await this.link.close();
  }
}
