/** Messages a token's holder or a node can send that the control plane must still answer as the contract says. */
import assert from "node:assert/strict";
import { ContractError, parseEnrol, reasonMaxBytes } from "../../src/link/index.js";

/**
 * An enrolment wrong in so many places (forty label keys no label may have) that the contract's own account of what
 * is wrong is longer than a reply's reason may be.
 */
export function enrolWrongEverywhere(node: string): Uint8Array {
  const labels = Object.fromEntries(Array.from({ length: 40 }, (_, index) => [`-not-a-key-${index}`, "x"]));
  const zeros = Buffer.alloc(32);
  const enrol = {
    kind: "enrol",
    node,
    token_id: "t-1",
    secret: zeros.toString("base64url"),
    keys: { signing: zeros.toString("base64"), overlay: zeros.toString("base64") },
    profile: { cpu: 1, memory_mb: 1, os: "linux", arch: "x64", labels },
    agent_version: "1",
    sent_at: new Date().toISOString(),
  };
  const body = new TextEncoder().encode(JSON.stringify(enrol));
  assert.throws(
    () => parseEnrol(body),
    (error: unknown) =>
      error instanceof ContractError &&
      Buffer.byteLength(`enrolment refused: ${error.reason}`) > reasonMaxBytes,
    "the premise: what is wrong takes more than a reply holds",
  );
  return body;
}
