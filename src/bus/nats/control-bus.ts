/**
 * The control plane on NATS. Reports and alives land in JetStream streams and are consumed through durable
 * consumers, so what nodes send while no control plane runs is processed when one returns. Enrolment is a plain
 * request and reply: a joining node waits for an answer, so it needs a live control plane anyway, and a missing one
 * shows at once as "no responders" rather than a timeout.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type {
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
import { errorText } from "../../log.js";
import { Arrivals } from "../batches.js";
import type { ControlBus, ControlDelivery, ControlHandler, EnrolAnswer, EnrolRequest } from "../bus.js";
import { controlBatchMax } from "../bus.js";
import { BusError } from "../errors.js";
import { noAnswer } from "./connect.js";

export const controlStream = "MESH_CONTROL";
export const aliveStream = "MESH_ALIVE";
export const controlConsumer = "control";
const nanos = (ms: number) => ms * 1_000_000;
/** How long the backlog's question waits for the broker: it is how the control plane learns that it is deaf. */
const backlogTimeoutMs = 2000;

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

export class NatsControlBus implements ControlBus {
  private readonly js: JetStreamClient;
  private enrolments: Subscription | undefined;
  private readonly consuming: ConsumerMessages[] = [];
  /** Enrolments being answered; closing waits for them, so none is cut off between its reply and its revocation. */
  private readonly inFlight = new Set<Promise<void>>();
  private manager: JetStreamManager | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly log: Logger,
    private readonly options: NatsControlBusOptions = defaultControlBusOptions,
  ) {
    this.js = jetstream(nc);
  }

  async assert(): Promise<void> {
    const jsm: JetStreamManager = await jetstreamManager(this.nc);
    const common = {
      // No broker acknowledgement to publishers: the broker would send it to whatever reply subject a node names —
      // the JetStream API itself included (a node could purge a stream). The control plane's receipt replaces it.
      no_ack: true,
      // Work-queue retention: a message is gone once the control plane acknowledged it.
      retention: RetentionPolicy.Workqueue,
      storage: StorageType.File,
      max_age: nanos(this.options.keepForMs),
      // Refused at the door: nothing larger than the broker's largest message is stored (headers counted).
      max_msg_size: largestBrokerMessage,
    };
    // Reports, each kept until processed, a few per node: a node's newer report pushes out its own oldest, and the
    // stream as a whole is bounded (src/link/limits.ts says why each number).
    await ensureStream(jsm, {
      ...common,
      name: controlStream,
      subjects: [natsPattern.toControl("report", "*")],
      max_msgs_per_subject: reportsKeptPerNode,
      max_bytes: reportBacklogBytes,
      discard: DiscardPolicy.Old,
      duplicate_window: nanos(reportDuplicateWindowMs),
    });
    // Alives apart, and only the newest per node: during an outage the queue holds one per node, not one per
    // interval, and reports never wait behind a backlog of alives.
    await ensureStream(jsm, {
      ...common,
      name: aliveStream,
      subjects: [natsPattern.toControl("alive", "*")],
      max_msgs_per_subject: 1,
      discard: DiscardPolicy.Old,
    });
    for (const stream of [controlStream, aliveStream]) {
      await jsm.consumers.add(stream, {
        durable_name: controlConsumer,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: nanos(this.options.ackWaitMs),
        max_ack_pending: 1024,
      });
    }
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
          this.log.warn("enrol.stray_subject", { subject: msg.subject });
          return;
        }
        const node = read.node;
        // The control plane may publish where a token may not; answering on a reply subject the requester chose
        // freely would lend it those rights. Only the node's own reply space is answered.
        if (msg.reply === undefined || !msg.reply.startsWith(`${inboxPrefix(node)}.`)) {
          this.log.warn("enrol.foreign_reply_subject", { node, reply: msg.reply ?? null });
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
    const consume = async (stream: string, kind: ControlDelivery["kind"]) => {
      const consumer = await this.js.consumers.get(stream, controlConsumer);
      // Handed over by callback rather than iterated: a message costs the client one call instead of an async
      // iterator's step, a share of the drain that is the consumer's own.
      const arrivals = new Arrivals<JsMsg>();
      const messages = await consumer.consume({
        max_messages: controlBatchMax,
        callback: (msg) => arrivals.push(msg),
      });
      this.consuming.push(messages);
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
      for await (const batch of arrivals.batches(controlBatchMax)) {
        const outcomes = await handle(
          batch.map((msg) => {
            const read = readControlSubject(msg.subject);
            return {
              // The subject says what it is (a stream from an older layout may still hold both kinds).
              kind: read?.kind === "report" || read?.kind === "alive" ? read.kind : kind,
              node: read?.node,
              body: msg.data,
              redelivered: msg.redelivered,
              receivedAt: msg.time,
            };
          }),
        );
        batch.forEach((msg, i) => {
          if (outcomes[i] === "done") msg.ack();
          else msg.nak(1000);
        });
      }
      if (failure !== undefined) throw failure;
    };
    await Promise.all([consume(controlStream, "report"), consume(aliveStream, "alive")]);
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
    this.manager ??= await jetstreamManager(this.nc, { checkAPI: false, timeout: backlogTimeoutMs });
    let waiting = 0;
    for (const stream of [controlStream, aliveStream]) {
      const info = await this.manager.consumers.info(stream, controlConsumer);
      waiting += info.num_pending + info.num_ack_pending;
    }
    return waiting;
  }

  onReconnect(listener: () => void): void {
    void (async () => {
      for await (const status of this.nc.status()) {
        if (status.type === "reconnect") listener();
      }
    })();
  }

  async close(): Promise<void> {
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
 * is trimmed here to its newest messages.
 */
async function ensureStream(
  jsm: JetStreamManager,
  config: Partial<StreamConfig> & { name: string },
): Promise<void> {
  const existing = await jsm.streams.info(config.name).then(
    (info) => info,
    (error: unknown) => {
      if (isNotFound(error)) return undefined;
      throw new BusError("broker", `cannot read stream ${config.name}`, { cause: error });
    },
  );
  try {
    if (existing === undefined) {
      await jsm.streams.add(config);
      return;
    }
    await jsm.streams.update(config.name, config);
  } catch (error) {
    throw streamRefused(config, error);
  }
  const keep = config.max_msgs_per_subject ?? -1;
  const before = existing.config.max_msgs_per_subject;
  if (keep > 0 && (before <= 0 || before > keep)) await trimSubjects(jsm, config.name, keep);
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
function isNotFound(error: unknown): boolean {
  return error instanceof JetStreamApiError && error.code === JetStreamApiCodes.StreamNotFound;
}
