/**
 * The plan part on a running mesh: the bench's plan applied to the lab (whose nodes joined with the bench's profile
 * sets), then one unit on a tenth of the fleet changed — nodes affected, declarations sent and convergence — then a
 * failover with the plan unchanged, after which the new epoch must send nothing.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { allot } from "../src/control/allot.js";
import type { Spread } from "../src/lab/figures.js";
import { spread } from "../src/lab/figures.js";
import type { Store } from "../src/store/index.js";
import { declarationsSentIn, declarationsSentKind } from "../src/store/index.js";
import type { ServeProcess } from "./mesh.js";
import { runMesh, runMeshTimed } from "./mesh.js";
import { benchFleet, benchPlan, changedUnit } from "./plan.js";
import { waitFor } from "./wait.js";

export interface PlanOnMeshSettings {
  data: string;
  /** Where the plan files are written. */
  dir: string;
  store: Store;
  names: readonly string[];
  /**
   * The lab's nodes running now: a node whose join failed (said and counted by the enrolment part) or whose agent
   * stopped is not waited for, as the fan-out does not wait for it either.
   */
  running: () => ReadonlySet<string>;
  /** The lab's nodes that applied a declaration, and when each one's report was kept (filled by the lab's events). */
  applied: Set<string>;
  converged: Map<string, number>;
  serve: ServeProcess;
  /** Starts a second control plane on the same data and broker: the standby the failover hands over to. */
  startStandby: () => ServeProcess;
  /** How long the new control plane is watched after its first roll-out (its nodes' alives come round). */
  settleMs: number;
  /** How many times the whole fleet is then sent a change (the unit every node holds), each roll-out timed. */
  rounds: number;
  /**
   * When given, as many rounds again with the fleet held (`Lab.hold`) while the control plane rolls the change out,
   * each once the machine has come to rest from the round before (`atRest`, which says how long that took) and
   * after measuring one core's signing rate (the limit beside it).
   */
  held?: Holding & { atRest: () => Promise<number>; signingRate: () => number; signedBytes: number };
  say: (line: string) => void;
}

/** Holds the lab's fleet (`Lab.hold`) while a roll-out is sent, and lets it go. */
interface Holding {
  hold: () => void;
  release: () => void;
}

export interface WholeFleetRound {
  sent: number;
  applyMs: number;
  converged: Spread;
  rollout: Rollout | undefined;
}

export interface PlanOnMesh {
  initial: {
    sent: number;
    applyMs: number;
    converged: Spread;
    /** The control plane's roll-out of the whole plan, as it logged it: its first, of a plan new to it. */
    rollout: Rollout | undefined;
  };
  /** Each change to the unit every node holds: what apply sent, its roll-out as serve logged it, and convergence. */
  wholeFleet: WholeFleetRound[];
  /** The same change rolled out to the fleet held; each with one core's signing rate measured just before it. */
  heldRounds: Array<{ sent: number; rollout: Rollout | undefined; signingRate: number; restedMs: number }>;
  /** The length of the declaration the held rounds' signing rates were measured over. */
  signedBytes?: number;
  change: {
    /** Nodes the changed unit is placed on, by `allot` in this process over the lab's profiles. */
    placed: number;
    wouldSend: number;
    itemsChange: number;
    sent: number;
    events: number;
    sequencesMoved: number;
    appliedElsewhere: number;
    applyMs: number;
    converged: Spread;
  };
  failover: {
    epochs: [number, number];
    takeoverMs: number;
    rolledOut: { sent: number; unchanged: number } | undefined;
    sentEpoch: number | undefined;
    events: number;
    sequencesMoved: number;
  };
  mismatches: string[];
}

const appliedSchema = z.object({
  revision: z.number(),
  epoch: z.number(),
  sent: z.array(z.object({ node: z.string(), sequence: z.number() })),
  conditions: z.array(z.object({ unit: z.string(), reason: z.string() })),
});
const diffSchema = z.object({ revision: z.number(), nodes: z.array(z.unknown()), would_send: z.number() });
const rolledOutSchema = z.object({
  event: z.literal("plan.rolled_out"),
  epoch: z.number(),
  sent: z.number(),
  unchanged: z.number(),
});
const rolloutSchema = z.object({
  event: z.literal("plan.rolled_out"),
  revision: z.number(),
  sent: z.number(),
  ms: z.number(),
  cpu_ms: z.number(),
  compose_ms: z.number(),
  send_ms: z.number(),
});
const servingSchema = z.object({ event: z.literal("control.serving"), epoch: z.number().nullable() });

/** `mesh plan apply` (and diff) get time enough for a whole fleet's roll-out. */
const commandTimeout = ["--timeout", "300s"];

export async function benchPlanOnMesh(settings: PlanOnMeshSettings): Promise<PlanOnMesh> {
  const { data, dir, store, names, applied, converged, say } = settings;
  const mismatches: string[] = [];
  const apply = async (file: string, held?: Holding) => {
    applied.clear();
    converged.clear();
    const started = performance.now();
    held?.hold();
    let ran: { stdout: string; endedAt: number };
    try {
      ran = await runMeshTimed(data, ["plan", "apply", "-f", file, "--json", ...commandTimeout]);
    } finally {
      held?.release();
    }
    const result = appliedSchema.parse(JSON.parse(ran.stdout));
    const applyMs = ran.endedAt - started;
    const running = settings.running();
    const awaited = result.sent.filter(({ node }) => running.has(node));
    if (awaited.length < result.sent.length) {
      say(
        `plan: ${result.sent.length - awaited.length} node(s) sent to are not running in the lab: not awaited`,
      );
    }
    await waitFor(() => awaited.every(({ node }) => converged.has(node)), 300_000);
    const times = awaited.map(({ node }) => (converged.get(node) ?? Number.NaN) - started);
    const c = spread(times);
    if (c === undefined) throw new Error(`${file}: no node was sent anything`);
    return { result, applyMs, converged: c };
  };

  // The whole plan first: every node is sent its composition (it replaces whatever the fleet held).
  const first = join(dir, "bench-plan-1.json");
  writeFileSync(first, JSON.stringify(benchPlan(names)));
  const initial = await apply(first);
  const initialRollout = rolloutOf(settings.serve.stderr(), initial.result.revision);
  say(
    `plan: revision ${initial.result.revision} sent to ${initial.result.sent.length} nodes in ` +
      `${initial.applyMs.toFixed(0)} ms, all kept by ${initial.converged.max.toFixed(0)} ms; ` +
      `${initial.result.conditions.length} condition(s)`,
  );

  // A change every node holds, several times: the roll-out of a plan change touching the whole fleet, timed each
  // time (the first roll-out above is also the control plane's first of this plan's composition).
  let commonRound = 1;
  /** The next content of the unit every node holds, applied; what was sent checked against the whole fleet. */
  const changeCommon = async (which: string, held?: Holding) => {
    commonRound++;
    const file = join(dir, `bench-plan-common-${commonRound}.json`);
    writeFileSync(file, JSON.stringify(benchPlan(names, { commonRound })));
    const whole = await apply(file, held);
    const sent = whole.result.sent.length;
    const rollout = rolloutOf(settings.serve.stderr(), whole.result.revision);
    if (sent !== initial.result.sent.length)
      mismatches.push(`${which}: ${sent} of ${initial.result.sent.length} nodes were sent the change`);
    if (rollout === undefined)
      mismatches.push(`${which}: serve logged no roll-out of revision ${whole.result.revision}`);
    else if (rollout.sent !== sent)
      mismatches.push(`${which}: serve's roll-out sent ${rollout.sent}, apply's list ${sent}`);
    const told =
      rollout === undefined
        ? "serve logged no roll-out of it"
        : `serve's roll-out ${rollout.ms} ms (compose ${rollout.composeMs}, send ${rollout.sendMs}), ` +
          `${rollout.cpuMs} ms of CPU`;
    return { whole, sent, rollout, told };
  };
  const wholeFleet: WholeFleetRound[] = [];
  for (let round = 1; round <= settings.rounds; round++) {
    const { whole, sent, rollout, told } = await changeCommon(`round ${round}`);
    say(
      `plan: the unit every node holds changed (round ${round}): sent to ${sent} nodes, ${told}; ` +
        `all kept by ${whole.converged.max.toFixed(0)} ms`,
    );
    wholeFleet.push({ sent, applyMs: whole.applyMs, converged: whole.converged, rollout });
  }

  // The same change with the fleet held: the roll-out has this machine's cores as it would beside a fleet of real
  // machines (the apply returns once the control plane has sent every declaration; the fleet then applies them).
  // Convergence is not timed in these rounds; each ends with the whole fleet holding what it was sent.
  const heldRounds: PlanOnMesh["heldRounds"] = [];
  if (settings.held !== undefined) {
    for (let round = 1; round <= settings.rounds; round++) {
      const restedMs = await settings.held.atRest();
      const signingRate = settings.held.signingRate();
      const { sent, rollout, told } = await changeCommon(`held round ${round}`, settings.held);
      say(
        `plan: the unit every node holds changed, the fleet held (round ${round}): sent to ${sent} nodes, ` +
          `${told}; signing just before ${signingRate.toFixed(0)}/s on one core; the machine came to rest before ` +
          `it in ${restedMs.toFixed(0)} ms`,
      );
      heldRounds.push({ sent, rollout, signingRate, restedMs });
    }
  }

  // One unit changed: what diff says would be sent, what apply sent, what the store recorded, must all agree.
  const next = benchPlan(names, { changed: true, commonRound });
  const placed = allot(next, benchFleet(names)).placed.get(changedUnit)?.length ?? 0;
  const second = join(dir, "bench-plan-2.json");
  writeFileSync(second, JSON.stringify(next));
  const diff = diffSchema.parse(
    JSON.parse(await runMesh(data, ["plan", "diff", "-f", second, "--json", ...commandTimeout])),
  );
  let mark = await newestEventId(store);
  let before = await store.declarations.latestSent();
  const change = await apply(second);
  const sentNodes = new Set(change.result.sent.map(({ node }) => node));
  const events = await declarationsSentSince(store, mark);
  const moved = movedSince(before, await store.declarations.latestSent());
  const appliedElsewhere = [...applied].filter((node) => !sentNodes.has(node)).length;
  const counts = {
    placed,
    wouldSend: diff.would_send,
    sent: change.result.sent.length,
    events: events.length,
    sequencesMoved: moved.length,
  };
  say(
    `plan: ${changedUnit} changed — placed on ${placed}, diff would_send ${diff.would_send} ` +
      `(${diff.nodes.length} nodes' items change), apply sent ${counts.sent}, sent in the audit trail ` +
      `${counts.events}, sequences moved ${counts.sequencesMoved}; applied by nodes not sent: ${appliedElsewhere}`,
  );
  if (new Set(Object.values(counts)).size !== 1)
    mismatches.push(`one unit changed: ${JSON.stringify(counts)} are not all equal`);
  if (appliedElsewhere > 0)
    mismatches.push(`${appliedElsewhere} nodes applied a declaration they were not sent`);
  say(
    `plan: change → kept p50 ${change.converged.p50.toFixed(0)} ms, max ${change.converged.max.toFixed(0)} ms ` +
      `(apply exited at ${change.applyMs.toFixed(0)} ms)`,
  );

  // Failover with the plan unchanged: the acting control plane stops (SIGTERM gives the lease back), the standby
  // takes over under a new epoch and rolls the plan out once as it begins to act; that roll-out must send nothing.
  // The epoch the change was applied under (the acting control plane's log may have lost its first lines by now).
  const from = change.result.epoch;
  mark = await newestEventId(store);
  before = await store.declarations.latestSent();
  const standby = settings.startStandby();
  await new Promise((resolve) => setTimeout(resolve, 1000));
  const stoppedAt = performance.now();
  await settings.serve.stop();
  await withTimeout(standby.serving, 60_000, "the standby did not act within a minute");
  const takeoverMs = performance.now() - stoppedAt;
  const to = servingEpochOf(standby.stderr());
  await waitFor(() => rolledOutBy(standby.stderr(), to) !== undefined, 120_000);
  const rolledOut = rolledOutBy(standby.stderr(), to);
  const sentMark = await store.plans.sent();
  // Every node's alive comes round to the new control plane: a resend would show here too.
  await new Promise((resolve) => setTimeout(resolve, settings.settleMs));
  const byNewEpoch = (await declarationsSentSince(store, mark)).filter((event) => event.epoch === to);
  const movedAfter = movedSince(before, await store.declarations.latestSent());
  say(
    `plan: failover epoch ${from} → ${to} in ${takeoverMs.toFixed(0)} ms; first plan.rolled_out sent ` +
      `${rolledOut?.sent ?? "?"} (unchanged ${rolledOut?.unchanged ?? "?"}); plan sent mark at epoch ` +
      `${sentMark?.epoch ?? "none"}; after ${settings.settleMs / 1000} s: sent in the audit trail under epoch ${to}: ` +
      `${byNewEpoch.length}, sequences moved ${movedAfter.length}`,
  );
  if (to <= from) mismatches.push(`failover: the new control plane acts at epoch ${to}, not above ${from}`);
  if (sentMark?.epoch !== to)
    mismatches.push(`failover: the plan's sent mark is at epoch ${sentMark?.epoch ?? "none"}, not ${to}`);
  if ((rolledOut?.sent ?? 0) + byNewEpoch.length + movedAfter.length > 0)
    mismatches.push(
      `failover: the new epoch sent declarations (rolled_out ${rolledOut?.sent ?? 0}, audit trail ` +
        `${byNewEpoch.length}, sequences moved ${movedAfter.length}); expected none`,
    );
  for (const mismatch of mismatches) say(`plan: MISMATCH — ${mismatch}`);

  return {
    initial: {
      sent: initial.result.sent.length,
      applyMs: initial.applyMs,
      converged: initial.converged,
      rollout: initialRollout,
    },
    wholeFleet,
    heldRounds,
    ...(settings.held === undefined ? {} : { signedBytes: settings.held.signedBytes }),
    change: {
      ...counts,
      itemsChange: diff.nodes.length,
      appliedElsewhere,
      applyMs: change.applyMs,
      converged: change.converged,
    },
    failover: {
      epochs: [from, to],
      takeoverMs,
      rolledOut,
      sentEpoch: sentMark?.epoch,
      events: byNewEpoch.length,
      sequencesMoved: movedAfter.length,
    },
    mismatches,
  };
}

/** The epoch a control plane said it acts under (`control.serving`), from its log. */
function servingEpochOf(log: string): number {
  for (const line of log.split("\n")) {
    if (!line.includes('"event":"control.serving"')) continue;
    const epoch = servingSchema.parse(JSON.parse(line)).epoch;
    if (epoch === null) throw new Error("the control plane acts without an epoch");
    return epoch;
  }
  throw new Error("the control plane's log has no control.serving line");
}

/** A roll-out as serve logged it: declarations sent, its time, and serve's CPU over it (every thread's). */
export interface Rollout {
  sent: number;
  ms: number;
  cpuMs: number;
  /** The time to read the plan and the fleet and compose, then the time to sign, record and send. */
  composeMs: number;
  sendMs: number;
}

/**
 * The roll-out of `revision` that sent declarations, as the control plane logged it: how many, and how long the
 * whole roll-out took (the plan and the fleet read, composed, signed, recorded, sent).
 */
export function rolloutOf(log: string, revision: number): Rollout | undefined {
  for (const line of log.split("\n")) {
    if (!line.includes('"event":"plan.rolled_out"')) continue;
    const rolled = rolloutSchema.parse(JSON.parse(line));
    if (rolled.revision === revision && rolled.sent > 0)
      return {
        sent: rolled.sent,
        ms: rolled.ms,
        cpuMs: rolled.cpu_ms,
        composeMs: rolled.compose_ms,
        sendMs: rolled.send_ms,
      };
  }
  return undefined;
}

/** The first `plan.rolled_out` a control plane logged under `epoch`, if it has yet. */
function rolledOutBy(log: string, epoch: number): { sent: number; unchanged: number } | undefined {
  for (const line of log.split("\n")) {
    if (!line.includes('"event":"plan.rolled_out"')) continue;
    const rolled = rolledOutSchema.parse(JSON.parse(line));
    if (rolled.epoch === epoch) return { sent: rolled.sent, unchanged: rolled.unchanged };
  }
  return undefined;
}

async function newestEventId(store: Store): Promise<number> {
  return (await store.events.list({ limit: 1 }))[0]?.id ?? 0;
}

/**
 * The sendings the audit trail recorded after event `afterId` (each roll-out chunk's `declarations.sent` event names
 * its nodes), with the epoch each was sent under: read back from the newest until past it.
 */
async function declarationsSentSince(store: Store, afterId: number) {
  for (let limit = 1_000; ; limit *= 4) {
    const events = await store.events.list({ limit });
    const oldest = events[0];
    if (events.length < limit || oldest === undefined || oldest.id <= afterId)
      return events
        .filter((event) => event.id > afterId && event.kind === declarationsSentKind)
        .flatMap((event) => declarationsSentIn(event).map((sent) => ({ ...sent, epoch: event.epoch })));
  }
}

/** The nodes whose newest declaration is not the one they held at `before`. */
function movedSince(
  before: ReadonlyMap<string, { sequence: number }>,
  after: ReadonlyMap<string, { sequence: number }>,
): string[] {
  return [...after]
    .filter(([node, latest]) => latest.sequence !== before.get(node)?.sequence)
    .map(([node]) => node);
}

async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(what)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
