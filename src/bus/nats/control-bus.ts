/**
 * The control plane on NATS. Reports and alives land in JetStream streams and are consumed through durable
 * consumers, so what nodes send while no control plane runs is processed when one returns. Enrolment is a plain
 * request and reply: a joining node waits for an answer, so it needs a live control plane anyway, and a missing one
 * shows at once as "no responders" rather than a timeout.
 */
import { randomBytes } from "node:crypto";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type {
  ConsumerConfig,
  ConsumerInfo,
  ConsumerMessages,
  JetStreamClient,
  JetStreamManager,
  JsMsg,
  StreamConfig,
} from "@nats-io/jetstream";
import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  jetstream,
  JetStreamApiCodes,
  JetStreamApiError,
  jetstreamManager,
  RetentionPolicy,
  StorageType,
} from "@nats-io/jetstream";
import {
  declarationSubject,
  eventSubject,
  inboxPrefix,
  natsPattern,
  readControlSubject,
  receiptSubject,
} from "../../link/index.js";
import {
  largestBrokerMessage,
  reportBacklogBytes,
  reportDuplicateWindowMs,
  reportsKeptPerNode,
} from "../../link/limits.js";
import type { Logger } from "../../log.js";
import { errorText, WarningWindow } from "../../log.js";
import { Arrivals } from "../batches.js";
import type { ControlBus, ControlDelivery, ControlHandler, EnrolAnswer, EnrolRequest } from "../bus.js";
import { controlBatchMax } from "../bus.js";
import { BusError } from "../errors.js";
import { AckFloor, DeliveryCount } from "./ack-floor.js";
import { readAckSubject, replyOf } from "./ack-subject.js";
import { askJetStream, noAnswer } from "./connect.js";

export const controlStream = "MESH_CONTROL";
export const aliveStream = "MESH_ALIVE";
/**
 * The consumers' names begin so. Each control plane that starts consuming makes a consumer of its own, named so
 * with a random ending, and removes those before it (see `openConsumer`). An earlier layout's consumer was named
 * this alone.
 */
export const controlConsumer = "control";
const nanos = (ms: number) => ms * 1_000_000;
/** How long the backlog's question waits for the broker: it is how the control plane learns that it is deaf. */
const backlogTimeoutMs = 2000;
/** How long a message handed back is offered again after (the broker's nak delay). */
const handBackDelayMs = 1000;
/**
 * How often the broker is asked whether messages handed back and not offered again since still exist: a node's
 * newer message may have pushed one out (a node keeps a few reports and one alive in the streams), and one gone
 * would hold every acknowledgement after it forever.
 */
const owedCheckEveryMs = 5000;

export interface NatsControlBusOptions {
  /** How long an unacknowledged message waits before redelivery. */
  ackWaitMs: number;
  /** How long an unprocessed node message is kept while no control plane runs. */
  keepForMs: number;
  /**
   * How long a wait for the broker (the flush after publishing, the drain at close) may last: a one-shot command's
   * deadline. Unset for a control plane, whose connection rides out outages.
   */
  answerWithinMs?: number | undefined;
}

export const defaultControlBusOptions: NatsControlBusOptions = {
  ackWaitMs: 30_000,
  keepForMs: 7 * 86_400_000,
};

/** How much of a subject a token's holder chose is logged. */
const astrayShown = 256;

export class NatsControlBus implements ControlBus {
  private readonly js: JetStreamClient;
  private enrolments: Subscription | undefined;
  private readonly consuming = new Set<ConsumerMessages>();
  /** This control plane's consumer of each stream, once it consumes. */
  private readonly ours = new Map<string, string>();
  /** Enrolments being answered; closing waits for them, so none is cut off between its reply and its revocation. */
  private readonly inFlight = new Set<Promise<void>>();
  /** The backlog's manager, whose questions wait `backlogTimeoutMs` at most. */
  private manager: JetStreamManager | undefined;
  private setup: JetStreamManager | undefined;
  private closing = false;
  /** What a token's holder sends astray is told once a minute per node. */
  private readonly astray: WarningWindow;

  constructor(
    private readonly nc: NatsConnection,
    private readonly log: Logger,
    private readonly options: NatsControlBusOptions = defaultControlBusOptions,
  ) {
    this.js = jetstream(nc);
    this.astray = new WarningWindow(log);
  }

  async assert(): Promise<void> {
    await askJetStream(this.nc, undefined, () => this.assertOnce());
  }

  /** Each stream made as this layout has it; asked again whole when JetStream had no responder part-way. */
  private async assertOnce(): Promise<void> {
    const jsm = await this.jsm();
    for (const stream of [controlStream, aliveStream]) {
      const made = await ensureStream(jsm, this.streamConfig(stream));
      if (made.earlier) {
        // Made by an earlier layout (work-queue retention, which the broker will not change in place): its
        // consumer takes what it holds first, and the stream is made again then (`consumeControl`).
        if ((await consumersOf(jsm, stream)).some(({ name }) => name === controlConsumer)) continue;
        await jsm.consumers.add(stream, {
          durable_name: controlConsumer,
          ack_policy: AckPolicy.Explicit,
          deliver_policy: DeliverPolicy.All,
          ack_wait: nanos(this.options.ackWaitMs),
          max_ack_pending: 1024,
        });
        continue;
      }
      // A stream of interest retention keeps a message only for its consumers: one must exist from the start.
      if ((await consumersOf(jsm, stream)).length === 0)
        await jsm.consumers.add(stream, this.consumerConfig());
    }
  }

  /** The stream as this code makes it. */
  private streamConfig(stream: string): Partial<StreamConfig> & { name: string } {
    const common = {
      // No broker acknowledgement to publishers: the broker would send it to whatever reply subject a node names —
      // the JetStream API itself included (a node could purge a stream). The control plane's receipt replaces it.
      no_ack: true,
      // Interest retention: a message is gone once the control plane's consumer acknowledged it. (Work-queue
      // retention would do the same, but it takes acknowledgements only one message at a time.)
      retention: RetentionPolicy.Interest,
      storage: StorageType.File,
      max_age: nanos(this.options.keepForMs),
      // Refused at the door: nothing larger than the broker's largest message is stored (headers counted).
      max_msg_size: largestBrokerMessage,
    };
    // Reports, each kept until processed, a few per node: a node's newer report pushes out its own oldest, and the
    // stream as a whole is bounded (src/link/limits.ts says why each number).
    if (stream === controlStream) {
      return {
        ...common,
        name: controlStream,
        subjects: [natsPattern.toControl("report", "*")],
        max_msgs_per_subject: reportsKeptPerNode,
        max_bytes: reportBacklogBytes,
        discard: DiscardPolicy.Old,
        duplicate_window: nanos(reportDuplicateWindowMs),
      };
    }
    // Alives apart, and only the newest per node: during an outage the queue holds one per node, not one per
    // interval, and reports never wait behind a backlog of alives.
    return {
      ...common,
      name: aliveStream,
      subjects: [natsPattern.toControl("alive", "*")],
      max_msgs_per_subject: 1,
      discard: DiscardPolicy.Old,
    };
  }

  /**
   * A consumer of the control plane: one acknowledgement covers every message before it, and a new one is offered
   * everything the stream holds (under interest retention, what no consumer before it acknowledged).
   */
  private consumerConfig(): Partial<ConsumerConfig> & { durable_name: string } {
    return {
      durable_name: `${controlConsumer}-${randomBytes(4).toString("hex")}`,
      ack_policy: AckPolicy.All,
      deliver_policy: DeliverPolicy.All,
      ack_wait: nanos(this.options.ackWaitMs),
      max_ack_pending: 1024,
    };
  }

  async answerEnrolments(answer: (request: EnrolRequest) => Promise<EnrolAnswer>): Promise<void> {
    this.enrolments = this.nc.subscribe(natsPattern.toControl("enrol", "*"), {
      callback: (error, msg) => {
        if (error !== null) {
          this.log.error("enrol.subscription_failed", { error: errorText(error) });
          return;
        }
        const read = readControlSubject(msg.subject);
        if (read === undefined) {
          this.astray.warn("*", "enrol.stray_subject", { subject: msg.subject.slice(0, astrayShown) });
          return;
        }
        const node = read.node;
        // The control plane may publish where a token may not; answering on a reply subject the requester chose
        // freely would lend it those rights. Only the node's own reply space is answered.
        if (msg.reply === undefined || !msg.reply.startsWith(`${inboxPrefix(node)}.`)) {
          this.astray.warn(node, "enrol.foreign_reply_subject", {
            node,
            reply: msg.reply?.slice(0, astrayShown) ?? null,
          });
          return;
        }
        const work = answer({ node, body: msg.data })
          .then(async ({ reply, afterReply }) => {
            msg.respond(reply);
            // The reply must reach the server before anything revokes the identity it is addressed to.
            await this.nc.flush();
            await afterReply?.();
          })
          .catch((failure: unknown) =>
            this.log.error("enrol.answer_failed", { node, error: errorText(failure) }),
          )
          .finally(() => this.inFlight.delete(work));
        this.inFlight.add(work);
      },
    });
    await this.nc.flush();
  }

  async consumeControl(handle: ControlHandler): Promise<void> {
    await Promise.all([
      this.consumeStream(controlStream, "report", handle),
      this.consumeStream(aliveStream, "alive", handle),
    ]);
  }

  /**
   * Consumes one stream through a consumer of this control plane's own, acknowledging a batch at a time. A stream
   * of the earlier layout is emptied through its consumer first, and made again. Should a delivery never arrive
   * (the connection dropped with it), the consumer is given up for a new one, offered all not acknowledged.
   */
  private async consumeStream(
    stream: string,
    kind: ControlDelivery["kind"],
    handle: ControlHandler,
  ): Promise<void> {
    try {
      const jsm = await this.jsm();
      const info = await askJetStream(this.nc, undefined, () => jsm.streams.info(stream));
      if (info.config.retention === RetentionPolicy.Workqueue)
        await this.takeEarlierLayout(stream, kind, handle, info.state.last_seq);
    } catch (error) {
      // Closed while starting: the connection is draining, and there is nothing to consume.
      if (!this.closing) throw error;
    }
    while (!this.closing) {
      if ((await this.consumeOnce(stream, kind, handle)) === "ended") return;
      this.log.warn("control.delivery_lost", {
        stream,
        note: "a delivery never arrived (the connection dropped with it): a new consumer is offered all not acknowledged",
      });
    }
  }

  /**
   * One consumer's life: until the bus closes (`ended`), or until a delivery is found not to have arrived (`lost`).
   * A consumer removed by someone else ends it with an error: another control plane has started consuming.
   */
  private async consumeOnce(
    stream: string,
    kind: ControlDelivery["kind"],
    handle: ControlHandler,
  ): Promise<"ended" | "lost"> {
    // Handed over by callback rather than iterated: a message costs the client one call instead of an async
    // iterator's step, a share of the drain that is the consumer's own.
    const arrivals = new Arrivals<Taken>();
    const count = new DeliveryCount();
    let lost = false;
    let opened: { name: string; messages: ConsumerMessages; deliveredBefore: number } | undefined;
    try {
      // A consumer made again whole if JetStream had no responder part-way: a new name, the earlier ones removed.
      const { name, deliveredBefore } = await askJetStream(this.nc, undefined, () =>
        this.openConsumer(stream),
      );
      if (this.closing) return "ended";
      const consumer = await askJetStream(this.nc, undefined, () => this.js.consumers.get(stream, name));
      const messages = await consumer.consume({
        max_messages: controlBatchMax,
        // A consumer removed ends the consuming, rather than waiting for it to come back.
        abort_on_missing_resource: true,
        callback: (msg) => {
          if (lost) return;
          const one = readDelivery(msg);
          if (!count.arrived(one.deliverySequence)) {
            lost = true;
            arrivals.end();
            return;
          }
          arrivals.push(one);
        },
      });
      opened = { name, messages, deliveredBefore };
    } catch (error) {
      if (!this.closing) throw error;
    }
    if (opened === undefined) return "ended";
    const { name, messages, deliveredBefore } = opened;
    this.ours.set(stream, name);
    this.consuming.add(messages);
    if (this.closing) await messages.close();
    let failure: Error | undefined;
    void messages.closed().then(
      (error) => {
        if (error !== undefined) failure = error;
        arrivals.end();
      },
      (error: unknown) => {
        failure = error instanceof Error ? error : new Error(String(error));
        arrivals.end();
      },
    );
    const floor = new AckFloor<Taken>();
    const jsm = await this.jsm();
    // Messages handed back may be pushed out of the stream meanwhile: asked after every so often, whether batches
    // come or not (held acknowledgements may have stopped the broker offering more).
    let checking = false;
    const check = setInterval(() => {
      if (this.closing) return clearInterval(check);
      if (checking || floor.owing === 0 || lost) return;
      checking = true;
      void this.forgetGone(jsm, stream, floor).finally(() => (checking = false));
    }, owedCheckEveryMs);
    // Never what keeps a process alive.
    check.unref();
    try {
      for await (const batch of arrivals.batches(controlBatchMax)) {
        // Offered to an earlier consumer up to `deliveredBefore`: such a message is offered again.
        const outcomes = await handle(batch.map((one) => deliveryOf(one, kind, one.seq <= deliveredBefore)));
        // Once a delivery is lost, nothing more is acknowledged through this consumer: it is given up.
        if (lost) break;
        const { acknowledge, handBack } = floor.settle(batch, outcomes, Date.now());
        for (const { msg } of handBack) msg.nak(handBackDelayMs);
        acknowledge?.msg.ack();
      }
    } finally {
      clearInterval(check);
      this.consuming.delete(messages);
    }
    if (lost) {
      await messages.close();
      return "lost";
    }
    if (failure !== undefined && !this.closing) {
      throw new BusError("broker", `consuming ${stream} through ${name} ended: ${errorText(failure)}`, {
        cause: failure,
      });
    }
    return "ended";
  }

  /**
   * Makes this control plane's consumer of a stream, offered everything the stream holds, and removes every other:
   * a control plane that acted before and died may have taken messages it never acknowledged, which a consumer of
   * its own would be offered only after the ack wait; a new consumer is offered them at once. Made before the
   * others go, so that the stream keeps its messages throughout. Returns how far along the stream the consumers
   * before it had been offered messages.
   */
  private async openConsumer(stream: string): Promise<{ name: string; deliveredBefore: number }> {
    const jsm = await this.jsm();
    // The control plane's own, earlier ones: a consumer someone else made on the stream is left alone.
    const before = (await consumersOf(jsm, stream)).filter(
      ({ name }) => name === controlConsumer || name.startsWith(`${controlConsumer}-`),
    );
    const config = this.consumerConfig();
    await jsm.consumers.add(stream, config);
    for (const { name } of before) {
      await jsm.consumers.delete(stream, name).catch((error: unknown) => {
        // Removed meanwhile (another control plane starting): what matters is that it is gone.
        if (!(error instanceof JetStreamApiError && error.code === JetStreamApiCodes.ConsumerNotFound))
          throw error;
      });
    }
    const deliveredBefore = Math.max(0, ...before.map((info) => info.delivered.stream_seq));
    return { name: config.durable_name, deliveredBefore };
  }

  /**
   * Tells the floor which of its messages owed the broker no longer holds. A question the broker does not answer
   * leaves them owed until the next check: the acknowledgements wait, nothing is lost.
   */
  private async forgetGone(jsm: JetStreamManager, stream: string, floor: AckFloor<Taken>): Promise<void> {
    const gone: number[] = [];
    try {
      for (const seq of floor.owedLongerThan(2 * handBackDelayMs, Date.now())) {
        if ((await jsm.streams.getMessage(stream, { seq })) === null) gone.push(seq);
      }
    } catch (error) {
      this.log.warn("control.owed_check_failed", { stream, owed: floor.owing, error: errorText(error) });
    }
    floor.gone(gone)?.msg.ack();
  }

  /**
   * Empties a stream made by an earlier layout (work-queue retention, which takes acknowledgements one message at
   * a time and cannot be changed in place) through its consumer, and makes it again as this code does. Emptied
   * means: nothing waits, or everything up to what the stream held when this began (`until`) was offered and
   * acknowledged — nodes that keep sending would otherwise keep it from ever being empty. What nodes send between
   * then and the stream made again with its consumer is lost: a report is sent again until its receipt comes, and
   * an alive comes again anyway.
   */
  private async takeEarlierLayout(
    stream: string,
    kind: ControlDelivery["kind"],
    handle: ControlHandler,
    until: number,
  ): Promise<void> {
    const jsm = await this.jsm();
    const consumer = await this.js.consumers.get(stream, controlConsumer);
    let taken = 0;
    while (!this.closing) {
      const info = await consumer.info();
      if (info.num_ack_pending === 0 && (info.num_pending === 0 || info.delivered.stream_seq >= until)) break;
      const batch: JsMsg[] = [];
      for await (const msg of await consumer.fetch({ max_messages: controlBatchMax, expires: 1000 }))
        batch.push(msg);
      if (batch.length === 0) continue;
      const outcomes = await handle(batch.map((msg) => deliveryOf(readDelivery(msg), kind, false)));
      batch.forEach((msg, i) => {
        if (outcomes[i] === "done") msg.ack();
        else msg.nak(handBackDelayMs);
      });
      // The acknowledgements reach the broker before it is asked what is left.
      await this.nc.flush();
      taken += batch.length;
    }
    if (this.closing) return;
    const left = (await jsm.streams.info(stream)).state.messages;
    await jsm.streams.delete(stream);
    await ensureStream(jsm, this.streamConfig(stream));
    await jsm.consumers.add(stream, this.consumerConfig());
    this.log.warn("broker.stream_remade", {
      stream,
      taken,
      dropped: left,
      note: "made by an earlier layout: emptied and made again; nodes send dropped reports again",
    });
  }

  async publishDeclaration(node: string, envelope: Uint8Array): Promise<void> {
    await this.publishDeclarations([{ node, envelope }]);
  }

  async publishDeclarations(batch: readonly { node: string; envelope: Uint8Array }[]): Promise<void> {
    for (const { node, envelope } of batch) this.nc.publish(declarationSubject(node), envelope);
    await this.answered(this.nc.flush());
  }

  async publishReceipt(node: string, receipt: Uint8Array): Promise<void> {
    this.nc.publish(receiptSubject(node), receipt);
    await Promise.resolve();
  }

  async publishEvent(kind: string, body: Uint8Array): Promise<void> {
    this.nc.publish(eventSubject(kind), body);
    await Promise.resolve();
  }

  async backlog(): Promise<number> {
    // No API check on opening: the question itself is the check, and it is asked every second or so.
    const manager = (this.manager ??= await jetstreamManager(this.nc, {
      checkAPI: false,
      timeout: backlogTimeoutMs,
    }));
    const ask = <T>(question: () => Promise<T>) => askJetStream(this.nc, backlogTimeoutMs, question);
    let waiting = 0;
    for (const stream of [controlStream, aliveStream]) {
      // This control plane's consumer once it consumes (one gone is an answer too: it hears nothing); before,
      // what the stream holds, which is what no consumer acknowledged.
      const ours = this.ours.get(stream);
      if (ours === undefined) {
        waiting += (await ask(() => manager.streams.info(stream))).state.messages;
        continue;
      }
      const info = await ask(() => manager.consumers.info(stream, ours));
      waiting += info.num_pending + info.num_ack_pending;
    }
    return waiting;
  }

  /** The JetStream manager for making streams and consumers, opened once. */
  private async jsm(): Promise<JetStreamManager> {
    this.setup ??= await jetstreamManager(this.nc);
    return this.setup;
  }

  onReconnect(listener: () => void): void {
    void (async () => {
      for await (const status of this.nc.status()) {
        if (status.type === "reconnect") listener();
      }
    })();
  }

  async close(): Promise<void> {
    this.closing = true;
    this.enrolments?.unsubscribe();
    await Promise.all(this.inFlight);
    try {
      for (const messages of this.consuming) await messages.close();
      if (!this.nc.isClosed()) await this.answered(this.nc.drain());
    } catch (error) {
      // Draining needs the server; with the server gone it fails, and a connection left open would keep
      // reconnecting (and the process alive) forever.
      this.log.warn("broker.not_drained", { error: errorText(error) });
    } finally {
      if (!this.nc.isClosed()) await this.nc.close();
    }
  }

  /**
   * Waits for the broker's answer, within `answerWithinMs` when set. A flush or drain waits for the server's PONG,
   * which a stopped server never sends and the client does not time out on its own.
   */
  private async answered(wait: Promise<void>): Promise<void> {
    const ms = this.options.answerWithinMs;
    if (ms === undefined) return wait;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(noAnswer(this.nc.getServer(), ms)), ms);
    });
    try {
      await Promise.race([wait, late]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/**
 * Creates a stream, or brings an existing one to this config (subjects and limits included). A lower per-subject
 * limit holds only for what is stored from then on (2.9.10 trims one old message per new one), so a subject over it
 * is trimmed here to its newest messages. A stream of work-queue retention is an earlier layout's, which the broker
 * will not change in place: it gets the limits and keeps its retention, and is said to be `earlier`.
 */
async function ensureStream(
  jsm: JetStreamManager,
  config: Partial<StreamConfig> & { name: string },
): Promise<{ earlier: boolean }> {
  const existing = await jsm.streams.info(config.name).then(
    (info) => info,
    (error: unknown) => {
      if (isNotFound(error)) return undefined;
      throw new BusError("broker", `cannot read stream ${config.name}`, { cause: error });
    },
  );
  const earlier =
    existing?.config.retention === RetentionPolicy.Workqueue &&
    config.retention !== RetentionPolicy.Workqueue;
  try {
    if (existing === undefined) {
      await jsm.streams.add(config);
      return { earlier };
    }
    await jsm.streams.update(
      config.name,
      earlier ? { ...config, retention: RetentionPolicy.Workqueue } : config,
    );
  } catch (error) {
    throw streamRefused(config, error);
  }
  const keep = config.max_msgs_per_subject ?? -1;
  const before = existing.config.max_msgs_per_subject;
  if (keep > 0 && (before <= 0 || before > keep)) await trimSubjects(jsm, config.name, keep);
  return { earlier };
}

/** Purges every subject of the stream holding more than `keep` messages down to its newest `keep`. */
async function trimSubjects(jsm: JetStreamManager, stream: string, keep: number): Promise<void> {
  const { state } = await jsm.streams.info(stream, { subjects_filter: ">" });
  for (const [subject, count] of Object.entries(state.subjects ?? {})) {
    if (count > keep) await jsm.streams.purge(stream, { filter: subject, keep });
  }
}

/** The broker's refusal of a stream's config, saying which stream and, where it helps, what to do. */
function streamRefused(config: Partial<StreamConfig> & { name: string }, error: unknown): BusError {
  const reason = errorText(error);
  // 10047: the server cannot set aside the stream's max_bytes within its JetStream storage.
  const fix =
    error instanceof JetStreamApiError && error.code === 10047
      ? `: it sets aside ${config.max_bytes ?? -1} bytes of disk; free disk or raise the server's jetstream max_file_store`
      : "";
  return new BusError("broker", `the broker refused stream ${config.name} (${reason})${fix}`, {
    cause: error,
  });
}

/** The stream does not exist yet: the API answers with code 10059 (the client's StreamNotFoundError). */
export function isNotFound(error: unknown): boolean {
  return error instanceof JetStreamApiError && error.code === JetStreamApiCodes.StreamNotFound;
}

/** The consumers of a stream, as the broker lists them. */
async function consumersOf(jsm: JetStreamManager, stream: string): Promise<ConsumerInfo[]> {
  const all: ConsumerInfo[] = [];
  for await (const info of jsm.consumers.list(stream)) all.push(info);
  return all;
}

/** A message as the consumer took it: its place in the stream and its delivery, read once. */
interface Taken {
  msg: JsMsg;
  /** The stream sequence. */
  seq: number;
  deliverySequence: number;
  redelivered: boolean;
  /** When the stream took it, in ms since the epoch. */
  storedAtMs: number;
}

/** Reads a message's delivery off its reply subject; the client reads one of no known layout, and says why. */
function readDelivery(msg: JsMsg): Taken {
  const reply = replyOf(msg);
  const read = reply === undefined ? undefined : readAckSubject(reply);
  if (read !== undefined) {
    return {
      msg,
      seq: read.streamSequence,
      deliverySequence: read.deliverySequence,
      redelivered: read.deliveryCount > 1,
      storedAtMs: read.storedAtMs,
    };
  }
  const { info } = msg;
  return {
    msg,
    seq: info.streamSequence,
    deliverySequence: info.deliverySequence,
    redelivered: info.redelivered,
    storedAtMs: msg.time.getTime(),
  };
}

/** A message of the control streams as the control plane takes it. */
function deliveryOf(one: Taken, kind: ControlDelivery["kind"], offeredBefore: boolean): ControlDelivery {
  const { msg } = one;
  const read = readControlSubject(msg.subject);
  return {
    // The subject says what it is (a stream from an older layout may still hold both kinds).
    kind: read?.kind === "report" || read?.kind === "alive" ? read.kind : kind,
    node: read?.node,
    body: msg.data,
    redelivered: offeredBefore || one.redelivered,
    receivedAt: new Date(one.storedAtMs),
  };
}
