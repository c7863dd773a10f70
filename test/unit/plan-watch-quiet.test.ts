/**
 * The plan watch's quiet spell: after a look that rolled out, a change of the fleet alone waits three times as long
 * as that look took, so such looks take at most a quarter of the control plane's thread while a fleet joins.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { quietAfter } from "../../src/control/plan-watch.js";

test("plan watch — a look that took 40 ms is followed by 120 ms in which only a new revision is rolled out", () => {
  assert.equal(quietAfter(10_000, 40), 10_120);
  // Busy share: the look over the look and its quiet spell.
  assert.equal(40 / (quietAfter(10_000, 40) - (10_000 - 40)), 0.25);
});

test("plan watch — a look that took no time (or a clock that went back) leaves no quiet spell", () => {
  assert.equal(quietAfter(5_000, 0), 5_000);
  assert.equal(quietAfter(5_000, -3), 5_000);
});
