/**
 * Whether the acting control plane hears: the broker answering its questions, the store taking its writes. Each
 * loss is said once, and once again when it ends, with how long it lasted. What is heard is kept in the store
 * (`store.hearing`) so liveness is judged only over time someone listened, by this process and by every command.
 *
 * While the store cannot be written, the control queue waits: `storeWritable()` holds the consumer before its next
 * batch, so nothing is acknowledged that was not stored, and the periodic work over the store is skipped.
 */
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Store } from "../store/index.js";

export interface HearingSettings {
  store: Pick<Store, "hearing">;
  /** The broker's answer to one question (the control queue's backlog); a failure or no answer in time is deafness. */
  backlog: () => Promise<number>;
  log: Logger;
  now: () => Date;
  /** How often hearing is checked (and written to the store). */
  everyMs: number;
  /** How long the broker may take to answer before the control plane counts itself deaf. */
  answerWithinMs: number;
}

interface Loss {
  since: number;
  reason: string;
}

export class Hearing {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private broker: Loss | undefined;
  private storeLoss: (Loss & { handedBack: number }) | undefined;
  /** The start of the stretch of hearing the store knows; undefined until it has begun one. */
  private since: string | undefined;
  /** The last moment the broker answered. */
  private heardAt: string | undefined;
  private pending: Promise<number> | undefined;
  private storeBack: Array<() => void> = [];

  constructor(private readonly settings: HearingSettings) {}

  /** Whether the control plane can hear the broker and write the store now. */
  get hears(): boolean {
    return this.broker === undefined && this.storeLoss === undefined;
  }

  /** Whether the store is known to take no writes now. */
  get storeDown(): boolean {
    return this.storeLoss !== undefined;
  }

  /** Begins a stretch of hearing (the time since the last one is a gap) and checks every period from here. */
  async start(): Promise<void> {
    await this.check();
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    for (const wake of this.storeBack.splice(0)) wake();
  }

  /**
   * Resolves when the store is not known to be down (at once, usually). The consumer waits here before each batch,
   * so messages stay in the broker, unacknowledged, for as long as the store cannot take them.
   */
  storeWritable(): Promise<void> {
    if (this.storeLoss === undefined || this.stopped) return Promise.resolve();
    return new Promise((resolve) => this.storeBack.push(resolve));
  }

  /**
   * A write failed. When the store does not take a write now either, it is down: said once, and the control queue
   * waits for it. Returns whether it was the store (the caller reports any other failure itself).
   */
  async storeFailed(error: unknown, handedBack: number): Promise<boolean> {
    if (this.storeLoss !== undefined) {
      this.storeLoss.handedBack += handedBack;
      return true;
    }
    if (await this.storeTakesWrites()) return false;
    this.lostStore(errorText(error), handedBack);
    return true;
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.check()
        .catch((error: unknown) =>
          this.settings.log.error("hearing.check_failed", { error: errorText(error) }),
        )
        .finally(() => this.schedule());
    }, this.settings.everyMs);
  }

  /** One check: ask the broker, then tell the store (which is also how a store outage is seen, and its end). */
  private async check(): Promise<void> {
    const { now } = this.settings;
    const answer = await this.askBroker();
    const at = now().toISOString();
    if (typeof answer === "number") {
      this.heardAt = at;
      if (this.broker !== undefined) this.brokerBack();
    } else if (this.broker === undefined) {
      this.lostBroker(answer.reason);
    }
    // Only a write begun after the loss was known says the store is back: one already under way when the loss was
    // found may have reached the store just before it went.
    const lossBefore = this.storeLoss;
    const wrote = await this.writeHearing(at);
    if (!wrote.ok) {
      if (this.storeLoss === undefined) this.lostStore(wrote.reason, 0);
      return;
    }
    if (lossBefore !== undefined && this.storeLoss === lossBefore)
      this.storeIsBack(typeof answer === "number" ? answer : undefined);
  }

  /** The broker's answer, or why there was none: an error, or no answer within the time allowed. */
  private async askBroker(): Promise<number | { reason: string }> {
    const { backlog, answerWithinMs } = this.settings;
    // A question still unanswered from the last check is waited for rather than asked again beside it; one left
    // unanswered past the time allowed is given up, and the next check asks afresh.
    const asked = (this.pending ??= backlog());
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<{ reason: string }>((resolve) => {
      timer = setTimeout(() => resolve({ reason: `no answer within ${answerWithinMs} ms` }), answerWithinMs);
    });
    void asked.then(
      () => this.forget(asked),
      () => this.forget(asked),
    );
    try {
      const answer = await Promise.race([asked, late]);
      if (typeof answer !== "number") this.forget(asked);
      return answer;
    } catch (error) {
      return { reason: errorText(error) };
    } finally {
      clearTimeout(timer);
    }
  }

  private forget(question: Promise<number>): void {
    if (this.pending === question) this.pending = undefined;
  }

  /**
   * Records the hearing: a new stretch when none is open (the first check, or the first after a loss), else the
   * moment heard. While the broker is deaf the stretch stays where it ended; the store is still written, to know it
   * takes writes.
   */
  private async writeHearing(at: string): Promise<{ ok: true } | { ok: false; reason: string }> {
    const { store, log } = this.settings;
    try {
      if (this.broker !== undefined || this.heardAt === undefined) {
        await store.hearing.heard(this.heardAt ?? at, this.since ?? at);
      } else if (this.since === undefined) {
        const gap = await store.hearing.begin(at);
        this.since = at;
        if (gap !== undefined)
          log.info("control.hearing_begins", { unheard_from: gap.from, unheard_to: gap.to });
      } else {
        await store.hearing.heard(at, this.since);
      }
      return { ok: true };
    } catch (error) {
      return { ok: false, reason: errorText(error) };
    }
  }

  private async storeTakesWrites(): Promise<boolean> {
    const result = await this.writeHearing(this.heardAt ?? this.settings.now().toISOString());
    return result.ok;
  }

  private lostBroker(reason: string): void {
    this.broker = { since: Date.now(), reason };
    this.settings.log.warn("control.deaf", {
      reason,
      last_heard: this.heardAt ?? null,
      note: "the control plane cannot hear the broker; no node is called out of touch for this time",
    });
  }

  private brokerBack(): void {
    const lost = this.broker;
    this.broker = undefined;
    // The stretch that ended with the loss is closed: the next write begins another, and the time between is a gap.
    this.since = undefined;
    if (lost === undefined) return;
    this.settings.log.warn("control.hearing_again", { deaf_for_s: seconds(Date.now() - lost.since) });
  }

  private lostStore(reason: string, handedBack: number): void {
    this.storeLoss = { since: Date.now(), reason, handedBack };
    this.since = undefined;
    this.settings.log.error("store.unreachable", {
      reason,
      note: "node messages wait in the broker, unacknowledged, until the store takes writes again",
    });
  }

  private storeIsBack(waiting: number | undefined): void {
    const lost = this.storeLoss;
    this.storeLoss = undefined;
    if (lost === undefined) return;
    this.settings.log.warn("store.back", {
      unreachable_for_s: seconds(Date.now() - lost.since),
      handed_back: lost.handedBack,
      waiting: waiting ?? null,
    });
    for (const wake of this.storeBack.splice(0)) wake();
  }
}

function seconds(ms: number): number {
  return Math.round(ms / 100) / 10;
}
