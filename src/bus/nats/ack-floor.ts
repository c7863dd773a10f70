/**
 * Which delivery to acknowledge on a consumer where one acknowledgement covers every message before it (JetStream's
 * AckAll): one per batch instead of one per message, which halves what the broker does for each message drained.
 * The cost is that an acknowledgement may never cover a message handed back for redelivery before it has come again
 * and been done: the broker would take it as done and never offer it again. Such a message is owed; the done
 * messages after it are held, and acknowledged at once when nothing owed lies below them.
 */
import type { DeliveryOutcome } from "../bus.js";

/** A delivery as far as acknowledging goes: its place in the stream. */
export interface Sequenced {
  /** The stream sequence. */
  readonly seq: number;
}

export class AckFloor<M extends Sequenced> {
  /** Messages handed back and not done since, by stream sequence, with when they were handed back (ms). */
  private readonly owed = new Map<number, number>();
  /** The done message furthest along the stream, not acknowledged yet. */
  private held: M | undefined;
  /** How far along the stream the acknowledgements reached: the broker takes everything up to it as done. */
  private acknowledged = 0;

  /** How many messages are owed. */
  get owing(): number {
    return this.owed.size;
  }

  /**
   * Takes a batch's outcomes: returns the messages to hand back, and the one message to acknowledge, if any (its
   * acknowledgement covers every message up to it).
   */
  settle(
    batch: readonly M[],
    outcomes: readonly DeliveryOutcome[],
    now: number,
  ): { acknowledge: M | undefined; handBack: M[] } {
    const handBack: M[] = [];
    batch.forEach((message, i) => {
      if (outcomes[i] === "done") {
        this.owed.delete(message.seq);
        if (this.held === undefined || message.seq > this.held.seq) this.held = message;
      } else if (message.seq > this.acknowledged) {
        this.owed.set(message.seq, now);
        handBack.push(message);
      }
      // Handed back at or below what was acknowledged: the broker took it as done already (it was offered again
      // before the acknowledgement reached it), and would ignore its handing back; it is owed nothing.
    });
    return { acknowledge: this.release(), handBack };
  }

  /** The owed messages handed back at least `ms` ago (the broker may have dropped them since: see `gone`). */
  owedLongerThan(ms: number, now: number): number[] {
    return [...this.owed].flatMap(([seq, at]) => (now - at >= ms ? [seq] : []));
  }

  /**
   * Messages the broker no longer holds (a node's newer message pushed them out): they will not come again, and
   * are owed no more. Returns the message that may be acknowledged now, if any.
   */
  gone(seqs: readonly number[]): M | undefined {
    for (const seq of seqs) this.owed.delete(seq);
    return this.release();
  }

  /**
   * The held message, when no owed message lies below it. One owed at its very place was done before and handed
   * back when the broker offered it again: it is settled by the acknowledgement.
   */
  private release(): M | undefined {
    const held = this.held;
    if (held === undefined) return undefined;
    for (const seq of this.owed.keys()) if (seq < held.seq) return undefined;
    this.owed.delete(held.seq);
    this.held = undefined;
    this.acknowledged = Math.max(this.acknowledged, held.seq);
    return held;
  }
}

/**
 * Whether every delivery of a consumer arrived. The broker numbers each delivery to a consumer, a message offered
 * again included, one after another; with one client taking them, a number skipped is a delivery that never
 * arrived (the connection dropped with it on the way). The broker holds it as taken and unacknowledged, and an
 * acknowledgement covering it would make it done without anyone having seen it.
 */
export class DeliveryCount {
  private next = 1;

  /** Counts a delivery by its number; false when one before it never arrived. */
  arrived(deliverySequence: number): boolean {
    const whole = deliverySequence === this.next;
    this.next = deliverySequence + 1;
    return whole;
  }
}
