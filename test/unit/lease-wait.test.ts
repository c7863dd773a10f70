/**
 * How long a standby waits before it tries the lease again: until the holding it sees ends, when that comes within a
 * renewal period, else one renewal period (the holder renews within it, and a store without a watch is looked at
 * that often).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { lookAfterExpiryMs, standbyWait } from "../../src/lease/lease.js";

const renewEveryMs = 5000;
const now = 1_000_000;

test("standby wait — a holding that ends within the renewal period is waited for exactly, and a moment more", () => {
  assert.deepEqual(standbyWait(now + 1200, now, renewEveryMs), {
    ms: 1200 + lookAfterExpiryMs,
    until: "expiry",
  });
  assert.deepEqual(standbyWait(now + 1, now, renewEveryMs), { ms: 1 + lookAfterExpiryMs, until: "expiry" });
});

test("standby wait — a holding that ends later than a renewal period away: one renewal period", () => {
  assert.deepEqual(standbyWait(now + 15_000, now, renewEveryMs), { ms: renewEveryMs, until: "period" });
  // Its end plus the moment after would fall past the period: the period comes first.
  assert.deepEqual(standbyWait(now + renewEveryMs, now, renewEveryMs), { ms: renewEveryMs, until: "period" });
});

test("standby wait — an end exactly a period away, the moment after included, is waited for as the end", () => {
  const end = now + renewEveryMs - lookAfterExpiryMs;
  assert.deepEqual(standbyWait(end, now, renewEveryMs), { ms: renewEveryMs, until: "expiry" });
});

test("standby wait — a holding already over by this clock: looked at a moment from now, never before its end", () => {
  assert.deepEqual(standbyWait(now - 3000, now, renewEveryMs), { ms: lookAfterExpiryMs, until: "expiry" });
  assert.deepEqual(standbyWait(now, now, renewEveryMs), { ms: lookAfterExpiryMs, until: "expiry" });
});

test("standby wait — a holding whose end the store cannot tell: one renewal period", () => {
  assert.deepEqual(standbyWait(undefined, now, renewEveryMs), { ms: renewEveryMs, until: "period" });
});
