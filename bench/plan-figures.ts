/** The plan part's figures: each beside its baseline for the table, and the same in full for the JSON. */
import type { PlanOnMesh } from "./plan-mesh.js";
import type { OutlookTiming } from "./plan.js";
import { median } from "./plan.js";
import type { Figure } from "./table.js";

export interface Shown {
  figures: Figure[];
  json: Record<string, unknown>;
}

/** The in-process allot + compose timing: the table's figures, a line for the log and the JSON. */
export function outlookFigures(t: OutlookTiming): Shown & { line: string } {
  const line =
    `plan: outlookOf (allot + compose) for ${t.nodes} nodes × ${t.units} units: CPU median ` +
    `${median(t.cpuMs).toFixed(0)} ms, max ${Math.max(...t.cpuMs).toFixed(0)} ms (allot alone ` +
    `${median(t.allotCpuMs).toFixed(0)} ms); ${t.distinctCompositions} distinct compositions, ` +
    `${t.placements} placements, ${t.conditions} condition(s)`;
  const json = {
    nodes: t.nodes,
    units: t.units,
    cpu_ms: t.cpuMs,
    wall_ms: t.wallMs,
    allot_cpu_ms: t.allotCpuMs,
    distinct_compositions: t.distinctCompositions,
    placements: t.placements,
    conditions: t.conditions,
  };
  const note =
    `${t.distinctCompositions} distinct compositions, ${t.placements} placements, ` +
    `${t.conditions} condition(s); ${t.runs} runs, in-process`;
  const allotAlone = { value: median(t.allotCpuMs), what: "allot alone, median" };
  const target = t.nodes === 10_000 ? "≤ 1,000 ms" : "";
  const figures: Figure[] = [
    {
      part: "plan",
      what: `allot + compose (outlookOf), ${t.nodes.toLocaleString("en-US")} nodes × ${t.units} units, CPU median`,
      value: median(t.cpuMs),
      unit: "ms",
      baseline: allotAlone,
      target,
      note,
    },
    {
      part: "plan",
      what: "allot + compose, CPU max",
      value: Math.max(...t.cpuMs),
      unit: "ms",
      baseline: allotAlone,
      target,
    },
  ];
  return { figures, json, line };
}

/**
 * A roll-out's rate per second of serve's CPU (every thread's, the signing pool's included): the control plane's own
 * cost per declaration, against the cost of a signature on one core. While a roll-out runs serve takes nothing from
 * its streams, so this is the roll-out's work alone; its rate in time also waits on the cores the simulated fleet
 * and the broker share with it.
 */
export function rolloutCpuFigure(
  part: string,
  perCpuSecond: number,
  signingLimit: { value: number; what: string } | undefined,
  which: string,
): Figure {
  return {
    part,
    what: "the same roll-out per second of serve's CPU (all its threads)",
    value: perCpuSecond,
    unit: "/CPU-s",
    limit: signingLimit,
    note: `serve's CPU over the roll-out, as it logged it (plan.rolled_out cpu_ms); ${which}`,
  };
}

/** The mesh half's figures for the table, and the same for the JSON. */
export function planMeshFigures(
  m: PlanOnMesh,
  nodes: number,
  signingLimit: { value: number; what: string } | undefined,
): Shown {
  const { change, failover } = m;
  const json = {
    initial: {
      sent: m.initial.sent,
      apply_ms: m.initial.applyMs,
      convergence_ms: m.initial.converged,
      rollout: m.initial.rollout ?? null,
    },
    whole_fleet: m.wholeFleet.map((round) => ({
      sent: round.sent,
      apply_ms: round.applyMs,
      convergence_ms: round.converged,
      rollout: round.rollout ?? null,
    })),
    held_rounds: m.heldRounds.map((round) => ({
      sent: round.sent,
      rollout: round.rollout ?? null,
      signing_rate_before: round.signingRate,
      rested_ms: round.restedMs,
    })),
    change: {
      placed: change.placed,
      would_send: change.wouldSend,
      items_change: change.itemsChange,
      sent: change.sent,
      sent_in_audit_trail: change.events,
      sequences_moved: change.sequencesMoved,
      applied_by_nodes_not_sent: change.appliedElsewhere,
      apply_ms: change.applyMs,
      convergence_ms: change.converged,
    },
    failover: {
      epochs: failover.epochs,
      takeover_ms: failover.takeoverMs,
      first_rolled_out: failover.rolledOut ?? null,
      plan_sent_epoch: failover.sentEpoch ?? null,
      sent_in_audit_trail: failover.events,
      sequences_moved: failover.sequencesMoved,
    },
    mismatches: m.mismatches,
  };
  const loud = (bad: boolean) => (bad ? "MISMATCH — " : "");
  const changeCounts = [change.placed, change.wouldSend, change.sent, change.events, change.sequencesMoved];
  const changeBad = new Set(changeCounts).size !== 1 || change.appliedElsewhere > 0;
  const applyExits = { value: change.applyMs, what: "`mesh plan apply` exits" };
  const failoverSent = (failover.rolledOut?.sent ?? 0) + failover.events + failover.sequencesMoved;
  const failoverBad = failoverSent > 0 || failover.sentEpoch !== failover.epochs[1];
  const rollout = m.initial.rollout;
  const timed = m.wholeFleet.flatMap((round) => (round.rollout === undefined ? [] : [round.rollout]));
  const rounds = `median of ${timed.length} of ${m.wholeFleet.length} round(s)`;
  const roundsBad =
    timed.length < m.wholeFleet.length || timed.some((one, i) => one.sent !== m.wholeFleet[i]?.sent);
  const figures: Figure[] = [
    ...(rollout === undefined
      ? []
      : [
          {
            part: "plan",
            what: "whole plan's first roll-out: declarations composed, signed, recorded, sent",
            value: rollout.sent / (rollout.ms / 1000),
            unit: "/s",
            limit: signingLimit,
            note:
              `${rollout.sent} in ${rollout.ms} ms, as \`mesh serve\` logged it (plan.rolled_out); the first ` +
              "composition of this plan in the control plane's life",
          },
          rolloutCpuFigure(
            "plan",
            rollout.sent / (Math.max(rollout.cpuMs, 1) / 1000),
            signingLimit,
            `the first roll-out: ${rollout.sent} in ${rollout.cpuMs} ms of CPU`,
          ),
        ]),
    ...(timed.length === 0
      ? []
      : [
          {
            part: "plan",
            what: "a change every node holds: its roll-out, declarations composed, signed, recorded, sent",
            value: median(timed.map((one) => one.sent / (one.ms / 1000))),
            unit: "/s",
            limit: signingLimit,
            target: "≥ 0.5×",
            note: `${loud(roundsBad)}${rounds}, as \`mesh serve\` logged each (plan.rolled_out)`,
          },
          rolloutCpuFigure(
            "plan",
            median(timed.map((one) => one.sent / (Math.max(one.cpuMs, 1) / 1000))),
            signingLimit,
            `a change every node holds: ${rounds}`,
          ),
        ]),
    ...heldFigures(m.heldRounds, m.signedBytes),
    {
      part: "plan",
      what: `whole plan applied to ${nodes} nodes → all kept, max`,
      value: m.initial.converged.max,
      unit: "ms",
      baseline: { value: m.initial.applyMs, what: "`mesh plan apply` exits" },
      note: `sent to ${m.initial.sent} nodes`,
    },
    {
      part: "plan",
      what: "one unit changed: nodes affected (`plan diff` would_send)",
      value: change.wouldSend,
      unit: "nodes",
      baseline: { value: change.placed, what: "nodes the unit is placed on" },
      target: "= placed",
      note: `${loud(change.wouldSend !== change.placed)}${(change.placed / nodes) * 100} % of the fleet`,
    },
    {
      part: "plan",
      what: "one unit changed: declarations sent (apply's sent list)",
      value: change.sent,
      unit: "nodes",
      baseline: { value: change.wouldSend, what: "nodes affected" },
      target: "= affected",
      note:
        `${loud(changeBad)}sent in the audit trail ${change.events}, sequences moved ${change.sequencesMoved}, ` +
        `applied by nodes not sent ${change.appliedElsewhere}`,
    },
    {
      part: "plan",
      what: "one unit changed → applied and kept, p50",
      value: change.converged.p50,
      unit: "ms",
      baseline: applyExits,
      note: `${change.converged.count} nodes, from \`mesh plan apply\`'s start`,
    },
    {
      part: "plan",
      what: "one unit changed → applied and kept, max",
      value: change.converged.max,
      unit: "ms",
      baseline: applyExits,
    },
    {
      part: "plan",
      what: "failover, plan unchanged: declarations sent by the new epoch",
      value: failover.events,
      unit: "",
      baseline: { value: nodes, what: "nodes" },
      target: "0",
      note:
        `${loud(failoverBad)}epoch ${failover.epochs[0]} → ${failover.epochs[1]} (SIGTERM, ` +
        `${failover.takeoverMs.toFixed(0)} ms); first plan.rolled_out sent ${failover.rolledOut?.sent ?? "none"}, ` +
        `in the audit trail ${failover.events}, sequences moved ${failover.sequencesMoved}`,
    },
  ];
  return { figures, json };
}

/**
 * The held rounds' figures: the roll-out's rate in time and per CPU-second, each against the median of the signing
 * rates measured just before each round (the machine's speed drifts over a run).
 */
function heldFigures(rounds: PlanOnMesh["heldRounds"], signedBytes: number | undefined): Figure[] {
  const timed = rounds.flatMap(({ rollout, sent, signingRate }) =>
    rollout === undefined ? [] : [{ ...rollout, applied: sent, signingRate }],
  );
  if (timed.length === 0) return [];
  const bad = timed.length < rounds.length || timed.some((one) => one.sent !== one.applied);
  // The rounds timed and the limits beside them: a round with no roll-out has neither.
  const limit = {
    value: median(timed.map((one) => one.signingRate)),
    what: `Ed25519 signing, one core${bytesSigned(signedBytes)}, beside each`,
  };
  const which = `median of ${timed.length} of ${rounds.length} round(s)`;
  return [
    {
      part: "plan",
      what: "the same change rolled out to a held fleet (its nodes verify and apply after it)",
      value: median(timed.map((one) => one.sent / (one.ms / 1000))),
      unit: "/s",
      limit,
      target: "≥ 0.5×",
      note:
        `${bad ? "MISMATCH — " : ""}${which}, the simulated fleet not sharing the cores meanwhile; the limit ` +
        "measured just before each, their median",
    },
    rolloutCpuFigure(
      "plan",
      median(timed.map((one) => one.sent / (Math.max(one.cpuMs, 1) / 1000))),
      limit,
      `the held rounds, ${which}`,
    ),
  ];
}

/** How long the declarations the limit was measured over were, for its label (nothing when not known). */
function bytesSigned(bytes: number | undefined): string {
  return bytes === undefined ? "" : `, ${bytes}-byte declarations`;
}
