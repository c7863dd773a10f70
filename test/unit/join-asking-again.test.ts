/**
 * When `mesh-host join` asks again: only after a refusal that read nothing of the question (the token untouched),
 * after a pause that grows and is drawn at random, so machines turned away together come back apart.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { BusError, NobodyAnswers } from "../../src/bus/index.js";
import { MeshError, TokenRefused } from "../../src/errors.js";
import { askAgainAfterMs, askUntilRead, pauseBeforeAsking } from "../../src/host/join.js";
import {
  busyWithAll,
  busyWithNode,
  encodeMessage,
  handingOver,
  refusedUnread,
} from "../../src/link/index.js";

/** An enrol reply refusing with `reason`, as the control plane encodes it. */
const refusal = (reason: string) => encodeMessage({ kind: "enrol_reply", accepted: false, reason });

/**
 * The loop's decisions, with its broker answers scripted (each answer or error in turn; the last repeats) and its
 * clock a counter that only its pauses move. The broker path itself is the e2e test's (join-asks-again).
 */
function scripted(answers: ReadonlyArray<Uint8Array | Error>, timeoutMs: number) {
  let now = 0;
  const asked: number[] = [];
  const toldAgain: string[] = [];
  const run = askUntilRead(
    {
      ask: (_body, leftMs) => {
        const answer = answers[Math.min(asked.length, answers.length - 1)];
        asked.push(leftMs);
        if (answer === undefined) throw new Error("no answer scripted");
        return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer);
      },
    },
    () => new Uint8Array(),
    { timeoutMs, askingAgain: (why) => toldAgain.push(why) },
    { now: () => now, sleep: (ms) => Promise.resolve(void (now += ms)) },
  );
  return { run, asked, toldAgain, now: () => now };
}

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

  test("join — turned away unread, asked again until an answer that is not: that answer ends the asking", async () => {
    const nobody = new NobodyAnswers("no control plane is answering at nats://x:4222");
    const ask = scripted(
      [nobody, refusal(busyWithAll), refusal(handingOver), refusal(TokenRefused.text)],
      15_000,
    );
    const reply = await ask.run;
    assert.equal(reply.accepted, false);
    assert.equal(reply.accepted ? "" : reply.reason, TokenRefused.text);
    assert.equal(ask.asked.length, 4);
    assert.deepEqual(ask.toldAgain, [nobody.message, busyWithAll, handingOver]);
  });

  test("join — a question not answered in time is never asked again (it may have been read)", async () => {
    const timeout = new BusError(
      "timeout",
      "the control plane at nats://x:4222 did not answer within 15000 ms",
    );
    const ask = scripted([timeout], 15_000);
    await assert.rejects(ask.run, (error) => error === timeout);
    assert.equal(ask.asked.length, 1);
    assert.equal(ask.now(), 0, "no pause");
  });

  test("join — nobody answering to the end: told as nobody answering, how often asked, every question with 3 s left", async () => {
    const ask = scripted([new NobodyAnswers("no control plane is answering at nats://x:4222")], 15_000);
    await assert.rejects(ask.run, (error) => {
      assert.ok(error instanceof NobodyAnswers, String(error));
      assert.match(
        error.message,
        /^no control plane is answering at nats:\/\/x:4222 \(asked \d+ times in \d+\.\d s\)$/,
      );
      return true;
    });
    assert.ok(ask.asked.length >= 4, `asked ${ask.asked.length} times`);
    for (const leftMs of ask.asked)
      assert.ok(leftMs >= askAgainAfterMs.leastLeft, `asked with ${leftMs} ms left`);
    assert.equal(ask.toldAgain.length, ask.asked.length - 1);
  });

  test("join — busy to the end: the refusal's code and reason; a short timeout keeps half of itself for the answer", async () => {
    const ask = scripted([refusal(busyWithNode)], 2_000);
    await assert.rejects(ask.run, (error) => {
      assert.ok(error instanceof MeshError && error.code === "enrol_refused", String(error));
      assert.ok(error.message.startsWith(`${busyWithNode} (asked `), error.message);
      return true;
    });
    assert.ok(ask.asked.length >= 2, `asked ${ask.asked.length} times`);
    for (const leftMs of ask.asked) assert.ok(leftMs >= 1_000, `asked with ${leftMs} ms left`);
  });
});
