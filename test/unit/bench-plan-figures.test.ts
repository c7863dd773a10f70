import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { planMeshFigures } from "../../bench/plan-figures.js";
import type { PlanOnMesh, Rollout } from "../../bench/plan-mesh.js";

const spread = { count: 10, p50: 100, p99: 190, max: 200 };
const rollout = (ms: number, cpuMs: number): Rollout => ({
  sent: 10_000,
  ms,
  cpuMs,
  composeMs: 300,
  sendMs: ms - 300,
});
const round = (r: Rollout | undefined) => ({ sent: 10_000, applyMs: 3_000, converged: spread, rollout: r });

function measured(heldRounds: PlanOnMesh["heldRounds"]): PlanOnMesh {
  return {
    initial: { sent: 10_000, applyMs: 5_000, converged: spread, rollout: rollout(2_500, 2_200) },
    wholeFleet: [round(rollout(2_000, 1_800)), round(rollout(2_500, 2_000)), round(rollout(2_200, 1_900))],
    heldRounds,
    change: {
      placed: 1_000,
      wouldSend: 1_000,
      itemsChange: 1_000,
      sent: 1_000,
      events: 1_000,
      sequencesMoved: 1_000,
      appliedElsewhere: 0,
      applyMs: 1_500,
      converged: spread,
    },
    failover: {
      epochs: [1, 2],
      takeoverMs: 400,
      rolledOut: undefined,
      sentEpoch: 2,
      events: 0,
      sequencesMoved: 0,
    },
    mismatches: [],
  };
}

const held = (r: Rollout | undefined, signingRate: number) => ({
  sent: 10_000,
  rollout: r,
  signingRate,
  restedMs: 250,
});
const heldRate = (figure: { part: string; what: string }) =>
  figure.part === "plan" && figure.what.startsWith("the same change rolled out to a held fleet");

describe("the plan part's figures", () => {
  test("held rounds: the median roll-out against the median of the signing rates measured beside them", () => {
    const { figures, json } = planMeshFigures(
      measured([
        held(rollout(1_000, 1_250), 20_000),
        held(rollout(2_000, 2_500), 16_000),
        held(rollout(1_250, 2_000), 18_000),
      ]),
      10_000,
      { value: 25_000, what: "Ed25519 signing, one core" },
    );
    const rate = figures.find(heldRate);
    assert.ok(rate !== undefined, "a figure for the held rounds");
    assert.equal(rate.value, 8_000, "10,000 in 1,250 ms, the middle of 1,000 / 1,250 / 2,000");
    assert.deepEqual(rate.limit, { value: 18_000, what: "Ed25519 signing, one core, beside each" });
    assert.equal(rate.target, "≥ 0.5×");
    assert.doesNotMatch(rate.note ?? "", /MISMATCH/);
    const perCpu = figures[figures.indexOf(rate) + 1];
    assert.equal(perCpu?.unit, "/CPU-s");
    assert.equal(perCpu?.value, 5_000, "10,000 in 2,000 ms of CPU, the middle of 1,250 / 2,000 / 2,500");
    assert.equal(perCpu?.limit?.value, 18_000);
    const rounds = json.held_rounds as Array<{ signing_rate_before: number }>;
    assert.deepEqual(
      rounds.map((one) => one.signing_rate_before),
      [20_000, 16_000, 18_000],
    );
  });

  test("held rounds: a round serve logged no roll-out of, or one sending fewer, is told; its limit is left out", () => {
    const { figures } = planMeshFigures(
      measured([held(rollout(1_000, 1_250), 20_000), held(undefined, 16_000)]),
      10_000,
      undefined,
    );
    const rate = figures.find(heldRate);
    assert.match(rate?.note ?? "", /^MISMATCH — median of 1 of 2 round\(s\)/);
    assert.equal(rate?.value, 10_000);
    assert.equal(
      rate?.limit?.value,
      20_000,
      "the limit beside the round timed, not the one without a roll-out",
    );
    const fewer = planMeshFigures(
      measured([
        held(rollout(1_000, 1_250), 20_000),
        held({ ...rollout(1_000, 1_250), sent: 9_999 }, 20_000),
      ]),
      10_000,
      undefined,
    );
    assert.match(fewer.figures.find(heldRate)?.note ?? "", /^MISMATCH — median of 2 of 2 round\(s\)/);
    const same = planMeshFigures(
      measured([held(rollout(1_000, 1_250), 20_000), held(rollout(1_000, 1_250), 20_000)]),
      10_000,
      undefined,
    );
    assert.doesNotMatch(same.figures.find(heldRate)?.note ?? "", /MISMATCH/);
    const none = planMeshFigures(measured([]), 10_000, undefined);
    assert.equal(none.figures.find(heldRate), undefined);
    assert.deepEqual(none.json.held_rounds, []);
  });
});
