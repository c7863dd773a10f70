import assert from "node:assert/strict";
import { test } from "node:test";
import type { OnceKept, TakeBack } from "../../src/control/refusals.js";
import { RefusalLedger, settleKept, takeBack } from "../../src/control/refusals.js";
import { boundText, fitsBytes, reasonMaxBytes } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";

function ledger(windowMs = 60_000) {
  const lines: string[] = [];
  const log = createLogger({ write: (line) => lines.push(line), pretty: false });
  return { refusals: new RefusalLedger(log, windowMs), lines };
}
const at = (ms: number) => new Date(Date.UTC(2026, 0, 1) + ms);

test("refusals — the first of a node and kind is told; the rest of the window only counted, then told with the count", () => {
  const { refusals, lines } = ledger();
  const first = refusals.note({ node: "web-1", kind: "report", reason: "bad" }, at(0));
  assert.equal(first?.kind, "report.refused");
  assert.deepEqual(first?.detail, { reason: "bad", refusals: 1 });
  for (let i = 1; i <= 999; i += 1) {
    assert.equal(refusals.note({ node: "web-1", kind: "report", reason: `bad ${i}` }, at(i)), undefined);
  }
  assert.equal(lines.length, 1, "one line for a thousand refusals");
  assert.deepEqual(refusals.due(at(59_999)), [], "nothing before the window ends");
  const held = refusals.due(at(60_000));
  assert.equal(held.length, 1);
  assert.deepEqual(held[0]?.detail, { reason: "bad 999", refusals: 999 });
  assert.equal(lines.length, 2);
  // Quiet for a whole window: forgotten, and the next refusal is told at once.
  assert.deepEqual(refusals.due(at(120_000)), []);
  assert.deepEqual(refusals.note({ node: "web-1", kind: "report", reason: "again" }, at(120_001))?.detail, {
    reason: "again",
    refusals: 1,
  });
});

test("refusals — nodes and kinds are told apart; a refusal naming no node is kept without one", () => {
  const { refusals } = ledger();
  assert.notEqual(refusals.note({ node: "web-1", kind: "report", reason: "r" }, at(0)), undefined);
  assert.notEqual(refusals.note({ node: "web-1", kind: "alive", reason: "a" }, at(1)), undefined);
  assert.notEqual(refusals.note({ node: "web-2", kind: "report", reason: "r" }, at(2)), undefined);
  assert.equal(refusals.note({ node: "*", kind: "report", reason: "no node" }, at(3))?.node, null);
});

test("refusals — a refusal after the window, with refusals held back, is told with all of them", () => {
  const { refusals } = ledger(1000);
  refusals.note({ node: "web-1", kind: "enrol", reason: "x" }, at(0));
  refusals.note({ node: "web-1", kind: "enrol", reason: "y" }, at(10));
  refusals.note({ node: "web-1", kind: "enrol", reason: "z" }, at(20));
  assert.deepEqual(refusals.note({ node: "web-1", kind: "enrol", reason: "w" }, at(1500))?.detail, {
    reason: "w",
    refusals: 3,
  });
});

test("refusals — a telling taken back (its event not kept) is told again: at the next refusal, with what the window counted", () => {
  const { refusals } = ledger(1000);
  const report = (reason: string) => ({ node: "web-1", kind: "report", reason });
  // Told and kept; two more counted in its window.
  assert.notEqual(refusals.note(report("a"), at(0)), undefined);
  refusals.note(report("b"), at(10));
  refusals.note(report("c"), at(20));
  // The window over: told with the two, and that telling not kept, nor the refusal that caused it.
  const failed: TakeBack = [];
  assert.deepEqual(refusals.note(report("d"), at(1500), failed)?.detail, { reason: "d", refusals: 3 });
  takeBack(failed);
  assert.equal(failed.length, 0, "the steps are spent");
  // The refusal comes again (its message handed back): told at once, with the two still untold, and counted once.
  assert.deepEqual(refusals.note(report("d"), at(1600))?.detail, { reason: "d", refusals: 3 });
  assert.equal(refusals.note(report("e"), at(1700)), undefined, "then counted for the window, as before");
});

test("refusals — a first telling taken back leaves nothing behind; one only counted is uncounted", () => {
  const { refusals } = ledger(1000);
  const alive = (reason: string) => ({ node: "web-2", kind: "alive", reason });
  const failed: TakeBack = [];
  assert.notEqual(refusals.note(alive("a"), at(0), failed), undefined);
  assert.equal(refusals.note(alive("b"), at(5), failed), undefined);
  takeBack(failed);
  assert.deepEqual(refusals.due(at(5000)), [], "nothing counted is left to tell");
  assert.deepEqual(
    refusals.note(alive("a"), at(10))?.detail,
    { reason: "a", refusals: 1 },
    "told at once again",
  );
  // Counted within a kept window, then taken back: the window's telling says one, not two.
  const counted: TakeBack = [];
  assert.equal(refusals.note(alive("b"), at(20), counted), undefined);
  takeBack(counted);
  refusals.note(alive("c"), at(30));
  assert.deepEqual(
    refusals.due(at(1010)).map((event) => event.detail),
    [{ reason: "c", refusals: 1 }],
  );
});

test("refusals — the window's telling at its end taken back is told at the next look", () => {
  const { refusals } = ledger(1000);
  const enrol = (reason: string) => ({ node: "web-3", kind: "enrol", reason });
  refusals.note(enrol("a"), at(0));
  refusals.note(enrol("b"), at(10));
  const failed: TakeBack = [];
  assert.deepEqual(
    refusals.due(at(1000), failed).map((event) => event.detail),
    [{ reason: "b", refusals: 1 }],
  );
  takeBack(failed);
  assert.deepEqual(
    refusals.due(at(1100)).map((event) => event.detail),
    [{ reason: "b", refusals: 1 }],
    "told at the next look",
  );
  refusals.note(enrol("c"), at(1200));
  refusals.note(enrol("d"), at(1300));
  const again: TakeBack = [];
  assert.deepEqual(
    refusals.due(at(2100), again).map((event) => event.detail),
    [{ reason: "d", refusals: 2 }],
  );
  takeBack(again);
  assert.deepEqual(
    refusals.note(enrol("e"), at(2200))?.detail,
    { reason: "e", refusals: 3 },
    "or at the next refusal, with the ones it did not tell",
  );
});

test("refusals — one counted by a transaction under way is told only once that transaction is kept, and once however it ends", () => {
  const { refusals } = ledger(1000);
  const report = (reason: string) => ({ node: "web-5", kind: "report", reason });
  assert.notEqual(refusals.note(report("a"), at(0)), undefined);
  // A batch counts one; the window ends before the batch is kept: its end tells nothing of it.
  const failed: TakeBack = [];
  const notKept: OnceKept = [];
  assert.equal(refusals.note(report("b"), at(10), failed, notKept), undefined);
  assert.equal(refusals.pendingCount, 1);
  assert.deepEqual(refusals.due(at(1000)), [], "a count still under way is not told");
  // The batch is handed back: nothing was told of it, and its refusal comes again.
  takeBack(failed);
  assert.equal(refusals.pendingCount, 0, "a count handed back waits for nothing");
  assert.deepEqual(refusals.due(at(1050)), []);
  const undo: TakeBack = [];
  const kept: OnceKept = [];
  assert.deepEqual(
    refusals.note(report("b"), at(1100), undo, kept)?.detail,
    { reason: "b", refusals: 1 },
    "told once, when it comes again",
  );
  settleKept(kept);
  // Another batch counts two in that window and is kept before it ends: told with the count at its end, not before.
  const second: OnceKept = [];
  refusals.note(report("c"), at(1200), [], second);
  refusals.note(report("d"), at(1300), [], second);
  assert.equal(refusals.pendingCount, 2);
  settleKept(second);
  assert.equal(second.length, 0, "the steps are spent");
  assert.equal(refusals.pendingCount, 0);
  assert.deepEqual(refusals.due(at(2050)), [], "kept within the window: not told before its end");
  assert.deepEqual(
    refusals.due(at(2100)).map((event) => event.detail),
    [{ reason: "d", refusals: 2 }],
    "told at its end, with the count and the latest reason",
  );
  // A third counts one and is kept only after the window ended: told at the next look.
  const third: OnceKept = [];
  refusals.note(report("e"), at(2200), [], third);
  assert.deepEqual(refusals.due(at(3100)), [], "nothing told while the batch is under way");
  settleKept(third);
  assert.deepEqual(
    refusals.due(at(3110)).map((event) => event.detail),
    [{ reason: "e", refusals: 1 }],
  );
  assert.deepEqual(refusals.due(at(9000)), []);
});

test("refusals — counts kept out of order keep the latest reason the one that came last", () => {
  const { refusals } = ledger(1000);
  const alive = (reason: string) => ({ node: "web-6", kind: "alive", reason });
  refusals.note(alive("first"), at(0));
  const older: OnceKept = [];
  const newer: OnceKept = [];
  refusals.note(alive("older"), at(10), [], older);
  refusals.note(alive("newer"), at(20), [], newer);
  settleKept(newer);
  settleKept(older);
  assert.deepEqual(
    refusals.due(at(1000)).map((event) => event.detail),
    [{ reason: "newer", refusals: 2 }],
  );
});

test("refusals — a telling taken back after its window was forgotten as quiet puts the window before back", () => {
  const { refusals } = ledger(1000);
  const report = (reason: string) => ({ node: "web-7", kind: "report", reason });
  refusals.note(report("a"), at(0));
  refusals.note(report("b"), at(10));
  const failed: TakeBack = [];
  assert.deepEqual(refusals.note(report("c"), at(1500), failed)?.detail, { reason: "c", refusals: 2 });
  // Quiet for a whole window since, that window is forgotten; then the telling is taken back.
  assert.deepEqual(refusals.due(at(2600)), []);
  takeBack(failed);
  assert.deepEqual(
    refusals.due(at(2700)).map((event) => event.detail),
    [{ reason: "b", refusals: 1 }],
    "what the window before had counted is told at the next look",
  );
});

test("refusals — a telling taken back after a later window replaced its own leaves what the window before counted to that one", () => {
  const { refusals } = ledger(1000);
  const enrol = (reason: string) => ({ node: "web-8", kind: "enrol", reason });
  refusals.note(enrol("a"), at(0));
  refusals.note(enrol("b"), at(10));
  // Told with "b" counted, in an event still being written...
  const slow: TakeBack = [];
  assert.deepEqual(refusals.note(enrol("c"), at(1500), slow)?.detail, { reason: "c", refusals: 2 });
  // ...while its minute ends and the next refusal opens a window of its own; then that telling is taken back.
  assert.deepEqual(refusals.note(enrol("d"), at(2600))?.detail, { reason: "d", refusals: 1 });
  takeBack(slow);
  assert.deepEqual(
    refusals.due(at(3600)).map((event) => event.detail),
    [{ reason: "d", refusals: 1 }],
    "what the window before counted is told at the end of the window that stands",
  );
});

test("refusals — one that came but whose telling was lost is told at the next look, or with the next refusal", () => {
  const { refusals } = ledger(1000);
  const busy = { node: "web-4", kind: "enrol", reason: "busy" };
  refusals.untold(busy);
  assert.deepEqual(
    refusals.due(at(0)).map((event) => event.detail),
    [{ reason: "busy", refusals: 1 }],
  );
  // Within the window of that telling: told with the next refusal all the same.
  refusals.untold(busy);
  assert.deepEqual(refusals.note(busy, at(10))?.detail, { reason: "busy", refusals: 2 });
});

test("refusals — the reason kept and logged is bounded, whatever the node sent", () => {
  const { refusals, lines } = ledger();
  const event = refusals.note({ node: "web-1", kind: "report", reason: "é".repeat(10_000) }, at(0));
  const reason = String(event?.detail.reason);
  assert.ok(Buffer.byteLength(reason) <= reasonMaxBytes);
  assert.ok(reason.endsWith("…"));
  assert.ok((lines[0]?.length ?? 0) < 2 * reasonMaxBytes);
});

test("bounds — text is cut at a character boundary to the byte limit, and text that fits is untouched", () => {
  assert.equal(boundText("short"), "short");
  for (const unit of ["a", "é", "€", "𝄞"]) {
    const cut = boundText(unit.repeat(1000), 100);
    assert.ok(Buffer.byteLength(cut) <= 100, unit);
    assert.ok(fitsBytes(cut, 100));
    assert.ok(cut.endsWith("…"));
    assert.ok(!cut.includes("\uFFFD"), "no character split");
    assert.equal(cut.slice(0, -1).replaceAll(unit, ""), "");
  }
  assert.equal(fitsBytes("x".repeat(reasonMaxBytes)), true);
  assert.equal(fitsBytes("x".repeat(reasonMaxBytes + 1)), false);
});
