/**
 * Receipts are written without their schema when they carry no reason: the bytes must be exactly those
 * `encodeMessage` gives, and whatever `encodeMessage` refuses must be refused the same way.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";

import type { Receipt } from "../../src/link/index.js";
import { ContractError, encodeMessage, encodeReceipt } from "../../src/link/index.js";

/** What encoding gave: the bytes, or the refusal's text. */
function outcome(encode: () => Uint8Array): { bytes: string } | { refused: string } {
  try {
    return { bytes: new TextDecoder().decode(encode()) };
  } catch (error) {
    assert.ok(error instanceof ContractError, `refused with a ContractError, not ${String(error)}`);
    return { refused: error.message };
  }
}

const receipts = fc.record(
  {
    kind: fc.constant("receipt" as const),
    node: fc.oneof(
      fc.stringMatching(/^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/),
      fc.string({ maxLength: 70 }),
      fc.constantFrom("", "-web", "web-", "Web-1", "web 1", "a".repeat(64), 'we"b', "wéb"),
    ),
    report_sequence: fc.oneof(
      fc.nat(),
      fc.integer(),
      fc.double(),
      fc.constantFrom(0, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER + 1, -0, Number.NaN, Infinity),
    ),
    verdict: fc.constantFrom("kept", "refused", "lost"),
    reason: fc.string({ maxLength: 30 }),
  },
  { requiredKeys: ["kind", "node", "report_sequence", "verdict"] },
) as fc.Arbitrary<Receipt>;

test("receipts — written as encodeMessage writes them, and refused as it refuses them, whatever the fields", () => {
  fc.assert(
    fc.property(receipts, (receipt) => {
      assert.deepEqual(
        outcome(() => encodeReceipt(receipt)),
        outcome(() => encodeMessage(receipt)),
      );
    }),
    { numRuns: 5000 },
  );
});

test("receipts — the common one, kept without a reason, is the schema's bytes", () => {
  const receipt: Receipt = { kind: "receipt", node: "web-1", report_sequence: 42, verdict: "kept" };
  assert.equal(
    new TextDecoder().decode(encodeReceipt(receipt)),
    '{"kind":"receipt","node":"web-1","report_sequence":42,"verdict":"kept"}',
  );
  assert.deepEqual(encodeReceipt(receipt), encodeMessage(receipt));
});
