/**
 * The choice of which delivery to acknowledge when one acknowledgement covers every message before it: never past a
 * message handed back and not done since, and everything once all is done.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { DeliveryOutcome } from "../../src/bus/bus.js";
import { AckFloor, DeliveryCount } from "../../src/bus/nats/ack-floor.js";

const at = (...seqs: number[]) => seqs.map((seq) => ({ seq }));
const all = (outcome: DeliveryOutcome, count: number): DeliveryOutcome[] =>
  Array.from({ length: count }, () => outcome);

test("ack floor — a batch all done: its last message is acknowledged, and nothing is handed back", () => {
  const floor = new AckFloor<{ seq: number }>();
  const { acknowledge, handBack } = floor.settle(at(1, 2, 3), all("done", 3), 0);
  assert.equal(acknowledge?.seq, 3);
  assert.deepEqual(handBack, []);
  assert.equal(floor.owing, 0);
});

test("ack floor — after a batch handed back, later batches are held until it is done again", () => {
  const floor = new AckFloor<{ seq: number }>();
  const first = floor.settle(at(1, 2, 3), all("retry", 3), 0);
  assert.equal(first.acknowledge, undefined);
  assert.deepEqual(
    first.handBack.map(({ seq }) => seq),
    [1, 2, 3],
  );
  assert.equal(floor.settle(at(4, 5), all("done", 2), 10).acknowledge, undefined, "5 would cover 1–3");
  assert.equal(floor.settle(at(6), all("done", 1), 20).acknowledge, undefined);
  // Offered again, among new ones.
  assert.equal(floor.settle(at(2, 3, 7), all("done", 3), 30).acknowledge, undefined, "1 is still owed");
  assert.equal(floor.settle(at(1, 8), all("done", 2), 40).acknowledge?.seq, 8);
  assert.equal(floor.owing, 0);
});

test("ack floor — done messages below the first owed one are acknowledged at once", () => {
  const floor = new AckFloor<{ seq: number }>();
  floor.settle(at(5), ["retry"], 0);
  assert.equal(floor.settle(at(2, 3), all("done", 2), 1).acknowledge?.seq, 3);
  assert.equal(floor.settle(at(4, 6), all("done", 2), 2).acknowledge, undefined);
  assert.equal(floor.settle(at(5), ["done"], 3).acknowledge?.seq, 6);
});

test("ack floor — a message the broker no longer holds is owed no more", () => {
  const floor = new AckFloor<{ seq: number }>();
  floor.settle(at(1, 2), ["retry", "retry"], 0);
  assert.equal(floor.settle(at(3), ["done"], 100).acknowledge, undefined);
  assert.deepEqual(floor.owedLongerThan(50, 100), [1, 2]);
  assert.deepEqual(floor.owedLongerThan(150, 100), []);
  assert.equal(floor.gone([1]), undefined, "2 is still owed");
  assert.equal(floor.gone([2])?.seq, 3);
  assert.equal(floor.owing, 0);
  assert.equal(floor.gone([]), undefined, "nothing held");
});

test("ack floor — a message done before and handed back when offered again is settled by acknowledging it", () => {
  const floor = new AckFloor<{ seq: number }>();
  floor.settle(at(1), ["retry"], 0);
  floor.settle(at(2), ["done"], 1);
  // 2 offered again (its ack wait passed while held) and handed back this time.
  assert.equal(floor.settle(at(2), ["retry"], 2).acknowledge, undefined);
  assert.equal(floor.settle(at(1), ["done"], 3).acknowledge?.seq, 2);
  assert.equal(floor.owing, 0);
});

test("ack floor — a message handed back at or below what was acknowledged is owed nothing (the broker took it as done)", () => {
  const floor = new AckFloor<{ seq: number }>();
  assert.equal(floor.settle(at(1, 2, 3), all("done", 3), 0).acknowledge?.seq, 3);
  // 2 was offered again before the acknowledgement reached the broker, and this time handed back.
  const again = floor.settle(at(2), ["retry"], 1);
  assert.deepEqual(again.handBack, []);
  assert.equal(floor.owing, 0);
  assert.equal(floor.settle(at(4), ["done"], 2).acknowledge?.seq, 4, "nothing holds the next one back");
});

test("delivery count — a number skipped is a delivery that never arrived", () => {
  const count = new DeliveryCount();
  assert.equal(count.arrived(1), true);
  assert.equal(count.arrived(2), true);
  assert.equal(count.arrived(4), false, "3 never arrived");
  assert.equal(count.arrived(5), true);
  assert.equal(new DeliveryCount().arrived(2), false, "the first one never arrived");
});

/** A small deterministic generator (mulberry32), so a failing case can be run again. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test("ack floor — property: over random runs, no acknowledgement covers a message owed, and in the end all are", () => {
  let handedBackInAll = 0;
  let goneInAll = 0;
  for (let run = 0; run < 500; run++) {
    const next = random(run + 1);
    const total = 20 + Math.floor(next() * 200);
    const floor = new AckFloor<{ seq: number }>();
    // The broker, as far as this goes: what it will offer, in order; what is owed; what it dropped.
    let fresh = 1;
    const again: number[] = [];
    const owed = new Set<number>();
    let acknowledged = 0;
    let doneFurthest = 0;
    const take = (ack: { seq: number } | undefined) => {
      if (ack === undefined) return;
      for (const seq of owed)
        assert.ok(seq >= ack.seq, `run ${run}: acknowledging ${ack.seq} covers ${seq}, owed`);
      acknowledged = Math.max(acknowledged, ack.seq);
    };
    for (let step = 0; step < 10_000 && (fresh <= total || again.length > 0 || owed.size > 0); step++) {
      const failing = step < 200 && next() < 0.3;
      const batch: { seq: number }[] = [];
      const size = 1 + Math.floor(next() * 8);
      while (batch.length < size && (fresh <= total || again.length > 0)) {
        // Handed-back messages come again after later ones, in their own time.
        if (again.length > 0 && (fresh > total || next() < 0.4)) batch.push({ seq: again.shift() ?? 0 });
        else batch.push({ seq: fresh++ });
      }
      const outcomes = batch.map((): DeliveryOutcome => (failing ? "retry" : "done"));
      const { acknowledge, handBack } = floor.settle(batch, outcomes, step);
      batch.forEach(({ seq }, i) => {
        if (outcomes[i] === "retry") return owed.add(seq);
        owed.delete(seq);
        doneFurthest = Math.max(doneFurthest, seq);
      });
      take(acknowledge);
      for (const { seq } of handBack) {
        handedBackInAll++;
        // Now and then a node's newer message pushes one out: it never comes again.
        if (next() < 0.1) goneInAll++;
        else again.push(seq);
      }
      if (step % 5 === 0) {
        const gone = floor.owedLongerThan(3, step).filter((seq) => !again.includes(seq));
        for (const seq of gone) owed.delete(seq);
        take(floor.gone(gone));
      }
    }
    assert.equal(owed.size, 0, `run ${run}: still owed ${[...owed].join(", ")}`);
    // Everything done is acknowledged (a message the broker dropped at the very end needs no acknowledgement).
    assert.equal(
      acknowledged,
      doneFurthest,
      `run ${run}: acknowledged up to ${acknowledged} of ${doneFurthest}`,
    );
    assert.ok(doneFurthest >= total - 10, `run ${run}: done up to ${doneFurthest} of ${total}`);
  }
  // The property says something only if messages were handed back and dropped along the way.
  assert.ok(handedBackInAll > 1000, `handed back ${handedBackInAll}`);
  assert.ok(goneInAll > 100, `gone ${goneInAll}`);
});
