/** Broker failures in the mesh's words, with the client's error as the cause. */
import { MeshError } from "../errors.js";
import type { MeshErrorCode } from "../errors.js";

export class BusError extends MeshError {
  constructor(code: MeshErrorCode, message: string, options?: { cause?: unknown }) {
    super(code, message, options);
    this.name = "BusError";
  }
}

/** The broker refused who we are: an unknown, expired or revoked identity. */
export class BrokerRefusedIdentity extends BusError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("broker_refused_identity", message, options);
    this.name = "BrokerRefusedIdentity";
  }
}

/** Nobody answers on the other side: the control plane is not running. */
export class NobodyAnswers extends BusError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("nobody_answers", message, options);
    this.name = "NobodyAnswers";
  }
}

/** Socket errors (Node's `code`) that mean the broker cannot be reached, as opposed to refusing us. */
export const unreachableSocketCodes: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ETIMEDOUT",
]);
