/**
 * The plan watch's timing rules. Its quiet spell: after a look that rolled out, a change of the fleet alone waits
 * three times as long as that look took, so such looks take at most a quarter of the control plane's thread while a
 * fleet joins. Its hold on ingest: a batch of what nodes sent waits for the roll-out under way, or for a bound.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { quietAfter, rolloutRetryMs, settledWithin } from "../../src/control/plan-watch.js";

test("plan watch — a look that took 40 ms is followed by 120 ms in which only a new revision is rolled out", () => {
  assert.equal(quietAfter(10_000, 40), 10_120);
  // Busy share: the look over the look and its quiet spell.
  assert.equal(40 / (quietAfter(10_000, 40) - (10_000 - 40)), 0.25);
});

test("plan watch — a look that took no time (or a clock that went back) leaves no quiet spell", () => {
  assert.equal(quietAfter(5_000, 0), 5_000);
  assert.equal(quietAfter(5_000, -3), 5_000);
});

test("plan watch — ingest's wait ends when the roll-out ends, before the bound", async () => {
  let finish = () => {};
  const rollout = new Promise<void>((resolve) => (finish = resolve));
  let waited = false;
  // A bound no test machine reaches: the wait can only end by the roll-out's end.
  const wait = settledWithin(rollout, 600_000).then(() => (waited = true));
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(waited, false, "the wait ended while the roll-out was still under way");
  finish();
  await wait;
  assert.equal(waited, true);
});

test("plan watch — a failed roll-out ends ingest's wait and its failure stays with its owner", async () => {
  const rollout = Promise.reject(new Error("the broker went away"));
  await settledWithin(rollout, 600_000);
  await assert.rejects(rollout, /the broker went away/);
});

test("plan watch — a roll-out that never ends holds ingest for the bound only", async () => {
  const never = new Promise<void>(() => {});
  let waited = false;
  const wait = settledWithin(never, 20).then(() => (waited = true));
  await wait;
  assert.equal(waited, true);
});

test("plan watch — a roll-out failing again and again waits from a tenth of a second, doubled each time, to 5 s", () => {
  const pauses = Array.from({ length: 9 }, (_, i) => rolloutRetryMs(i + 1));
  assert.deepEqual(pauses, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
  // A minute of a fault that lasts: a dozen or so tries, not one every 25 ms look (2,400).
  let tries = 0;
  for (let waited = 0; waited < 60_000; tries++) waited += rolloutRetryMs(tries + 1);
  assert.ok(tries <= 20, `${tries} tries in a minute`);
});
