import { MeshError } from "../errors.js";

/**
 * A message that breaks the wire contract: it does not decode, does not match its kind's schema, or names something
 * (a node, a subject) that is not allowed. The parse functions throw nothing else, so a consumer can refuse,
 * count and acknowledge on this one class without ever crashing on input it did not expect.
 */
export class ContractError extends MeshError {
  /** What is wrong, for a person: the field's path and the problem, e.g. "report.items[0].state: expected one of applied|failed". */
  readonly reason: string;

  constructor(reason: string, options?: { cause?: unknown }) {
    super("contract", `message refused: ${reason}`, options);
    this.name = "ContractError";
    this.reason = reason;
  }
}
