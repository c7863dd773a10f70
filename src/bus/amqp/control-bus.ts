/**
 * The control plane on RabbitMQ. Nodes publish to the durable topic exchange `mesh`; the durable queue `control`,
 * bound for enrol, report and alive, is consumed by one consumer at a time (single active consumer: a second one
 * waits as the broker's standby and never splits the traffic). Declarations and receipts go straight to a node's
 * own queue through the default exchange. Every node message carries `user_id`, which the broker has checked
 * against the connection, so the node a message comes from is the one its user names.
 */
import type { Channel, ChannelModel, ConsumeMessage } from "amqplib";
import {
  controlQueue,
  controlQueueKinds,
  controlRoutingKey,
  defaultExchange,
  eventRoutingKey,
  meshExchange,
  nodeQueue,
} from "../../link/index.js";
import type { Logger } from "../../log.js";
import { errorText, WarningWindow } from "../../log.js";
import { BusError } from "../errors.js";
import { Arrivals } from "../batches.js";
import { controlBatchMax } from "../bus.js";
import type {
  ControlBus,
  ControlDelivery,
  ControlHandler,
  DeliveryOutcome,
  EnrolAnswer,
  EnrolRequest,
} from "../bus.js";
import type { AmqpLink } from "./link.js";
import { PublishChannel } from "./link.js";
import type { MeshUsers } from "./users.js";

/** Direct reply-to: the only place an enrolment is ever answered. */
const directReplyTo = "amq.rabbitmq.reply-to";
/** Messages handed to the control plane before it acknowledges any: enough to keep it busy, few to redeliver. */
const controlPrefetch = 1024;
/** How long a message the handler gave back waits before the broker offers it again. */
const retryAfterMs = 1000;
/** How much of a property a sender chose is logged. */
const astrayShown = 256;
/** Enrolments answered side by side: each makes an account and a queue through the management API. */
const enrolmentsAtOnce = 32;

/** A message and the channel it is acknowledged on. */
interface Arrived {
  channel: Channel;
  message: ConsumeMessage;
}

const isEnrol = (message: ConsumeMessage) => message.fields.routingKey === controlRoutingKey("enrol");

/**
 * RabbitMQ checks topic permissions against a message's routing key only: `CC` and `BCC` headers route it to further
 * keys unchecked. A message that carries them is refused, whatever it says. (`BCC` is taken off before delivery, so
 * only `CC` can be seen here: a BCC copy arrives as an exact repeat under the checked key, which the ordering rule
 * and the single-use token already refuse.)
 */
function misrouted(message: ConsumeMessage): { misrouted: string } | Record<string, never> {
  const headers = (message.properties.headers ?? {}) as Record<string, unknown>;
  const extra = ["CC", "BCC"].filter((name) => headers[name] !== undefined);
  if (extra.length === 0) return {};
  return {
    misrouted: `it carried ${extra.join(" and ")} header(s), which route a message past the broker's topic permissions`,
  };
}

export class AmqpControlBus implements ControlBus {
  private readonly publisher: PublishChannel;
  private answer: ((request: EnrolRequest) => Promise<EnrolAnswer>) | undefined;
  private consumer: { channel: Channel; tag: string } | undefined;
  private stopConsuming: () => void = () => undefined;
  private closing = false;
  private probe: Promise<Channel> | undefined;
  /** Messages as they arrive, handed over in order. */
  private readonly arrivals = new Arrivals<Arrived>();
  /**
   * Each channel's delivery tags not yet acknowledged or handed back, in the order they came: a batch may be
   * acknowledged with one frame only when nothing before it on its channel is still open (an enrolment being
   * answered, a message waiting to be handed back).
   */
  private readonly open = new Map<Channel, Set<number>>();
  private queue: Promise<void> = Promise.resolve();
  /** What a sender sends astray is told once a minute per sender. */
  private readonly astray: WarningWindow;

  constructor(
    private readonly link: AmqpLink,
    private readonly users: MeshUsers,
    private readonly log: Logger,
  ) {
    this.publisher = new PublishChannel(link);
    this.astray = new WarningWindow(log);
  }

  async assert(): Promise<void> {
    // Done again on every connection: a broker that lost them (a new node, a reset) gets them back.
    await this.link.onEveryConnection(async (connection) => {
      const channel = await connection.createChannel();
      await channel.assertExchange(meshExchange, "topic", { durable: true });
      await channel.assertQueue(controlQueue, {
        durable: true,
        arguments: { "x-single-active-consumer": true },
      });
      for (const kind of controlQueueKinds)
        await channel.bindQueue(controlQueue, meshExchange, controlRoutingKey(kind));
      await channel.close();
    });
  }

  async answerEnrolments(answer: (request: EnrolRequest) => Promise<EnrolAnswer>): Promise<void> {
    // Enrolments arrive on the control queue with the rest; they are answered as they come off it.
    this.answer = answer;
    await Promise.resolve();
  }

  async consumeControl(handle: ControlHandler): Promise<void> {
    const stopped = new Promise<void>((resolve) => (this.stopConsuming = resolve));
    this.queue = this.work(handle);
    await this.link.onEveryConnection((connection) => this.startConsumer(connection));
    await stopped;
    this.arrivals.end();
    await this.queue;
  }

  private async startConsumer(connection: ChannelModel): Promise<void> {
    if (this.closing) return;
    const channel = await connection.createChannel();
    channel.on("error", (error: Error) =>
      this.log.warn("control.channel_error", { error: errorText(error) }),
    );
    await channel.prefetch(controlPrefetch);
    const { consumerTag } = await channel.consume(
      controlQueue,
      (message) => {
        if (message === null) {
          // The broker cancelled the consumer (the queue was deleted): it is made again on the next connection.
          this.log.error("control.consumer_cancelled", { queue: controlQueue });
          return;
        }
        let tags = this.open.get(channel);
        if (tags === undefined) {
          tags = new Set();
          this.open.set(channel, tags);
          channel.once("close", () => this.open.delete(channel));
        }
        tags.add(message.fields.deliveryTag);
        this.arrivals.push({ channel, message });
      },
      { noAck: false },
    );
    this.consumer = { channel, tag: consumerTag };
  }

  /**
   * Handles what arrives, in order, in runs: each enrolment begun as it comes off the queue, beside those already
   * begun (each is a different token, and a node can send nothing else before its enrolment is answered), up to
   * `enrolmentsAtOnce`; the reports and alives between them in batches, without waiting for the enrolments. An
   * enrolment waits on the management API and the broker's confirms: answered side by side, joiners do not wait
   * for the slowest of a group.
   */
  private async work(handle: ControlHandler): Promise<void> {
    const enrolling = new Set<Promise<void>>();
    for await (const arrived of this.arrivals.batches(controlBatchMax)) {
      let start = 0;
      while (start < arrived.length) {
        const enrols = isEnrol((arrived[start] as Arrived).message);
        let end = start;
        while (end < arrived.length && isEnrol((arrived[end] as Arrived).message) === enrols) end++;
        const run = arrived.slice(start, end);
        start = end;
        if (enrols) {
          for (const one of run) {
            while (enrolling.size >= enrolmentsAtOnce) await Promise.race(enrolling);
            const answering = this.enrol(one.message)
              .catch((error: unknown) => this.failed(error))
              .then((outcome) => this.settle(one, outcome))
              .finally(() => enrolling.delete(answering));
            enrolling.add(answering);
          }
          continue;
        }
        const outcomes = await handle(run.map(({ message }) => this.delivery(message))).catch(
          (error: unknown) => run.map(() => this.failed(error)),
        );
        if (outcomes.length === run.length && outcomes.every((outcome) => outcome === "done"))
          this.ackAll(run);
        else run.forEach((one, i) => this.settle(one, outcomes[i] ?? "retry"));
      }
    }
    await Promise.all(enrolling);
  }

  private failed(error: unknown): DeliveryOutcome {
    this.log.error("control.handler_failed", { error: errorText(error) });
    return "retry";
  }

  private delivery(message: ConsumeMessage): ControlDelivery {
    const user = this.users.read(message.properties.userId as string | undefined);
    const now = Date.now();
    // The publisher's timestamp (seconds) can only make a node look older than it is, never younger.
    const stamped =
      typeof message.properties.timestamp === "number" ? message.properties.timestamp * 1000 : now;
    return {
      kind: message.fields.routingKey === controlRoutingKey("alive") ? "alive" : "report",
      // Only a node's own account speaks for it; a message without a node account's user_id names no node.
      node: user?.role === "node" ? user.node : undefined,
      body: message.content,
      redelivered: message.fields.redelivered,
      receivedAt: new Date(Math.min(now, stamped)),
      ...(user?.role === "node" ? { identity: message.properties.userId as string } : {}),
      ...misrouted(message),
    };
  }

  private async enrol(message: ConsumeMessage): Promise<DeliveryOutcome> {
    const user = this.users.read(message.properties.userId as string | undefined);
    const replyTo = message.properties.replyTo as string | undefined;
    if (user?.role !== "token") {
      const sender = typeof message.properties.userId === "string" ? message.properties.userId : null;
      this.astray.warn(sender ?? "*", "enrol.not_from_a_token", {
        user: sender?.slice(0, astrayShown) ?? null,
      });
      return "done";
    }
    // Answering where the requester chose freely would lend it the control plane's rights (a node's queue, say).
    if (replyTo === undefined || !replyTo.startsWith(`${directReplyTo}.`)) {
      this.astray.warn(user.node, "enrol.foreign_reply_to", {
        node: user.node,
        reply_to: replyTo?.slice(0, astrayShown) ?? null,
      });
      return "done";
    }
    if (this.answer === undefined) return "retry";
    const { reply, afterReply } = await this.answer({
      node: user.node,
      body: message.content,
      ...misrouted(message),
    });
    await this.publisher.publish(defaultExchange, replyTo, reply, {
      correlationId: message.properties.correlationId as string | undefined,
    });
    await afterReply?.();
    return "done";
  }

  /**
   * Acknowledges a batch the store has taken: with one frame for all of it (`multiple`, up to its last tag) when
   * nothing else before that tag is open on its channel, else one by one. A batch spans one channel but across a
   * reconnection, which settles it one by one too.
   */
  private ackAll(batch: readonly Arrived[]): void {
    const last = batch.at(-1);
    if (last === undefined) return;
    const tags = this.open.get(last.channel);
    const inBatch = new Set(batch.map(({ message }) => message.fields.deliveryTag));
    const lastTag = last.message.fields.deliveryTag;
    let alone = tags !== undefined && batch.every(({ channel }) => channel === last.channel);
    if (alone && tags !== undefined) {
      for (const tag of tags) {
        if (tag > lastTag) break;
        if (!inBatch.has(tag)) {
          alone = false;
          break;
        }
      }
    }
    if (!alone || tags === undefined) {
      for (const one of batch) this.settle(one, "done");
      return;
    }
    try {
      last.channel.ack(last.message, true);
    } catch (error) {
      // The channel closed with its connection: the broker redelivers the batch, and a repeat is harmless.
      this.log.warn("control.ack_lost", { error: errorText(error) });
    }
    for (const tag of inBatch) tags.delete(tag);
  }

  private settle({ channel, message }: Arrived, outcome: DeliveryOutcome): void {
    // Open until it is acknowledged or handed back: a batch after it must not acknowledge it with its own.
    const close = () => this.open.get(channel)?.delete(message.fields.deliveryTag);
    try {
      if (outcome === "done") {
        close();
        channel.ack(message);
        return;
      }
      setTimeout(() => {
        close();
        try {
          channel.nack(message, false, true);
        } catch (error) {
          // The channel closed meanwhile: the broker offers the message again anyway.
          this.log.info("control.retry_on_closed_channel", { error: errorText(error) });
        }
      }, retryAfterMs);
    } catch (error) {
      // The channel closed with its connection: the broker redelivers the message, and a repeat is harmless.
      this.log.warn("control.ack_lost", { error: errorText(error) });
    }
  }

  async publishDeclaration(node: string, envelope: Uint8Array): Promise<void> {
    await this.toNode(node, "declaration", envelope);
  }

  async publishDeclarations(batch: readonly { node: string; envelope: Uint8Array }[]): Promise<void> {
    // All in flight at once on the confirm channel; each is confirmed (or refused) by the broker.
    await Promise.all(batch.map(({ node, envelope }) => this.toNode(node, "declaration", envelope)));
  }

  async publishReceipt(node: string, receipt: Uint8Array): Promise<void> {
    await this.toNode(node, "receipt", receipt);
  }

  private async toNode(node: string, type: "declaration" | "receipt", body: Uint8Array): Promise<void> {
    await this.publisher.publish(defaultExchange, nodeQueue(node), body, {
      // A declaration outlives a broker restart. A receipt need not (as on NATS): a node sends its report again
      // until a receipt comes, so a lost one costs a repeat, while a persistent one costs a disk write each.
      persistent: type === "declaration",
      type,
      contentType: "application/json",
    });
  }

  async publishEvent(kind: string, body: Uint8Array): Promise<void> {
    await this.publisher.publish(meshExchange, eventRoutingKey(kind), body, {
      persistent: false,
      contentType: "application/json",
    });
  }

  onReconnect(listener: () => void): void {
    this.link.onReconnect(listener);
  }

  async backlog(): Promise<number> {
    // One channel for the question, made again when the broker closed it (a passive declare of a missing queue
    // closes its channel; a lost connection closes them all).
    this.probe ??= this.link.channel().then((channel) => {
      channel.on("error", (error: Error) =>
        this.log.info("control.probe_channel", { error: errorText(error) }),
      );
      channel.on("close", () => (this.probe = undefined));
      return channel;
    });
    try {
      const { messageCount } = await (await this.probe).checkQueue(controlQueue);
      return messageCount;
    } catch (error) {
      this.probe = undefined;
      throw new BusError("broker", `the control queue could not be read: ${errorText(error)}`, {
        cause: error,
      });
    }
  }

  async close(): Promise<void> {
    this.closing = true;
    const consumer = this.consumer;
    this.consumer = undefined;
    if (consumer !== undefined) {
      await consumer.channel.cancel(consumer.tag).catch((error: unknown) => {
        this.log.info("control.cancel_on_closed_channel", { error: errorText(error) });
      });
    }
    this.stopConsuming();
    this.arrivals.end();
    await this.queue;
    await this.publisher.close();
    await this.link.close();
  }
}
