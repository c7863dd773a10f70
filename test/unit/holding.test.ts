import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import type { AccountPlace, SentPlace } from "../../src/control/holding.js";
import { holdingOf, holdings } from "../../src/control/holding.js";

const sent: SentPlace = { sequence: 7, digest: "sha256:seven" };
const account = (sequence: number | null, outcome: string, digest = "sha256:seven"): AccountPlace => ({
  sequence,
  outcome,
  digest,
});

test("holding — nothing ever sent is none, whatever the node said", () => {
  assert.equal(holdingOf(undefined, undefined), "none");
  assert.equal(holdingOf(undefined, account(0, "applied", "sha256:empty")), "none");
  assert.equal(holdingOf(undefined, account(3, "failed")), "none");
});

test("holding — sent and never reported is behind", () => {
  assert.equal(holdingOf(sent, undefined), "behind");
});

test("holding — the latest sent sequence applied is current", () => {
  assert.equal(holdingOf(sent, account(7, "applied")), "current");
});

test("holding — an account of an older sequence is behind, applied or failed", () => {
  assert.equal(holdingOf(sent, account(6, "applied", "sha256:six")), "behind");
  assert.equal(holdingOf(sent, account(6, "failed", "sha256:six")), "behind");
  assert.equal(holdingOf(sent, account(0, "applied", "sha256:empty")), "behind");
});

test("holding — the latest sent sequence failed is failed", () => {
  assert.equal(holdingOf(sent, account(7, "failed")), "failed");
});

test("holding — a refusal is failed, at the latest sequence or at the older one the node still holds", () => {
  assert.equal(holdingOf(sent, account(7, "refused")), "failed");
  assert.equal(holdingOf(sent, account(6, "refused", "sha256:six")), "failed");
  assert.equal(holdingOf(sent, account(0, "refused", "sha256:empty")), "failed");
});

test("holding — an account above the latest sent (should not happen) is current if applied, failed if not", () => {
  assert.equal(holdingOf(sent, account(8, "applied", "sha256:eight")), "current");
  assert.equal(holdingOf(sent, account(8, "failed", "sha256:eight")), "failed");
});

test("holding — at the latest sequence with another digest it has not reported what was sent: behind", () => {
  assert.equal(holdingOf(sent, account(7, "applied", "sha256:other")), "behind");
});

test("holding — a report naming no sequence is placed by its digest", () => {
  assert.equal(holdingOf(sent, account(null, "applied")), "current");
  assert.equal(holdingOf(sent, account(null, "failed")), "failed");
  assert.equal(holdingOf(sent, account(null, "applied", "sha256:six")), "behind");
});

test("holding — every answer is one of the closed set, and none exactly when nothing was sent", () => {
  const place = fc.record({ sequence: fc.nat(20), digest: fc.constantFrom("sha256:a", "sha256:b") });
  const said = fc.record({
    sequence: fc.option(fc.nat(20), { nil: null }),
    outcome: fc.constantFrom("applied", "failed", "refused"),
    digest: fc.constantFrom("sha256:a", "sha256:b"),
  });
  fc.assert(
    fc.property(fc.option(place, { nil: undefined }), fc.option(said, { nil: undefined }), (s, a) => {
      const holding = holdingOf(s, a);
      assert.ok(holdings.includes(holding));
      assert.equal(holding === "none", s === undefined);
      if (holding === "current") assert.equal(a?.outcome, "applied");
    }),
  );
});
