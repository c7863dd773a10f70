/**
 * Answering enrolments as the acting control plane: only while the lease's gate is open, side by side, but one
 * node's one after another — a node with two valid tokens presented at once must end with one broker identity, the
 * one before revoked each time. What waits is bounded: a few questions per node, and so many bytes of questions in
 * all; beyond that a question is answered at once that the control plane is busy (a token's holder asking as fast as
 * it can would otherwise queue its questions, each up to the largest message, faster than the store answers them).
 */
import type { EnrolAnswer, EnrolRequest } from "../bus/index.js";
import { busyWithAll, busyWithNode, encodeMessage, handingOver } from "../link/index.js";
import { errorText } from "../log.js";
import type { EnrolmentContext } from "./enrolment.js";
import { answerEnrolment } from "./enrolment.js";
import type { TakeBack } from "./refusals.js";
import { takeBack } from "./refusals.js";

export interface EnrolmentLimits {
  /** How many questions of one node wait at most, the one being answered included. */
  perNode: number;
  /** How many bytes of questions wait at most, all nodes together. */
  bytes: number;
}

/**
 * A joiner asks and waits for its answer (turned away, it asks again after a pause), so an honest node has one
 * question under way (two tokens presented at once, two). 10,000 machines joining at once ask with about 20 MB; a
 * question is 1 MiB at most.
 */
export const enrolmentLimits: EnrolmentLimits = { perNode: 4, bytes: 64 * 1024 * 1024 };

export class Enrolments {
  /** The last answer under way for each node, which the next one for that node waits for. */
  private readonly turns = new Map<string, Promise<EnrolAnswer>>();
  /** How many questions of each node wait or are being answered. */
  private readonly waiting = new Map<string, number>();
  /** The bytes of all those questions. */
  private bytesWaiting = 0;
  /** The busy refusals' events being kept, one after another. */
  private keeping: Promise<void> = Promise.resolve();

  constructor(
    private readonly context: EnrolmentContext,
    /** Whether this control plane may act now (the lease's gate). */
    private readonly gate: () => boolean,
    private readonly answerOne: typeof answerEnrolment = answerEnrolment,
    private readonly limits: EnrolmentLimits = enrolmentLimits,
  ) {}

  /** Answers one enrolment, after any other enrolment of the same node still under way. */
  async answer(request: EnrolRequest): Promise<EnrolAnswer> {
    if (!this.gate()) return refusal(handingOver);
    const { node } = request;
    const waiting = this.waiting.get(node) ?? 0;
    const bytes = request.body.byteLength;
    if (waiting >= this.limits.perNode) return this.busy(node, busyWithNode);
    if (this.bytesWaiting + bytes > this.limits.bytes) return this.busy(node, busyWithAll);
    this.waiting.set(node, waiting + 1);
    this.bytesWaiting += bytes;
    const answer = () => this.answerOne(this.context, request);
    const before = this.turns.get(node) ?? Promise.resolve();
    const turn = before.then(answer, answer);
    this.turns.set(node, turn);
    try {
      return await turn;
    } finally {
      if (this.turns.get(node) === turn) this.turns.delete(node);
      const left = (this.waiting.get(node) ?? 1) - 1;
      if (left > 0) this.waiting.set(node, left);
      else this.waiting.delete(node);
      this.bytesWaiting -= bytes;
    }
  }

  /**
   * Refuses a question for now without reading it: told as any refusal is (at most once a minute per node, with how
   * many came), not counted in the store one by one, which would be the very work the refusal spares. The answer
   * does not wait for the event to be kept either (the store may be what is slow): should keeping it fail, that is
   * logged, and the answer goes all the same.
   */
  private busy(node: string, reason: string): EnrolAnswer {
    const { refusals, store, now, log } = this.context;
    const undo: TakeBack = [];
    const refused = { node, kind: "enrol", reason };
    const event = refusals.note(refused, now(), undo);
    if (event !== undefined) {
      this.keeping = this.keeping.then(() =>
        store.events.record(event).catch((error: unknown) => {
          // It came all the same (the joiner was answered): told with the node's next refusal, or at the next look.
          takeBack(undo);
          refusals.untold(refused);
          log.error("enrol.refusal_not_kept", { node, error: errorText(error) });
        }),
      );
    }
    return refusal(reason);
  }

  /** Settles once the busy refusals' events told so far are kept (or their failure logged). */
  async kept(): Promise<void> {
    await this.keeping;
  }

  /** How many nodes have an enrolment under way (for tests and metrics). */
  get underWay(): number {
    return this.turns.size;
  }
}

function refusal(reason: string): EnrolAnswer {
  return { reply: encodeMessage({ kind: "enrol_reply", accepted: false, reason }) };
}
