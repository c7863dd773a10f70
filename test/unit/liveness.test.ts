import assert from "node:assert/strict";
import { test } from "node:test";
import { describeLiveness, livenessOf, shortDuration } from "../../src/control/liveness.js";

const now = new Date("2026-05-01T10:00:00.000Z");
const ago = (seconds: number) => new Date(now.getTime() - seconds * 1000).toISOString();

test("liveness — never heard from is never spoken, not out of touch", () => {
  const reading = livenessOf(null, now, 45_000);
  assert.deepEqual(reading, { liveness: "never_spoken", outOfTouchForS: null });
  assert.equal(describeLiveness(reading), "never spoken");
});

test("liveness — within the threshold is here, the threshold itself included", () => {
  assert.deepEqual(livenessOf(ago(0), now, 45_000), { liveness: "here", outOfTouchForS: null });
  assert.deepEqual(livenessOf(ago(45), now, 45_000), { liveness: "here", outOfTouchForS: null });
  assert.equal(describeLiveness(livenessOf(ago(10), now, 45_000)), "here");
});

test("liveness — past the threshold is out of touch with how long since last heard", () => {
  const reading = livenessOf(ago(46), now, 45_000);
  assert.deepEqual(reading, { liveness: "out_of_touch", outOfTouchForS: 46 });
  assert.equal(describeLiveness(reading), "out of touch 46s");
  assert.equal(describeLiveness(livenessOf(ago(4 * 60 + 5), now, 45_000)), "out of touch 4m");
  assert.equal(describeLiveness(livenessOf(ago(3 * 3600), now, 45_000)), "out of touch 3h");
  assert.equal(describeLiveness(livenessOf(ago(2 * 86_400 + 7), now, 45_000)), "out of touch 2d");
});

test("liveness — short durations use the largest whole unit", () => {
  assert.deepEqual([0, 59, 60, 3599, 3600, 86_399, 86_400].map(shortDuration), [
    "0s",
    "59s",
    "1m",
    "59m",
    "1h",
    "23h",
    "1d",
  ]);
});
