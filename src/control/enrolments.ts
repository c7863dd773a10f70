/**
 * Answering enrolments as the acting control plane: only while the lease's gate is open, side by side, but one
 * node's one after another — a node with two valid tokens presented at once must end with one broker identity, the
 * one before revoked each time.
 */
import type { EnrolAnswer, EnrolRequest } from "../bus/index.js";
import { encodeMessage } from "../link/index.js";
import type { EnrolmentContext } from "./enrolment.js";
import { answerEnrolment } from "./enrolment.js";

/** What the control plane answers while its gate is closed: the joiner asks again, of whoever acts then. */
export const handingOver = "the control plane is handing over; try again";

export class Enrolments {
  /** The last answer under way for each node, which the next one for that node waits for. */
  private readonly turns = new Map<string, Promise<EnrolAnswer>>();

  constructor(
    private readonly context: EnrolmentContext,
    /** Whether this control plane may act now (the lease's gate). */
    private readonly gate: () => boolean,
    private readonly answerOne: typeof answerEnrolment = answerEnrolment,
  ) {}

  /** Answers one enrolment, after any other enrolment of the same node still under way. */
  async answer(request: EnrolRequest): Promise<EnrolAnswer> {
    if (!this.gate()) {
      return { reply: encodeMessage({ kind: "enrol_reply", accepted: false, reason: handingOver }) };
    }
    const answer = () => this.answerOne(this.context, request);
    const before = this.turns.get(request.node) ?? Promise.resolve();
    const turn = before.then(answer, answer);
    this.turns.set(request.node, turn);
    try {
      return await turn;
    } finally {
      if (this.turns.get(request.node) === turn) this.turns.delete(request.node);
    }
  }

  /** How many nodes have an enrolment under way (for tests and metrics). */
  get underWay(): number {
    return this.turns.size;
  }
}
