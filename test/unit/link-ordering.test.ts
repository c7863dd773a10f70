import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";

import { accountOfReport, compareOrder, judgeReport, olderThan, parseReport } from "../../src/link/index.js";
import type { DeclarationOrder, ReportAccount, ReportJudgement, ReportOrder } from "../../src/link/index.js";
import { sameDeclaration } from "../../src/control/ingest.js";

const order = (epoch: number, sequence: number, report_sequence: number): ReportOrder => ({
  epoch,
  sequence,
  report_sequence,
});

const digestOf = (name: string) => `sha256:${name.padStart(64, "0")}`;

/** The declarations this node was sent, by digest. */
const sent = new Map<string, DeclarationOrder>([
  [digestOf("a1"), { epoch: 1, sequence: 1 }],
  [digestOf("a2"), { epoch: 1, sequence: 2 }],
  [digestOf("b1"), { epoch: 2, sequence: 3 }],
]);
const lookup = (digest: string) => sent.get(digest);

function assertRefused(judgement: ReportJudgement, ...parts: string[]): void {
  assert.equal(judgement.verdict, "refuse");
  if (judgement.verdict !== "refuse") return;
  assert.ok(judgement.reason.length > 0);
  for (const part of parts) assert.ok(judgement.reason.includes(part), `${judgement.reason} lacks ${part}`);
}

const accepted: ReportJudgement = { verdict: "accept" };

void describe("link ordering", () => {
  void test("ordering — compareOrder is lexicographic over epoch, sequence, report_sequence", () => {
    assert.equal(compareOrder(order(1, 1, 1), order(1, 1, 1)), 0);
    assert.equal(compareOrder(order(2, 1, 1), order(1, 9, 9)), 1);
    assert.equal(compareOrder(order(1, 2, 0), order(1, 1, 9)), 1);
    assert.equal(compareOrder(order(1, 1, 2), order(1, 1, 3)), -1);
    assert.equal(compareOrder(order(0, 5, 5), order(1, 0, 0)), -1);
    assert.equal(olderThan(order(1, 1, 2), order(1, 1, 3)), true);
    assert.equal(olderThan(order(1, 1, 3), order(1, 1, 3)), false);
    assert.equal(olderThan(order(1, 2, 0), order(1, 1, 3)), false);
  });

  void test("ordering — property: compareOrder agrees with comparing the tuples and is antisymmetric", () => {
    const anOrder = fc.record({ epoch: fc.nat(3), sequence: fc.nat(3), report_sequence: fc.nat(3) });
    fc.assert(
      fc.property(anOrder, anOrder, (a, b) => {
        const [x, y] = [a, b].map((o) => [o.epoch, o.sequence, o.report_sequence]) as [number[], number[]];
        const first = x.findIndex((value, index) => value !== y[index]);
        const expected = first < 0 ? 0 : x[first]! < y[first]! ? -1 : 1;
        assert.equal(compareOrder(a, b), expected);
        assert.equal(compareOrder(b, a), expected === 0 ? 0 : -expected);
        assert.equal(olderThan(a, b), expected === -1);
      }),
      { numRuns: 300 },
    );
  });

  void test("ordering — with nothing kept, any report is accepted", () => {
    assert.deepEqual(judgeReport({ digest: digestOf("zz") }, undefined, lookup), accepted);
    assert.deepEqual(
      judgeReport({ order: order(1, 1, 1), digest: digestOf("a1") }, undefined, lookup),
      accepted,
    );
  });

  void test("ordering — an ordered report must be strictly newer than the kept one", () => {
    const kept: ReportAccount = { order: order(1, 2, 5), digest: digestOf("a2") };
    assert.deepEqual(judgeReport({ order: order(1, 2, 6), digest: digestOf("a2") }, kept, lookup), accepted);
    assert.deepEqual(judgeReport({ order: order(2, 3, 0), digest: digestOf("b1") }, kept, lookup), accepted);
    assertRefused(judgeReport({ order: order(1, 2, 5), digest: digestOf("a2") }, kept, lookup), "repeated");
    assertRefused(
      judgeReport({ order: order(1, 2, 4), digest: digestOf("a2") }, kept, lookup),
      "older",
      "report 4",
      "report 5",
    );
    assertRefused(judgeReport({ order: order(1, 1, 9), digest: digestOf("a1") }, kept, lookup), "older");
  });

  void test("ordering — digest fallback: an unordered report is placed by its declaration", () => {
    const keptOrdered: ReportAccount = { order: order(1, 2, 5), digest: digestOf("a2") };
    assert.deepEqual(judgeReport({ digest: digestOf("b1") }, keptOrdered, lookup), accepted);
    assert.deepEqual(
      judgeReport({ digest: digestOf("a2") }, keptOrdered, lookup),
      accepted,
      "same declaration",
    );
    assertRefused(
      judgeReport({ digest: digestOf("a1") }, keptOrdered, lookup),
      "older",
      "epoch 1, sequence 1",
    );

    const keptUnordered: ReportAccount = { digest: digestOf("a2") };
    assert.deepEqual(judgeReport({ digest: digestOf("b1") }, keptUnordered, lookup), accepted);
    assert.deepEqual(judgeReport({ digest: digestOf("a2") }, keptUnordered, lookup), accepted);
    assertRefused(judgeReport({ digest: digestOf("a1") }, keptUnordered, lookup), "older");
  });

  void test("ordering — digest fallback: a report about an unknown declaration is refused", () => {
    const kept: ReportAccount = { digest: digestOf("a1") };
    assertRefused(judgeReport({ digest: digestOf("ff") }, kept, lookup), "unknown digest", digestOf("ff"));
    assertRefused(
      judgeReport({ digest: digestOf("ff") }, { order: order(1, 1, 1), digest: digestOf("a1") }, lookup),
      "unknown digest",
    );
  });

  void test("ordering — an ordered report against an unordered kept account compares declarations", () => {
    const kept: ReportAccount = { digest: digestOf("a2") };
    assert.deepEqual(judgeReport({ order: order(1, 2, 0), digest: digestOf("a2") }, kept, lookup), accepted);
    assert.deepEqual(judgeReport({ order: order(2, 3, 1), digest: digestOf("b1") }, kept, lookup), accepted);
    assertRefused(judgeReport({ order: order(1, 1, 7), digest: digestOf("a1") }, kept, lookup), "older");
  });

  void test("ordering — a kept account whose declaration is no longer known does not block a known one", () => {
    const kept: ReportAccount = { digest: digestOf("gone") };
    assert.deepEqual(judgeReport({ digest: digestOf("a1") }, kept, lookup), accepted);
    assert.deepEqual(judgeReport({ order: order(1, 1, 1), digest: digestOf("a1") }, kept, lookup), accepted);
  });

  void test("ordering — accountOfReport carries the order only when the report has one", () => {
    const base = {
      kind: "report",
      node: "web-1",
      digest: digestOf("a1"),
      outcome: "applied",
      items: [],
      sent_at: "2026-11-29T14:49:00Z",
    };
    assert.deepEqual(accountOfReport(parseReport(base)), { digest: digestOf("a1") });
    assert.deepEqual(accountOfReport(parseReport({ ...base, epoch: 1, sequence: 1, report_sequence: 4 })), {
      order: order(1, 1, 4),
      digest: digestOf("a1"),
    });
  });
});

describe("same declaration", () => {
  test("same declaration — one digest is one declaration where either account names no place; with both placed, the place decides", () => {
    const at = (digest: string, epoch: number | null, sequence: number | null) => ({
      digest,
      epoch,
      sequence,
    });
    assert.equal(sameDeclaration(at(digestOf("a1"), 1, 1), at(digestOf("a1"), 1, 1)), true);
    assert.equal(
      sameDeclaration(at(digestOf("a1"), 1, 1), at(digestOf("a1"), null, null)),
      true,
      "an older agent's",
    );
    assert.equal(sameDeclaration(at(digestOf("a1"), null, null), at(digestOf("a1"), 1, 1)), true);
    assert.equal(
      sameDeclaration(at(digestOf("a1"), 1, 1), at(digestOf("a1"), 1, 2)),
      false,
      "sent again, later",
    );
    assert.equal(sameDeclaration(at(digestOf("a1"), 1, 1), at(digestOf("a1"), 2, 1)), false);
    assert.equal(sameDeclaration(at(digestOf("a1"), null, null), at(digestOf("a2"), null, null)), false);
    assert.equal(sameDeclaration(at(digestOf("a1"), 1, 1), at(digestOf("a2"), 1, 1)), false);
  });
});
