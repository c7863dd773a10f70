/** Messages a token's holder or a node can send that the control plane must still answer as the contract says. */
import assert from "node:assert/strict";
import { openEnrolmentSide } from "../../src/bus/index.js";
import {
  ContractError,
  decodeToken,
  parseEnrol,
  parseEnrolReply,
  reasonMaxBytes,
} from "../../src/link/index.js";

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

/**
 * Asks, as the holder of `tokenText` (a token issued for `node`), the enrolment above, and returns the refusal's
 * reason, checked to be the contract's account of what is wrong cut to fit the reply.
 */
export async function askWrongEverywhere(tokenText: string, node: string): Promise<string> {
  const token = decodeToken(tokenText);
  assert.ok(token.broker !== null);
  const asker = await openEnrolmentSide(token.broker.url, node, token.broker.credential, token.secret);
  let answer: Uint8Array;
  try {
    answer = await asker.ask(enrolWrongEverywhere(node), 60_000);
  } finally {
    await asker.close();
  }
  const reply = parseEnrolReply(answer);
  if (reply.accepted) assert.fail("a malformed enrolment was accepted");
  assert.match(reply.reason, /^enrolment refused: enrol\.profile\.labels/);
  assert.ok(Buffer.byteLength(reply.reason) <= reasonMaxBytes, `${Buffer.byteLength(reply.reason)} bytes`);
  return reply.reason;
}
