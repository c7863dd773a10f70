/**
 * When `mesh-host join` asks again: only after a refusal that read nothing of the question (the token untouched),
 * after a pause that grows and is drawn at random, so machines turned away together come back apart.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { TokenRefused } from "../../src/errors.js";
import { askAgainAfterMs, pauseBeforeAsking } from "../../src/host/join.js";
import { busyWithAll, busyWithNode, handingOver, refusedUnread } from "../../src/link/index.js";

describe("mesh-host join asking again", () => {
  test("join — the refusals that read nothing are asked again; any other is final", () => {
    for (const reason of [handingOver, busyWithNode, busyWithAll])
      assert.equal(refusedUnread(reason), true, reason);
    for (const reason of [
      TokenRefused.text,
      "enrolment refused: profile.labels: too many labels",
      // Told in words alike, but not the contract's text: a control plane's other refusals are never asked again.
      "the control plane is handing over; try again later",
      "try again",
      "",
    ]) {
      assert.equal(refusedUnread(reason), false, reason);
    }
  });

  test("join — the pause doubles from a quarter second to 4 s, each drawn between half and the whole of it", () => {
    const lowest = Array.from({ length: 8 }, (_, i) => pauseBeforeAsking(i + 1, () => 0));
    const highest = Array.from({ length: 8 }, (_, i) => pauseBeforeAsking(i + 1, () => 1));
    assert.deepEqual(highest, [250, 500, 1000, 2000, 4000, 4000, 4000, 4000]);
    assert.deepEqual(
      lowest,
      highest.map((whole) => whole / 2),
    );
    assert.equal(highest[0], askAgainAfterMs.first);
    assert.equal(highest.at(-1), askAgainAfterMs.longest);
    // Drawn anew each time: a hundred machines turned away at the same moment spread over the second half.
    const spread = new Set(Array.from({ length: 100 }, () => pauseBeforeAsking(3)));
    assert.ok(spread.size > 50, `${spread.size} distinct pauses of 100`);
    for (const pause of spread) assert.ok(pause >= 500 && pause <= 1000, `${pause} ms`);
  });
});
