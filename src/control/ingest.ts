/**
 * What nodes send: reports (kept, in order, as each node's recovery copy) and alives (which only move
 * `last_seen`). Bad input is refused with a reason, counted, logged at most once a minute per node, and
 * acknowledged so it cannot poison the queue. Only a failure of our own (the store is down) asks for redelivery.
 */
import type { ControlBus, ControlDelivery, DeliveryOutcome } from "../bus/index.js";
import type { Report } from "../link/index.js";
import {
  accountOfReport,
  ContractError,
  encodeMessage,
  judgeReport,
  parseAlive,
  parseReport,
} from "../link/index.js";
import type { ReportAccount } from "../link/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { NodeRecord, Store } from "../store/index.js";
import { resendLatest } from "./declarations.js";

export interface IngestContext {
  store: Store;
  bus: ControlBus;
  log: Logger;
  now: () => Date;
  /** How long to wait before sending a node that says it is behind its latest declaration again. */
  resendAfterMs: number;
  /**
   * How long a node's enrolled record and the order of its latest declaration are taken as read, instead of asking
   * the store for every alive (default 5 s). A node retired meanwhile is refused by the broker at once anyway, and a
   * node behind a declaration made by another process is sent it at most this much later.
   */
  rememberForMs?: number;
}

/** A value read from the store, and until when it is taken as still true. */
interface Remembered<T> {
  value: T;
  until: number;
}

export class Ingest {
  /** `last_seen` times waiting for the next batched write. */
  private readonly seen = new Map<string, string>();
  private readonly lastRefusalLog = new Map<string, number>();
  private readonly lastResend = new Map<string, number>();
  private readonly enrolled = new Map<string, Remembered<NodeRecord>>();
  private readonly latestOrder = new Map<
    string,
    Remembered<{ epoch: number; sequence: number } | undefined>
  >();

  constructor(private readonly context: IngestContext) {}

  private remembered<T>(cache: Map<string, Remembered<T>>, node: string): Remembered<T> | undefined {
    const entry = cache.get(node);
    if (entry === undefined) return undefined;
    if (entry.until > this.context.now().getTime()) return entry;
    cache.delete(node);
    return undefined;
  }

  private remember<T>(cache: Map<string, Remembered<T>>, node: string, value: T): void {
    cache.set(node, { value, until: this.context.now().getTime() + (this.context.rememberForMs ?? 5000) });
  }

  /** The node's record: remembered for a while once it is enrolled, read afresh otherwise or when `fresh`. */
  private async nodeRecord(node: string, fresh: boolean): Promise<NodeRecord | undefined> {
    const known = fresh ? undefined : this.remembered(this.enrolled, node);
    if (known !== undefined) return known.value;
    const record = await this.context.store.nodes.get(node);
    if (record?.state === "enrolled") this.remember(this.enrolled, node, record);
    else this.enrolled.delete(node);
    return record;
  }

  async handle(delivery: ControlDelivery): Promise<DeliveryOutcome> {
    try {
      if (delivery.node === undefined) {
        await this.refuse("*", delivery.kind, "the subject names no valid node");
        return "done";
      }
      // Only an enrolled node speaks: a retired node's identity may still be known to a broker that restarted.
      // Alives, the bulk of the traffic, take a record read a moment ago; a report, which is ordered by when the
      // node enrolled, always reads it afresh.
      const record = await this.nodeRecord(delivery.node, delivery.kind === "report");
      if (record?.state !== "enrolled") {
        await this.refuse(
          delivery.node,
          delivery.kind,
          `node ${delivery.node} is ${record?.state ?? "unknown"}, not enrolled`,
        );
        return "done";
      }
      // Never in the future, whatever the clocks say.
      const spokeAt = new Date(
        Math.min(delivery.receivedAt.getTime(), this.context.now().getTime()),
      ).toISOString();
      if (delivery.kind === "alive") await this.alive(delivery.node, delivery.body, spokeAt);
      else await this.report(delivery.node, delivery.body, spokeAt, record.enrolledAt);
      return "done";
    } catch (error) {
      this.context.log.error("ingest.failed", {
        node: delivery.node,
        kind: delivery.kind,
        error: errorText(error),
      });
      return "retry";
    }
  }

  /** Writes the batched `last_seen` times. */
  async flush(): Promise<void> {
    if (this.seen.size === 0) return;
    const batch = new Map(this.seen);
    this.seen.clear();
    await this.context.store.nodes.touch(batch);
  }

  private async alive(node: string, body: Uint8Array, spokeAt: string): Promise<void> {
    let alive;
    try {
      alive = parseAlive(body);
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
      return this.refuse(node, "alive", error.reason);
    }
    if (alive.node !== node) return this.refuse(node, "alive", `its body names node ${alive.node}`);
    // An alive moves last_seen and nothing else: it is never an account, so it can never empty a recovery copy.
    this.seen.set(node, spokeAt);
    if (alive.holds !== undefined) await this.catchUp(node, alive.holds);
  }

  private async catchUp(node: string, holds: { epoch: number; sequence: number }): Promise<void> {
    let latest = this.remembered(this.latestOrder, node)?.value;
    if (this.remembered(this.latestOrder, node) === undefined) {
      const read = await this.context.store.declarations.latest(node);
      latest = read === undefined ? undefined : { epoch: read.epoch, sequence: read.sequence };
      this.remember(this.latestOrder, node, latest);
    }
    if (latest === undefined) return;
    const behind =
      holds.epoch < latest.epoch || (holds.epoch === latest.epoch && holds.sequence < latest.sequence);
    const now = this.context.now().getTime();
    if (!behind || now - (this.lastResend.get(node) ?? 0) < this.context.resendAfterMs) return;
    this.lastResend.set(node, now);
    await resendLatest(this.context.store, this.context.bus, node);
  }

  private async report(
    node: string,
    body: Uint8Array,
    spokeAt: string,
    enrolledAt: string | null,
  ): Promise<void> {
    const { store } = this.context;
    let report: Report;
    try {
      report = parseReport(body);
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
      return this.refuse(node, "report", error.reason);
    }
    if (report.node !== node) return this.refuse(node, "report", `its body names node ${report.node}`);
    const now = this.context.now().toISOString();
    this.seen.set(node, spokeAt);

    // A machine that enrolled again starts its report counter anew: accounts from before are not its order.
    const latestRecord = await store.accounts.recoveryCopy(node);
    const keptRecord =
      latestRecord !== undefined && enrolledAt !== null && latestRecord.receivedAt < enrolledAt
        ? undefined
        : latestRecord;
    const kept: ReportAccount | undefined =
      keptRecord === undefined
        ? undefined
        : keptRecord.epoch !== null && keptRecord.sequence !== null && keptRecord.reportSequence !== null
          ? {
              digest: keptRecord.digest,
              order: {
                epoch: keptRecord.epoch,
                sequence: keptRecord.sequence,
                report_sequence: keptRecord.reportSequence,
              },
            }
          : { digest: keptRecord.digest };
    const orders = new Map<string, { epoch: number; sequence: number }>();
    for (const digest of new Set([report.digest, kept?.digest].filter((d): d is string => d !== undefined))) {
      const order = await store.declarations.orderOfDigest(node, digest);
      if (order !== undefined) orders.set(digest, order);
    }
    // The very report already kept, sent again because its receipt was lost: take it again, quietly.
    if (keptRecord !== undefined && keptRecord.report === new TextDecoder().decode(body)) {
      return this.receipt(node, report, "kept");
    }
    const judgement = judgeReport(accountOfReport(report), kept, (digest) => orders.get(digest));
    if (judgement.verdict === "refuse") {
      await this.refuse(node, "report", judgement.reason, "report_out_of_order");
      return this.receipt(node, report, "refused", judgement.reason);
    }

    await store.accounts.keep({
      node,
      receivedAt: now,
      epoch: report.epoch ?? null,
      sequence: report.sequence ?? null,
      reportSequence: report.report_sequence ?? null,
      digest: report.digest,
      outcome: report.outcome,
      report: new TextDecoder().decode(body),
    });
    if (report.outcome !== "applied") {
      await store.counters.add(node, `declarations_${report.outcome}`);
      await store.events.record({
        at: now,
        kind: `declaration.${report.outcome}`,
        node,
        epoch: report.epoch ?? null,
        detail: { reason: report.reason ?? "", sequence: report.sequence ?? null },
      });
      this.context.log.warn(`node.declaration_${report.outcome}`, { node, reason: report.reason });
    }
    await this.receipt(node, report, "kept");
  }

  /** Tells the node its report was taken, so it stops sending it. Reports without a report_sequence get none. */
  private async receipt(
    node: string,
    report: Report,
    verdict: "kept" | "refused",
    reason?: string,
  ): Promise<void> {
    if (report.report_sequence === undefined) return;
    await this.context.bus.publishReceipt(
      node,
      encodeMessage({
        kind: "receipt",
        node,
        report_sequence: report.report_sequence,
        verdict,
        ...(reason === undefined ? {} : { reason }),
      }),
    );
  }

  private async refuse(
    node: string,
    kind: string,
    reason: string,
    counter = `${kind}_refused`,
  ): Promise<void> {
    const { store, log } = this.context;
    await store.counters.add(node, counter);
    await store.events.record({
      at: this.context.now().toISOString(),
      kind: `${kind}.refused`,
      node: node === "*" ? null : node,
      epoch: null,
      detail: { reason },
    });
    const now = this.context.now().getTime();
    if (now - (this.lastRefusalLog.get(node) ?? -Infinity) >= 60_000) {
      this.lastRefusalLog.set(node, now);
      log.warn(`${kind}.refused`, {
        node,
        reason,
        note: "further refusals for this node are counted, logged again in a minute",
      });
    }
  }
}
