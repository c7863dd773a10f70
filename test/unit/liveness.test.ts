import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import {
  describeHearing,
  describeLiveness,
  livenessOf,
  longestListened,
  shortDuration,
} from "../../src/control/liveness.js";

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

/** A hearing record: heard up to `heardAgo` seconds ago, since `sinceAgo`, with gaps given as [fromAgo, toAgo]. */
const hearing = (heardAgo: number, sinceAgo: number, gaps: Array<[number, number]> = []) => ({
  heardAt: ago(heardAgo),
  since: ago(sinceAgo),
  gaps: gaps.map(([from, to]) => ({ from: ago(from), to: ago(to) })),
});

test("liveness — time the control plane could not hear is not the node's silence", () => {
  // Heard last 60 s ago, silent node seen 70 s ago: only 10 s of listening since it spoke.
  assert.equal(livenessOf(ago(70), now, 45_000, hearing(60, 600)).liveness, "here");
  // Seen 20 s before a 5-minute gap, heard again for 30 s since: 30 s of listening at most, not 5 minutes.
  assert.equal(livenessOf(ago(350), now, 45_000, hearing(0, 30, [[330, 30]])).liveness, "here");
  // …and once the listening since the gap passes the threshold, it is out of touch, with its whole silence shown.
  const out = livenessOf(ago(350), now, 45_000, hearing(0, 50, [[330, 50]]));
  assert.deepEqual(out, { liveness: "out_of_touch", outOfTouchForS: 350 });
});

test("liveness — a node already out of touch before the control plane went deaf stays out of touch", () => {
  // Seen 1000 s ago; heard without a break from before that until 300 s ago (700 s of listening), then a gap.
  assert.equal(livenessOf(ago(1000), now, 45_000, hearing(0, 10, [[300, 10]])).liveness, "out_of_touch");
});

test("liveness — no stretch of hearing is longer than the threshold: the node is here, however old its last word", () => {
  // Three short stretches of 20 s between gaps since the node spoke.
  const choppy = hearing(0, 20, [
    [120, 100],
    [80, 60],
    [40, 20],
  ]);
  assert.equal(livenessOf(ago(125), now, 45_000, choppy).liveness, "here");
  assert.equal(livenessOf(ago(200), now, 45_000, choppy).liveness, "out_of_touch");
});

test("liveness — with hearing that never broke, the hearing record changes nothing", () => {
  for (const seconds of [0, 10, 45, 46, 300, 90_000]) {
    assert.deepEqual(
      livenessOf(ago(seconds), now, 45_000, hearing(0, 100_000)),
      livenessOf(ago(seconds), now, 45_000),
      `${seconds} s`,
    );
  }
});

test("liveness — deafness never makes a node out of touch that listening alone would not", () => {
  // Property: for any gaps, the listened time since the node spoke is at most its silence.
  fc.assert(
    fc.property(
      fc.integer({ min: 0, max: 3600 }),
      fc.array(fc.tuple(fc.integer({ min: 0, max: 3600 }), fc.integer({ min: 0, max: 600 })), {
        maxLength: 8,
      }),
      fc.integer({ min: 0, max: 60 }),
      (seenAgo, rawGaps, heardAgo) => {
        // Gaps that do not overlap, newest last, all before the last moment heard.
        const gaps: Array<[number, number]> = [];
        let cursor = 4000;
        for (const [from, length] of rawGaps.sort((a, b) => b[0] - a[0])) {
          const start = Math.min(cursor, from + heardAgo + length);
          const end = Math.max(heardAgo, start - length);
          if (end >= start) continue;
          gaps.push([start, end]);
          cursor = end;
        }
        const record = hearing(heardAgo, gaps.at(-1)?.[1] ?? 5000, gaps);
        const listened = longestListened(Date.parse(ago(seenAgo)), now.getTime(), record);
        assert.ok(listened <= seenAgo * 1000, `listened ${listened} ms of ${seenAgo} s`);
        const judged = livenessOf(ago(seenAgo), now, 45_000, record).liveness;
        if (judged === "out_of_touch")
          assert.equal(livenessOf(ago(seenAgo), now, 45_000).liveness, "out_of_touch");
      },
    ),
  );
});

test("liveness — a person is told when the control plane last heard", () => {
  assert.match(describeHearing(undefined, now), /has not listened yet/);
  assert.match(describeHearing(hearing(1, 100), now), /hears the broker \(since /);
  assert.match(describeHearing(hearing(300, 600), now), /last heard the broker 5m ago/);
});
