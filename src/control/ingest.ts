/**
 * What nodes send: reports (kept, in order, as each node's recovery copy) and alives (which only move
 * `last_seen`). Bad input is refused with a reason, counted, told (logged and kept as an event) at most once a
 * minute per node and kind, and acknowledged so it cannot poison the queue. Only a failure of our own (the store is
 * down) asks for redelivery. A report must be about a declaration this control plane sent to that node: one naming
 * an (epoch, sequence) never sent would otherwise be kept, and the node's genuine next report refused as older.
 */
import type { ControlBus, ControlDelivery, DeliveryOutcome } from "../bus/index.js";
import type { Receipt, Report } from "../link/index.js";
import {
  accountOfReport,
  boundText,
  compareDeclarationOrder,
  ContractError,
  emptyDigest,
  encodeReceipt,
  judgeReport,
  parseAlive,
  parseReportText,
} from "../link/index.js";
import type { ReportAccount } from "../link/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { AccountRecord, LatestOrder, MeshEvent, NodeStanding, Store } from "../store/index.js";
import { digestKey, sequenceKey } from "../store/index.js";
import { resendLatest } from "./declarations.js";
import type { OnceKept, TakeBack } from "./refusals.js";
import { addToCount, RefusalLedger, refusalWindowMs, settleKept, takeBack } from "./refusals.js";

/**
 * The most bytes an alive may hold: it names a node, a time and what the node holds, a few hundred bytes. A larger
 * one is refused by its size, before it is parsed (a report's bound is the contract's, checked before parsing too).
 */
export const aliveMaxBytes = 2048;

/** The longest report whose account is held in memory as its node's recovery copy (longer ones are read again). */
const copyHeldMaxChars = 4096;

export interface IngestContext {
  store: Store;
  bus: ControlBus;
  log: Logger;
  now: () => Date;
  /**
   * How long after its latest declaration was issued, or last sent again, a node that says it holds an older one is
   * sent it again.
   */
  resendAfterMs: number;
  /**
   * How long a node's enrolled record and the order of its latest declaration are taken as read, instead of asking
   * the store for every alive (default 5 s). A node retired meanwhile is refused by the broker at once anyway, and a
   * node behind a declaration made by another process is sent it at most this much later.
   */
  rememberForMs?: number;
  /** Tells refusals at most once a minute per node and kind; shared with enrolment. Default: a ledger of its own. */
  refusals?: RefusalLedger;
  /**
   * Told of a batch that failed and was handed back: returns whether the failure was the store, which is then said
   * once by the caller rather than once per batch. Default: every failure is logged here.
   */
  storeFailed?: (error: unknown, handedBack: number) => Promise<boolean>;
  /**
   * A node sent a receipt less than this long ago (default 0: none), for a report the broker had already when that
   * receipt went, waits for the next sending of all those waiting, at most this often, and is then sent one for its
   * newest report of the batches between: draining a backlog, nearly every batch holds a report of nearly every node,
   * and a node keeps only its newest pending. Any other node is answered as soon as its batch is written.
   */
  receiptsEveryMs?: number;
  /** Told how many receipts each sending holds, as it goes (the control plane's metrics). */
  receiptsSent?: (count: number) => void;
}

/** When a node's failed or refused account was last told, and the change of outcome held back since, if any. */
interface OutcomeTold {
  toldAt: number;
  held?: { event: MeshEvent; changes: number };
}

/** A value read from the store, and until when it is taken as still true. */
interface Remembered<T> {
  value: T;
  until: number;
}

export class Ingest {
  /** `last_seen` times (ms) waiting for the next batched write. */
  private readonly seen = new Map<string, number>();
  private readonly refusals: RefusalLedger;
  private readonly lastResend = new Map<string, number>();
  /** When each node's last drift was told (an event at most once a minute per node). */
  private readonly driftToldAt = new Map<string, number>();
  /**
   * Per node: when a failed or refused account of its was last told, and the change of outcome held back since, if
   * any (told once its minute is over, with how many changes came; see `reports`).
   */
  private readonly outcomes = new Map<string, OutcomeTold>();
  /**
   * Per node: how many changes of outcome the batch under way held back. A held change is told by a flush only once
   * that batch is kept or handed back: one handed back after a flush told what it held would bring the same change
   * again, told a second time.
   */
  private readonly outcomesUnderWay = new Map<string, number>();
  /** Per node: changes of outcome a flush could not tell once a batch had replaced their entry, for the next flush. */
  private readonly outcomesRetold = new Map<string, NonNullable<OutcomeTold["held"]>>();
  private readonly enrolled = new Map<string, Remembered<NodeStanding>>();
  private readonly latestOrder = new Map<string, Remembered<LatestOrder | undefined>>();
  /**
   * Each node's recovery copy as this control plane last read or kept it (none: the node never reported). Only
   * ingest writes accounts, and only the acting control plane ingests, so what it kept is what the store holds; a
   * copy too long to hold in memory is read each time.
   */
  private readonly copies = new Map<string, Remembered<AccountRecord | undefined>>();
  /** The declaration each node's reports last named, as the store holds it: a sent declaration never changes. */
  private readonly named = new Map<string, { sequence: number; epoch: number; digest: string }>();

  /** The batch holding reports under way, which the next such batch waits for (`handleBatch`). */
  private reportsUnderWay: Promise<void> = Promise.resolve();
  /** The last receipts sent, until the broker has them. */
  private receiptsOnTheirWay: Promise<void> = Promise.resolve();
  /** Receipts of batches written, not sent yet (`receiptsEveryMs`). */
  private readonly unsent = new Answers();
  /** When the receipts held for the period were last sent, all together (ms, by the context's clock). */
  private receiptsSentAt = Number.NEGATIVE_INFINITY;
  /**
   * When each node was last sent a receipt (ms), in the order they were sent: only those within the period are kept,
   * and only those wait for the period's sending. Bounded by the fleet: one entry a node.
   */
  private readonly answeredAt = new Map<string, number>();
  private receiptTimer: NodeJS.Timeout | undefined;
  private closed = false;
  /** The flush under way, and the one waiting for it (`flush`). */
  private flushing: Promise<void> | undefined;
  private flushNext: Promise<void> | undefined;

  constructor(private readonly context: IngestContext) {
    this.refusals = context.refusals ?? new RefusalLedger(context.log);
  }

  /** What is remembered of the node at `nowMs` (a batch's time: read once for all its messages). */
  private remembered<T>(
    cache: Map<string, Remembered<T>>,
    node: string,
    nowMs: number,
  ): Remembered<T> | undefined {
    const entry = cache.get(node);
    if (entry === undefined) return undefined;
    if (entry.until > nowMs) return entry;
    cache.delete(node);
    return undefined;
  }

  private remember<T>(cache: Map<string, Remembered<T>>, node: string, value: T, nowMs: number): void {
    cache.set(node, { value, until: nowMs + (this.context.rememberForMs ?? 5000) });
  }

  /** One delivery: a batch of one. */
  async handle(delivery: ControlDelivery): Promise<DeliveryOutcome> {
    const [outcome] = await this.handleBatch([delivery]);
    return outcome ?? "retry";
  }

  /**
   * Deliveries in the order they arrived, handled as that order says, with everything they change written in one
   * transaction. Receipts go out only once it has committed; until then nothing is acknowledged. A failure of our
   * own before it is kept (the store is down) hands the whole batch back for redelivery, where a report already kept
   * is taken again quietly; once kept, it is done, whatever fails after.
   */
  handleBatch(deliveries: readonly ControlDelivery[]): Promise<DeliveryOutcome[]> {
    // Batches holding reports one at a time, as each bus hands them over: a report is judged against the accounts
    // the batches before it left (kept or handed back), and a change of outcome one holds back is never another's
    // to tell. Alives go on beside them.
    if (!deliveries.some((delivery) => delivery.kind === "report")) return this.handleNow(deliveries);
    const turn = this.reportsUnderWay.then(() => this.handleNow(deliveries));
    // Its failure is its caller's: the next batch's turn comes either way.
    this.reportsUnderWay = turn.then(
      () => undefined,
      () => undefined,
    );
    return turn;
  }

  private async handleNow(deliveries: readonly ControlDelivery[]): Promise<DeliveryOutcome[]> {
    const batch = new Batch(this.context.now());
    try {
      await this.judge(deliveries, batch);
      if (batch.accounts.length + batch.counters.length + batch.events.length > 0) {
        // A node whose report is kept was heard: its last_seen moves with the report, not at the next flush, so a
        // kept report never stands beside a node that reads as never spoken.
        // Its time written once per node, however many of its reports the batch holds.
        const heard = new Map<string, string>();
        for (const { node } of batch.accounts) {
          const at = heard.has(node) ? undefined : batch.seen.get(node);
          if (at !== undefined) heard.set(node, new Date(at).toISOString());
        }
        await this.context.store.transaction(async (tx) => {
          await tx.accounts.keepMany(batch.accounts);
          await tx.counters.addMany(batch.counters);
          await tx.events.recordMany(batch.events);
          if (heard.size > 0) await tx.nodes.touch(heard);
        });
      }
      // Kept (or nothing to keep): what was told is told, and what was counted counts.
      batch.undo.length = 0;
      settleKept(batch.kept);
      // Committed: each node's last account kept is its recovery copy now.
      const batchMs = batch.at.getTime();
      for (const account of batch.accounts) this.rememberCopy(account.node, account, batchMs);
      // The two streams are consumed side by side: a batch of either may be the older one.
      for (const [node, spokeAt] of batch.seen) {
        const known = this.seen.get(node);
        if (known === undefined || known < spokeAt) this.seen.set(node, spokeAt);
      }
    } catch (error) {
      // Handed back before it was kept: what it told is untold again, and told when its deliveries come again.
      takeBack(batch.undo);
      if (await this.storeFailed(error, deliveries.length)) return deliveries.map(() => "retry");
      this.context.log.error("ingest.failed", {
        deliveries: deliveries.length,
        nodes: [...new Set(deliveries.map((delivery) => delivery.node ?? "*"))].slice(0, 5),
        error: errorText(error),
      });
      return deliveries.map(() => "retry");
    }
    // Kept: from here nothing hands the batch back, which would count its refusals again. A node whose receipt is
    // not sent sends its report again; one not sent its latest declaration again says it is behind in its next alive.
    try {
      this.unsent.take(batch.answers);
      await this.sendReceipts(false, batch.reportedAt);
      await this.catchUp(batch.holds);
    } catch (error) {
      this.context.log.warn("ingest.answers_failed", {
        deliveries: deliveries.length,
        error: errorText(error),
        note: "the batch is kept; its nodes ask again",
      });
    }
    return deliveries.map(() => "done");
  }

  private async storeFailed(error: unknown, handedBack: number): Promise<boolean> {
    const told = this.context.storeFailed;
    if (told === undefined) return false;
    return told(error, handedBack).catch((checkError: unknown) => {
      this.context.log.error("ingest.store_check_failed", { error: errorText(checkError) });
      return false;
    });
  }

  /**
   * Sends the receipts of the batches written. A node sent one less than `receiptsEveryMs` ago, for a report the
   * broker had already when that one went, waits for the period's sending, which sends every receipt waiting once the
   * period since the last such sending is up (a timer, when no batch comes then); any other node is answered at once.
   * So a node whose reports were waiting together (a backlog drained) is sent about one receipt a period, for its
   * newest, while a node whose report reached the broker after its last receipt went hears at once: a roll-out's
   * nodes, each reporting once, however soon after the one before, and a node reporting after a quiet time. A node
   * sending report after report hears at most once a batch, never more often than it reports. A node sends a report
   * again until its receipt comes, and a report kept twice is taken quietly: so a batch is acknowledged without
   * waiting for the broker to confirm its receipts. One sending may be on its way while the next batch is handled,
   * no more.
   */
  private async sendReceipts(due: boolean, heard: ReadonlyMap<string, number> = new Map()): Promise<void> {
    if (this.closed || this.unsent.size === 0) return;
    // Nothing to send now: the receipts wait for the period's sending, and the batch does not wait for the last one.
    if (this.choose(due, heard) === undefined) return;
    // Another call may start a sending while this one waits: it waits until none is on its way, and chooses again.
    let onItsWay: Promise<void>;
    do {
      onItsWay = this.receiptsOnTheirWay;
      await onItsWay;
    } while (onItsWay !== this.receiptsOnTheirWay);
    if (this.closed) return;
    const chosen = this.choose(due, heard);
    if (chosen === undefined) return;
    const { all, atOnce, now } = chosen;
    if (all) {
      clearTimeout(this.receiptTimer);
      this.receiptTimer = undefined;
      this.receiptsSentAt = now;
    }
    const receipts = all ? this.unsent.drain() : this.unsent.drain(atOnce);
    if (receipts.length === 0) return;
    for (const { node } of receipts) {
      this.answeredAt.delete(node);
      this.answeredAt.set(node, now);
    }
    this.context.receiptsSent?.(receipts.length);
    this.receiptsOnTheirWay = Promise.all(
      receipts.map(({ node, receipt }) => this.context.bus.publishReceipt(node, encodeReceipt(receipt))),
    ).then(
      () => undefined,
      (error: unknown) =>
        this.context.log.warn("receipt.not_sent", {
          receipts: receipts.length,
          error: errorText(error),
          note: "their nodes send the reports again",
        }),
    );
  }

  /**
   * What to send now: everything waiting once the period's sending is due, or else the nodes of `heard` (each with
   * the latest time the broker had one of its reports of the batch) not answered within the period or answered before
   * the broker had that report, with the timer set for the period's sending; undefined when there is nothing to send
   * now.
   */
  private choose(
    due: boolean,
    heard: ReadonlyMap<string, number>,
  ): { all: boolean; atOnce: readonly string[]; now: number } | undefined {
    if (this.unsent.size === 0) return undefined;
    const everyMs = this.context.receiptsEveryMs ?? 0;
    const now = this.context.now().getTime();
    this.forgetAnsweredBefore(now - everyMs);
    const waitMs = this.receiptsSentAt + everyMs - now;
    if (due || waitMs <= 0) return { all: true, atOnce: [], now };
    // A clock set back waits no longer than the period.
    this.receiptTimer ??= setTimeout(
      () => {
        this.receiptTimer = undefined;
        this.sendReceipts(true).catch((error: unknown) =>
          this.context.log.error("receipt.not_sent", { error: errorText(error) }),
        );
      },
      Math.min(waitMs, everyMs),
    );
    // Waits: answered within the period (after its start and not after now: a time ahead of a clock set back is
    // not), for a report the broker had already then. A report it had at that very millisecond waits too.
    const waits = (node: string, reportedAt: number) => {
      const at = this.answeredAt.get(node);
      return at !== undefined && at > now - everyMs && at <= now && reportedAt <= at;
    };
    const atOnce = [...heard].filter(([node, reportedAt]) => !waits(node, reportedAt)).map(([node]) => node);
    return atOnce.length === 0 ? undefined : { all: false, atOnce, now };
  }

  /** Forgets the nodes answered at or before `cutoff`, oldest first: the map holds one entry a node at most. */
  private forgetAnsweredBefore(cutoff: number): void {
    for (const [node, at] of this.answeredAt) {
      if (at > cutoff) return;
      this.answeredAt.delete(node);
    }
  }

  /**
   * Ends the sending of receipts (the bus is closing): those still waiting are not sent, and their nodes send
   * their reports again to whichever control plane acts next, which takes them quietly.
   */
  close(): void {
    this.closed = true;
    clearTimeout(this.receiptTimer);
    this.receiptTimer = undefined;
    const dropped = this.unsent.drain().length;
    if (dropped > 0) {
      this.context.log.info("receipt.not_sent", {
        receipts: dropped,
        note: "their nodes send the reports again",
      });
    }
  }

  /** Decides every delivery of the batch, reading what it needs from the store in a few statements. */
  private async judge(deliveries: readonly ControlDelivery[], batch: Batch): Promise<void> {
    const records = await this.nodeRecords(deliveries, batch.at.getTime());
    const reports: Array<{ node: string; report: Report; text: string; enrolledAt: string | null }> = [];
    for (const delivery of deliveries) {
      const node = delivery.node;
      if (node === undefined) {
        this.refuse(batch, "*", delivery.kind, "the subject names no valid node");
        continue;
      }
      if (delivery.misrouted !== undefined) {
        this.refuse(batch, node, delivery.kind, delivery.misrouted);
        continue;
      }
      // Only an enrolled node speaks: a retired node's identity may still be known to a broker that restarted.
      const record = records.get(node);
      if (record?.state !== "enrolled") {
        this.refuse(
          batch,
          node,
          delivery.kind,
          `node ${node} is ${record?.state ?? "unknown"}, not enrolled`,
        );
        continue;
      }
      const before = fromMachineBefore(delivery, record);
      if (before !== undefined) {
        // No receipt: the machine that sent it is gone, and its report numbers are not the new machine's.
        this.refuse(batch, node, delivery.kind, before, `${delivery.kind}_from_before_enrolment`);
        continue;
      }
      // Never in the future, whatever the clocks say (and the batch's time for a time that is no time at all).
      const received = delivery.receivedAt.getTime();
      const spokeAt = Number.isFinite(received) ? Math.min(received, batch.at.getTime()) : batch.at.getTime();
      if (delivery.kind === "alive") {
        this.alive(batch, node, delivery.body, spokeAt);
        continue;
      }
      let report: Report;
      let text: string;
      try {
        ({ report, text } = parseReportText(delivery.body));
      } catch (error) {
        if (!(error instanceof ContractError)) throw error;
        this.refuse(batch, node, "report", error.reason);
        continue;
      }
      if (report.node !== node) {
        this.refuse(batch, node, "report", `its body names node ${report.node}`);
        continue;
      }
      batch.seen.set(node, spokeAt);
      if (spokeAt > (batch.reportedAt.get(node) ?? Number.NEGATIVE_INFINITY))
        batch.reportedAt.set(node, spokeAt);
      reports.push({
        node,
        report,
        text,
        enrolledAt: record.enrolledAt,
      });
    }
    if (reports.length > 0) await this.reports(reports, batch);
  }

  /**
   * The records of the batch's nodes, one read a moment ago will do: a node retired meanwhile is refused by the
   * broker at once anyway, and a node enrolling again is forgotten here as it enrols (`forget`), so its reports are
   * ordered by its new enrolment at once.
   */
  private async nodeRecords(
    deliveries: readonly ControlDelivery[],
    nowMs: number,
  ): Promise<Map<string, NodeStanding>> {
    const records = new Map<string, NodeStanding>();
    const toRead = new Set<string>();
    for (const { node } of deliveries) {
      if (node === undefined || records.has(node)) continue;
      const known = this.remembered(this.enrolled, node, nowMs);
      if (known === undefined) toRead.add(node);
      else records.set(node, known.value);
    }
    if (toRead.size === 0) return records;
    const read = await this.context.store.nodes.standings([...toRead]);
    for (const node of toRead) {
      const record = read.get(node);
      if (record === undefined) records.delete(node);
      else records.set(node, record);
      if (record?.state === "enrolled") this.remember(this.enrolled, node, record, nowMs);
      else this.enrolled.delete(node);
    }
    return records;
  }

  /** Drops what was taken as read about a node: it enrolled again (its report order starts anew). */
  forget(node: string): void {
    this.enrolled.delete(node);
    this.copies.delete(node);
    this.named.delete(node);
    this.latestOrder.delete(node);
  }

  /**
   * Writes the batched `last_seen` times, and tells the refusals and the changes of outcome held back in windows that
   * have ended. One flush at a time (what one tells is marked told at once and unmarked should its events not be kept:
   * two side by side would tell it twice): one asked for while another runs waits for it, and those asked for
   * meanwhile share that one.
   */
  flush(): Promise<void> {
    if (this.flushing === undefined) {
      const flushing = this.flushOnce().finally(() => {
        if (this.flushing === flushing) this.flushing = undefined;
      });
      this.flushing = flushing;
      return flushing;
    }
    const next = () => {
      this.flushNext = undefined;
      return this.flush();
    };
    // The failure of the one under way is its own caller's to tell: this one runs after it either way.
    this.flushNext ??= this.flushing.then(next, next);
    return this.flushNext;
  }

  private async flushOnce(): Promise<void> {
    const now = this.context.now();
    const undo: TakeBack = [];
    const refusals = this.refusals.due(now, undo);
    const outcomes = this.outcomesDue(now.getTime(), undo);
    try {
      await this.context.store.events.recordMany([...refusals, ...outcomes]);
    } catch (error) {
      takeBack(undo);
      throw error;
    }
    if (this.seen.size === 0) return;
    const taken = [...this.seen];
    this.seen.clear();
    try {
      await this.context.store.nodes.touch(
        new Map(taken.map(([node, at]) => [node, new Date(at).toISOString()])),
      );
    } catch (error) {
      // Written at the next flush, unless the node spoke later meanwhile.
      for (const [node, at] of taken) {
        const later = this.seen.get(node);
        if (later === undefined || later < at) this.seen.set(node, at);
      }
      throw error;
    }
  }

  /** Logs a failed or refused account; returns its event, with how many changes it stands for when held back. */
  private tellOutcome(event: MeshEvent, changes?: number): MeshEvent {
    const detail = event.detail as { reason: string };
    this.context.log.warn(`node.${event.kind.replace(".", "_")}`, {
      node: event.node,
      reason: detail.reason,
      ...(changes === undefined ? {} : { changes }),
    });
    return changes === undefined ? event : { ...event, detail: { ...event.detail, changes } };
  }

  /**
   * The changes of outcome held back in windows that have ended, to tell now, but for nodes whose held change a batch
   * still under way made (told at a flush after it is kept or handed back); and those a flush could not tell after
   * their entries were replaced (`outcomesRetold`), with the node's own when both are due. The nodes told nothing for
   * a whole window are forgotten, so what is remembered is bounded by the nodes failing now. Each told is marked so at
   * once, in place (a batch judged while the flush writes sees it told, and holds back only what comes after); the
   * steps in `undo` unmark them should the events not be kept.
   */
  private outcomesDue(nowMs: number, undo: TakeBack): MeshEvent[] {
    const due: MeshEvent[] = [];
    const retold = new Map(this.outcomesRetold);
    this.outcomesRetold.clear();
    for (const [node, told] of this.outcomes) {
      if (nowMs - told.toldAt < refusalWindowMs) continue;
      const { toldAt, held } = told;
      if (held === undefined) {
        this.outcomes.delete(node);
        continue;
      }
      if (this.outcomesUnderWay.has(node)) continue;
      const waiting = retold.get(node);
      retold.delete(node);
      due.push(this.tellOutcome(held.event, held.changes + (waiting?.changes ?? 0)));
      told.toldAt = nowMs;
      told.held = undefined;
      undo.push(() => {
        if (waiting !== undefined) this.retell(node, waiting);
        this.untell(node, told, toldAt, held);
      });
    }
    for (const [node, waiting] of retold) {
      due.push(this.tellOutcome(waiting.event, waiting.changes));
      undo.push(() => this.retell(node, waiting));
    }
    return due;
  }

  /**
   * Takes back a flush's telling of `held` from `told`, whose events were not kept. Batches replace an entry, never
   * change one: only a flush does, and one flush runs at a time. Still the node's entry (or forgotten since), it is
   * unmarked in place; replaced by a batch meanwhile, it stays marked (should that batch be handed back, it puts this
   * one back, told) and what was not told waits apart for the next flush, out of every batch's reach.
   */
  private untell(
    node: string,
    told: OutcomeTold,
    toldAt: number,
    held: NonNullable<OutcomeTold["held"]>,
  ): void {
    const now = this.outcomes.get(node);
    if (now === undefined || now === told) {
      told.toldAt = toldAt;
      told.held = held;
      if (now === undefined) this.outcomes.set(node, told);
      return;
    }
    this.retell(node, held);
  }

  /** Keeps a change a flush could not tell for the next one, with any kept before it (the later event, the counts added). */
  private retell(node: string, held: NonNullable<OutcomeTold["held"]>): void {
    const waiting = this.outcomesRetold.get(node);
    this.outcomesRetold.set(node, { event: held.event, changes: held.changes + (waiting?.changes ?? 0) });
  }

  /** Notes that `batch`, still under way, changed the outcome held back for `node`, until it is kept or handed back. */
  private holdUnderWay(node: string, batch: Batch): void {
    addToCount(this.outcomesUnderWay, node, 1);
    const settled = () => addToCount(this.outcomesUnderWay, node, -1);
    batch.undo.push(settled);
    batch.kept.push(settled);
  }

  private alive(batch: Batch, node: string, body: Uint8Array, spokeAt: number): void {
    if (body.byteLength > aliveMaxBytes) {
      return this.refuse(
        batch,
        node,
        "alive",
        `is ${body.byteLength} bytes, at most ${aliveMaxBytes} are allowed`,
      );
    }
    let alive;
    try {
      alive = parseAlive(body);
    } catch (error) {
      if (!(error instanceof ContractError)) throw error;
      return this.refuse(batch, node, "alive", error.reason);
    }
    if (alive.node !== node) return this.refuse(batch, node, "alive", `its body names node ${alive.node}`);
    // An alive moves last_seen and nothing else: it is never an account, so it can never empty a recovery copy.
    batch.seen.set(node, spokeAt);
    if (alive.holds !== undefined) batch.holds.set(node, alive.holds);
  }

  /** Sends their latest declaration again to nodes whose alive says they hold an older one. */
  private async catchUp(holds: ReadonlyMap<string, { epoch: number; sequence: number }>): Promise<void> {
    if (holds.size === 0) return;
    const latestOf = new Map<string, LatestOrder | undefined>();
    const lookedAt = this.context.now().getTime();
    for (const node of holds.keys()) {
      const known = this.remembered(this.latestOrder, node, lookedAt);
      if (known !== undefined) latestOf.set(node, known.value);
    }
    const toRead = [...holds.keys()].filter((node) => !latestOf.has(node));
    if (toRead.length > 0) {
      const read = await this.context.store.declarations.latestOrders(toRead);
      for (const node of toRead) {
        latestOf.set(node, read.get(node));
        this.remember(this.latestOrder, node, read.get(node), lookedAt);
      }
    }
    const now = this.context.now().getTime();
    for (const [node, held] of holds) {
      const latest = latestOf.get(node);
      if (latest === undefined) continue;
      if (compareDeclarationOrder(held, latest) >= 0) continue;
      // Counted from its sending too: a node busy with its queue says it holds the one before until it gets there,
      // and sending it again then only lengthens that queue.
      const sentAt = Math.max(this.lastResend.get(node) ?? 0, Date.parse(latest.issuedAt));
      if (now - sentAt < this.context.resendAfterMs) continue;
      this.lastResend.set(node, now);
      await resendLatest(this.context.store, this.context.bus, node);
    }
  }

  /** Judges the batch's reports in order, each against its node's account as the reports before it left it. */
  private async reports(
    reports: ReadonlyArray<{ node: string; report: Report; text: string; enrolledAt: string | null }>,
    batch: Batch,
  ): Promise<void> {
    const copies = await this.recoveryCopies(
      reports.map(({ node }) => node),
      batch.at.getTime(),
    );
    // A machine that enrolled again starts its report counter anew: accounts from before are not its order.
    const kept = new Map<string, AccountRecord>();
    for (const { node, enrolledAt } of reports) {
      const copy = copies.get(node);
      if (copy !== undefined && !(enrolledAt !== null && copy.receivedAt < enrolledAt)) kept.set(node, copy);
    }
    // A declaration's place is looked up by its digest only for what does not carry its place itself (a report
    // or an account without epoch, sequence and report sequence): a report from a current agent never needs it.
    const orders = await this.context.store.declarations.ordersOfDigests([
      ...reports.flatMap(({ node, report }) =>
        report.sequence === undefined || accountOfReport(report).order === undefined
          ? [{ node, digest: report.digest }]
          : [],
      ),
      ...[...kept.values()].flatMap((copy) =>
        accountOf(copy).order === undefined ? [{ node: copy.node, digest: copy.digest }] : [],
      ),
    ]);
    const sent = await this.sentAt(
      reports.flatMap(({ node, report }) =>
        report.sequence === undefined || report.sequence === 0 ? [] : [{ node, sequence: report.sequence }],
      ),
    );
    const now = batch.at.toISOString();
    for (const { node, report, text } of reports) {
      const keptRecord = kept.get(node);
      // The very report already kept, sent again because its receipt was lost: take it again, quietly.
      if (keptRecord !== undefined && keptRecord.report === text) {
        batch.receipt(node, report, "kept");
        continue;
      }
      const judgement = judgeReport(accountOfReport(report), keptRecord && accountOf(keptRecord), (digest) =>
        orders.get(digestKey(node, digest)),
      );
      if (judgement.verdict === "refuse") {
        this.refuse(batch, node, "report", judgement.reason, "report_out_of_order");
        batch.receipt(node, report, "refused", judgement.reason);
        continue;
      }
      const unsent = neverSent(node, report, sent, (digest) => orders.get(digestKey(node, digest)));
      if (unsent !== undefined) {
        this.refuse(batch, node, "report", unsent, "report_never_sent");
        batch.receipt(node, report, "refused", unsent);
        continue;
      }
      const account: AccountRecord = {
        node,
        receivedAt: now,
        epoch: report.epoch ?? null,
        sequence: report.sequence ?? null,
        reportSequence: report.report_sequence ?? null,
        digest: report.digest,
        outcome: report.outcome,
        report: text,
      };
      const before = kept.get(node);
      batch.accounts.push(account);
      kept.set(node, account);
      // Counted every time; told when the node reports on a declaration it had not reported on before, and when its
      // outcome for the same declaration changes, at most once a minute: not at every report saying the same again
      // (a node retrying a failed item reports it each time), nor at every turn of a node flipping between failed
      // and refused. A change held back is told when its minute is over (by a flush, or by the node's next change
      // should that come first), or with the node's first account of another declaration, unless the node applied a
      // declaration meanwhile. What one node can add to the trail is bounded by what it was sent and by the clock.
      // Each change to what was told is undone should the batch not be kept (`setUndoably`).
      const nowMs = batch.at.getTime();
      const told = this.outcomes.get(node);
      if (report.outcome === "applied") {
        if (told?.held !== undefined) setUndoably(this.outcomes, node, { toldAt: told.toldAt }, batch.undo);
      } else {
        batch.counters.push({ node, name: `declarations_${report.outcome}`, by: 1 });
        const event = outcomeEvent(node, report, now);
        if (before === undefined || !sameDeclaration(before, account)) {
          // A change held back about the declaration before is told first, so it is not passed over.
          if (told?.held !== undefined)
            batch.events.push(this.tellOutcome(told.held.event, told.held.changes));
          setUndoably(this.outcomes, node, { toldAt: nowMs }, batch.undo);
          batch.events.push(this.tellOutcome(event));
        } else if (before.outcome !== account.outcome) {
          if (told?.held !== undefined && nowMs - told.toldAt >= refusalWindowMs) {
            // The change held back, its minute over before a flush told it: told now, as the minute's end would have
            // told it, and this change held back for the minute that starts.
            batch.events.push(this.tellOutcome(told.held.event, told.held.changes));
            setUndoably(this.outcomes, node, { toldAt: nowMs, held: { event, changes: 1 } }, batch.undo);
            this.holdUnderWay(node, batch);
          } else if (
            told?.held === undefined &&
            (told === undefined || nowMs - told.toldAt >= refusalWindowMs)
          ) {
            setUndoably(this.outcomes, node, { toldAt: nowMs }, batch.undo);
            batch.events.push(this.tellOutcome(event));
          } else {
            const held = { event, changes: (told.held?.changes ?? 0) + 1 };
            setUndoably(this.outcomes, node, { toldAt: told.toldAt, held }, batch.undo);
            this.holdUnderWay(node, batch);
          }
        }
      }
      const drifted = report.items.filter((item) => item.drift !== undefined);
      if (drifted.length > 0) {
        batch.counters.push({ node, name: "drift_repaired", by: drifted.length });
        // A drift is an event, at most one a minute per node: what a node can add to the trail stays bounded.
        const last = this.driftToldAt.get(node);
        if (last === undefined || nowMs - last >= refusalWindowMs) {
          setUndoably(this.driftToldAt, node, nowMs, batch.undo);
          // Each entry bounded as a reason is, its id cut first: an item's id alone may be kilobytes long.
          const items = drifted
            .slice(0, 10)
            .map((item) => boundText(`${boundText(item.id, driftIdShown)}: ${item.drift ?? ""}`));
          batch.events.push({
            at: now,
            kind: "node.drift",
            node,
            epoch: report.epoch ?? null,
            detail: { items, count: drifted.length, sequence: report.sequence ?? null },
          });
          this.context.log.warn("node.drift", { node, count: drifted.length, items: items.slice(0, 3) });
        }
      }
      batch.receipt(node, report, "kept");
    }
  }

  /** The recovery copies of these nodes: as kept or read a moment ago, else read (in one statement). */
  private async recoveryCopies(nodes: readonly string[], nowMs: number): Promise<Map<string, AccountRecord>> {
    const copies = new Map<string, AccountRecord>();
    const toRead = new Set<string>();
    for (const node of nodes) {
      const known = this.remembered(this.copies, node, nowMs);
      if (known === undefined) toRead.add(node);
      else if (known.value !== undefined) copies.set(node, known.value);
    }
    if (toRead.size === 0) return copies;
    const read = await this.context.store.accounts.recoveryCopies([...toRead]);
    for (const node of toRead) {
      const copy = read.get(node);
      if (copy !== undefined) copies.set(node, copy);
      this.rememberCopy(node, copy, nowMs);
    }
    return copies;
  }

  /** Holds a node's recovery copy in memory, unless its report is long: what is held stays small per node. */
  private rememberCopy(node: string, copy: AccountRecord | undefined, nowMs: number): void {
    if (copy !== undefined && copy.report.length > copyHeldMaxChars) this.copies.delete(node);
    else this.remember(this.copies, node, copy, nowMs);
  }

  /**
   * The epoch and digest of the declarations at these (node, sequence) places, by `sequenceKey`. A node's reports
   * name the declaration they are about, the same one report after report: the one named last is held per node
   * (a declaration once sent never changes), and only other places are read.
   */
  private async sentAt(
    wanted: readonly { node: string; sequence: number }[],
  ): Promise<Map<string, { epoch: number; digest: string }>> {
    const found = new Map<string, { epoch: number; digest: string }>();
    const toRead: { node: string; sequence: number }[] = [];
    for (const { node, sequence } of wanted) {
      const named = this.named.get(node);
      if (named?.sequence === sequence) found.set(sequenceKey(node, sequence), named);
      else toRead.push({ node, sequence });
    }
    if (toRead.length === 0) return found;
    const read = await this.context.store.declarations.atSequences(toRead);
    for (const { node, sequence } of toRead) {
      const declaration = read.get(sequenceKey(node, sequence));
      if (declaration === undefined) continue;
      found.set(sequenceKey(node, sequence), declaration);
      this.named.set(node, { sequence, ...declaration });
    }
    return found;
  }

  /** Counts a refusal always; tells it (log and event) at most once a minute per node and kind. */
  private refuse(
    batch: Batch,
    node: string,
    kind: string,
    reason: string,
    counter = `${kind}_refused`,
  ): void {
    batch.counters.push({ node, name: counter, by: 1 });
    const event = this.refusals.note(
      { node, kind, reason, detail: { counter } },
      batch.at,
      batch.undo,
      batch.kept,
    );
    if (event !== undefined) batch.events.push(event);
  }
}

/**
 * How much earlier than a node's latest enrolment the broker's clock may say it received the new machine's first
 * message: the broker's host and the control plane's keep their own time. A machine rebuilt and joined again sent
 * its last message long before.
 */
const brokerClockSkewMs = 1000;

/**
 * Why a message comes from the machine this node was before its latest enrolment (a machine rebuilt and joined
 * again; its last messages waited in the queue), or undefined when it comes from the current one. Taken as the new
 * machine's, an old report would set the node's report order, and the new machine's reports, counted from 1
 * again, would be refused as older. The broker tells the identity that published (RabbitMQ); else (NATS) its own
 * time of receipt says whether the message came before the enrolment, which began before the new machine had
 * any identity to send with (less `brokerClockSkewMs`).
 */
function fromMachineBefore(delivery: ControlDelivery, standing: NodeStanding): string | undefined {
  if (delivery.identity !== undefined) {
    return delivery.identity === standing.brokerUser
      ? undefined
      : `sent by an identity the node had before its latest enrolment (${boundText(delivery.identity)})`;
  }
  if (standing.enrolledAt === null) return undefined;
  const enrolledAt = Date.parse(standing.enrolledAt);
  return delivery.receivedAt.getTime() < enrolledAt - brokerClockSkewMs
    ? `received by the broker at ${delivery.receivedAt.toISOString()}, before the node's latest enrolment at ${standing.enrolledAt}`
    : undefined;
}

/** How much of an item's id a drift's event keeps: the rest of its entry is the drift. */
const driftIdShown = 200;

/** The event of a failed or refused account. */
function outcomeEvent(node: string, report: Report, at: string): MeshEvent {
  return {
    at,
    kind: `declaration.${report.outcome}`,
    node,
    epoch: report.epoch ?? null,
    detail: { reason: boundText(report.reason ?? ""), sequence: report.sequence ?? null },
  };
}

/**
 * Whether two accounts are of the same declaration: the same digest, and the same place where both say theirs (an
 * older agent's report names none, and is judged by its digest alone).
 */
export function sameDeclaration(
  one: Pick<AccountRecord, "digest" | "epoch" | "sequence">,
  other: Pick<AccountRecord, "digest" | "epoch" | "sequence">,
): boolean {
  if (one.digest !== other.digest) return false;
  if (one.sequence === null || other.sequence === null) return true;
  return one.epoch === other.epoch && one.sequence === other.sequence;
}

/**
 * Why a report is about no declaration this control plane sent to its node, or undefined when it is about one. A
 * node that has applied nothing yet reports sequence 0 with the empty digest. Declarations older than the node's
 * kept history are no longer known, and a report about one is refused the same way (it is older than what was kept).
 */
function neverSent(
  node: string,
  report: Report,
  sent: ReadonlyMap<string, { epoch: number; digest: string }>,
  orderOfDigest: (digest: string) => { epoch: number; sequence: number } | undefined,
): string | undefined {
  if (report.sequence === undefined) {
    if (report.digest === emptyDigest || orderOfDigest(report.digest) !== undefined) return undefined;
    return `never sent: no declaration with digest ${report.digest} was sent to ${node}`;
  }
  if (report.sequence === 0) {
    if (report.digest === emptyDigest) return undefined;
    return `never sent: sequence 0 stands for no declaration, yet the report names digest ${report.digest}`;
  }
  const declaration = sent.get(sequenceKey(node, report.sequence));
  if (
    declaration !== undefined &&
    declaration.epoch === report.epoch &&
    declaration.digest === report.digest
  ) {
    return undefined;
  }
  return (
    `never sent: no declaration at epoch ${report.epoch ?? "?"}, sequence ${report.sequence} ` +
    `with digest ${report.digest} was sent to ${node} (or it is older than the history kept)`
  );
}

/** The stored account in the form the ordering rules judge. */
function accountOf(record: AccountRecord): ReportAccount {
  return record.epoch !== null && record.sequence !== null && record.reportSequence !== null
    ? {
        digest: record.digest,
        order: { epoch: record.epoch, sequence: record.sequence, report_sequence: record.reportSequence },
      }
    : { digest: record.digest };
}

/** What one batch decided: written together, then answered. */
class Batch {
  readonly accounts: AccountRecord[] = [];
  readonly counters: Array<{ node: string; name: string; by: number }> = [];
  readonly events: MeshEvent[] = [];
  /** Each node's receipts to send once the batch is written. */
  readonly answers = new Answers();
  /** The latest time the broker had one of each node's reports of the batch (ms, never ahead of the batch's time). */
  readonly reportedAt = new Map<string, number>();
  /** When each node spoke (ms), taken into `last_seen` once the batch is written. */
  readonly seen = new Map<string, number>();
  /** What each node's latest alive says it holds. */
  readonly holds = new Map<string, { epoch: number; sequence: number }>();
  /** Undoes what judging the batch told (refusals, outcomes, drifts), should the batch not be kept. */
  readonly undo: TakeBack = [];
  /** Counts the refusals the batch only counted for telling, and lets what it held back be told, once it is kept. */
  readonly kept: OnceKept = [];

  constructor(readonly at: Date) {}

  /**
   * Notes the answer to a report taken, which tells its node to stop sending it: sent once the batch is written,
   * should it be the node's newest or last (`Answers`). Reports without a report_sequence get none.
   */
  receipt(node: string, report: Report, verdict: "kept" | "refused", reason?: string): void {
    if (report.report_sequence === undefined) return;
    this.answers.note({
      kind: "receipt",
      node,
      report_sequence: report.report_sequence,
      verdict,
      ...(reason === undefined ? {} : { reason: boundText(reason) }),
    });
  }
}

/**
 * Each node's receipts to send: for its newest report (by report_sequence), and for the last to arrive where that is
 * another one (a node that joined again counts from 1). A node keeps only its newest report pending, so a receipt
 * for any report it sent before that one would change nothing there: a node that reported many times while the
 * control plane was away is sent one receipt, not one per report.
 */
class Answers {
  private readonly byNode = new Map<string, { newest: Receipt; last: Receipt }>();

  get size(): number {
    return this.byNode.size;
  }

  note(receipt: Receipt): void {
    const known = this.byNode.get(receipt.node);
    if (known === undefined) {
      this.byNode.set(receipt.node, { newest: receipt, last: receipt });
      return;
    }
    known.last = receipt;
    // The same report again is answered as it was judged last.
    if (receipt.report_sequence >= known.newest.report_sequence) known.newest = receipt;
  }

  /** Takes in the answers of a later batch, as if its reports had arrived after these. */
  take(later: Answers): void {
    for (const { newest, last } of later.byNode.values()) {
      this.note(newest);
      // The last is never newer than the newest it differs from: noted second, it stays the last.
      if (last !== newest) this.note(last);
    }
  }

  /** The nodes answered. */
  nodes(): string[] {
    return [...this.byNode.keys()];
  }

  /** The receipts to send (every node's, or those of `nodes`), which are then no longer held here. */
  drain(nodes?: readonly string[]): Array<{ node: string; receipt: Receipt }> {
    const receipts: Array<{ node: string; receipt: Receipt }> = [];
    for (const node of nodes ?? [...this.byNode.keys()]) {
      const answers = this.byNode.get(node);
      if (answers === undefined) continue;
      receipts.push({ node, receipt: answers.newest });
      if (answers.last !== answers.newest) receipts.push({ node, receipt: answers.last });
      this.byNode.delete(node);
    }
    return receipts;
  }
}

/** Sets `key` to `value`; the step in `undo` sets it back to what it was, unless it was changed again since. */
function setUndoably<K, V>(map: Map<K, V>, key: K, value: V, undo: TakeBack): void {
  const had = map.has(key);
  const previous = map.get(key);
  map.set(key, value);
  undo.push(() => {
    // Forgotten since (a flush forgets what is quiet) is as good as still standing: nothing took its place.
    if (map.has(key) && map.get(key) !== value) return;
    if (had) map.set(key, previous as V);
    else map.delete(key);
  });
}
