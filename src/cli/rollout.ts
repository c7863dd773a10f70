/**
 * What `mesh plan apply` and `mesh declare` share: a new revision of the plan written by compare-and-set under the
 * lease, its roll-out (by the acting control plane, or by the command itself when it took a lease of its own and so
 * nobody else acts), and, with `--wait`, every affected node's report as a table.
 */
import { hostname, userInfo } from "node:os";
import type { ControlSide } from "../bus/index.js";
import type { SentDeclaration } from "../control/declarations.js";
import { mayConflict } from "../control/compose.js";
import { describeLiveness, livenessOf } from "../control/liveness.js";
import type { PlanAt } from "../control/plans.js";
import {
  heldOf,
  outlookOf,
  planText,
  readFleet,
  readPlan,
  refuseConflicts,
  rollOut,
} from "../control/plans.js";
import { MeshError } from "../errors.js";
import type { Plan } from "../link/index.js";
import type { Output } from "../program/output.js";
import type { LatestSent, Store } from "../store/index.js";
import type { CommandOptions } from "./context.js";
import { signingIdentity, withCommandLease } from "./context.js";

export interface PlanChange {
  /** The plan to write, made from the revision read (read again when another write came first). */
  make: (current: PlanAt) => Plan;
  /**
   * The revision the operator based the change on (`--revision N`): refused when the plan is no longer at it. Without
   * one the change is made again on the newer revision, a few times.
   */
  expected?: number;
  /** Names the change in messages: the plan file, or the declaration file. */
  fileName: string;
  nothingDone: string;
}

export interface Applied {
  revision: number;
  /** False when the plan made was the plan already at `revision`: nothing was written. */
  written: boolean;
  epoch: number;
  /** The declarations the revision's roll-out sent: one per node whose composition changed. */
  sent: SentDeclaration[];
  /**
   * What every node was last sent, read once the acting control plane had sent the revision; absent when this
   * command rolled it out itself.
   */
  latest?: ReadonlyMap<string, LatestSent>;
}

/** How often a command looks at the store while it waits for the nodes. */
const lookEveryMs = 100;
/** How often it looks whether the control plane has sent a revision: one row, read often, as that is soon. */
const sentLookEveryMs = 20;

/** Writes the change as the next revision and sees it rolled out. */
export async function applyPlanChange(
  options: CommandOptions,
  store: Store,
  side: ControlSide,
  change: PlanChange,
): Promise<Applied> {
  const signing = signingIdentity(options);
  return withCommandLease(
    options,
    store,
    { nothingDone: change.nothingDone, withoutLease: "refuse" },
    async ({ epoch, stillActing, own }) => {
      const now = () => new Date();
      let revision: number | undefined;
      let written = true;
      /**
       * Each node's declaration sequence allocated before the revision was written: what the revision's roll-out
       * sends a node carries a higher one. Not the latest sent: a declaration of an earlier revision still being
       * recorded meanwhile would be counted as this one's.
       */
      let allocated: Map<string, number> | undefined;
      for (let attempt = 1; revision === undefined; attempt++) {
        const current = await readPlan(store);
        if (change.expected !== undefined && current.revision !== change.expected) {
          throw new MeshError(
            "plan_changed",
            `plan changed since revision ${change.expected} (it is at ${current.revision}); ${change.nothingDone}`,
          );
        }
        const plan = change.make(current);
        if (current.revision > 0 && planText(plan) === planText(current.plan)) {
          // The same plan again writes no revision; what it holds is sent already, or is being sent.
          revision = current.revision;
          written = false;
          allocated = await store.nodes.allocatedSequences();
          break;
        }
        allocated = await store.nodes.allocatedSequences();
        if (mayConflict(plan)) {
          const held = heldOf(await store.declarations.latestSent());
          refuseConflicts(
            outlookOf(plan, await readFleet(store, now(), options.outOfTouchAfterMs), held),
            change.fileName,
          );
        }
        if (!(await stillActing())) {
          throw new MeshError("lease_moved", `the lease moved on from epoch ${epoch}; ${change.nothingDone}`);
        }
        try {
          revision = await store.plans.write({
            expected: current.revision,
            plan: planText(plan),
            at: now().toISOString(),
            by: writer(),
            epoch,
          });
        } catch (error) {
          const again = error instanceof MeshError && error.code === "plan_changed";
          if (!again || change.expected !== undefined || attempt >= 5) throw error;
        }
      }
      if (own) {
        const context = {
          store,
          signing,
          bus: side.bus,
          now,
          gate: stillActing,
          outOfTouchAfterMs: options.outOfTouchAfterMs,
        };
        return { revision, written, epoch, sent: (await rollOut(context, epoch)).sent };
      }
      await sentBy(options, store, revision, epoch);
      const after = await store.declarations.latestSent();
      const allocatedBefore = allocated ?? new Map<string, number>();
      const sent = [...after]
        .filter(([node, latest]) => latest.sequence > (allocatedBefore.get(node) ?? 0))
        .map(([node, latest]) => ({
          node,
          sequence: latest.sequence,
          epoch: latest.epoch,
          digest: latest.digest,
        }));
      return { revision, written, epoch, sent, latest: after };
    },
    side,
  );
}

/** Who writes a revision, as `plan history` shows it. */
function writer(): string {
  return `${process.env.USER ?? process.env.LOGNAME ?? userInfo().username}@${hostname()}`;
}

/** Waits until the acting control plane has rolled out `revision` (or a later one), within the deadline. */
async function sentBy(options: CommandOptions, store: Store, revision: number, epoch: number): Promise<void> {
  for (;;) {
    const sent = await store.plans.sent();
    if (sent !== undefined && sent.revision >= revision) return;
    if (options.deadline.remainingMs() <= lookEveryMs * 3) {
      throw new MeshError(
        "not_sent",
        `revision ${revision} is written, and the control plane acting at epoch ${epoch} had not sent it ` +
          `${options.deadline.said}; it sends it as soon as it can (\`mesh plan show\` says when)`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, sentLookEveryMs));
  }
}

/** One node's answer to what it was sent. */
export interface Outcome {
  node: string;
  sequence: number;
  outcome: "applied" | "failed" | "refused" | "out of touch" | "never spoken" | "no answer";
  reason?: string;
}

/**
 * Waits until every node sent a declaration has reported it (or a later one), or is out of touch, or the deadline
 * has all but passed; then prints one row per node and throws `not_applied` when any did not apply.
 */
export async function waitForReports(
  options: CommandOptions,
  store: Store,
  sent: readonly SentDeclaration[],
  out: Output,
): Promise<void> {
  const outcomes = new Map<string, Outcome>();
  const waiting = new Map(sent.map((one) => [one.node, one]));
  for (;;) {
    const copies = await store.accounts.recoveryCopies([...waiting.keys()]);
    for (const [node, copy] of copies) {
      const one = waiting.get(node);
      if (one === undefined || copy.sequence === null || copy.sequence < one.sequence) continue;
      const outcome = copy.outcome === "applied" || copy.outcome === "failed" ? copy.outcome : "refused";
      outcomes.set(node, { node, sequence: copy.sequence, outcome, ...reasonOf(copy.report) });
      waiting.delete(node);
    }
    if (waiting.size > 0) {
      // A node out of touch is not waited for: it is said so, at once.
      const now = new Date();
      const hearing = await store.hearing.read();
      const records = await Promise.all([...waiting.keys()].map((node) => store.nodes.get(node)));
      for (const record of records) {
        if (record === undefined) continue;
        const reading = livenessOf(record.lastSeen, now, options.outOfTouchAfterMs, hearing);
        const one = waiting.get(record.name);
        // A node that never spoke may be starting now: it is waited for, and named as such if it stays silent.
        if (reading.liveness !== "out_of_touch" || one === undefined) continue;
        outcomes.set(record.name, {
          node: record.name,
          sequence: one.sequence,
          outcome: "out of touch",
          reason: describeLiveness(reading),
        });
        waiting.delete(record.name);
      }
    }
    if (waiting.size === 0 || options.deadline.remainingMs() <= lookEveryMs * 3) break;
    await new Promise((resolve) => setTimeout(resolve, lookEveryMs));
  }
  const silent = await Promise.all([...waiting.keys()].map((node) => store.nodes.get(node)));
  for (const [node, one] of waiting) {
    const never = silent.find((record) => record?.name === node)?.lastSeen === null;
    outcomes.set(node, {
      node,
      sequence: one.sequence,
      outcome: never ? "never spoken" : "no answer",
      reason: never ? `not heard from at all ${options.deadline.said}` : `no report ${options.deadline.said}`,
    });
  }
  const rows = [...outcomes.values()].sort((a, b) => (a.node < b.node ? -1 : 1));
  if (out.json) out.document(rows);
  else if (rows.length === 0) out.line("no node was sent anything new: nothing to wait for");
  else {
    out.table(
      ["NODE", "SEQUENCE", "OUTCOME", "REASON"],
      rows.map((row) => [row.node, String(row.sequence), row.outcome, row.reason ?? ""]),
    );
  }
  const notApplied = rows.filter((row) => row.outcome !== "applied");
  if (notApplied.length > 0) {
    throw new MeshError(
      "not_applied",
      `${notApplied.length} of ${rows.length} node${rows.length === 1 ? "" : "s"} did not apply it: ` +
        notApplied
          .slice(0, 5)
          .map((row) => `${row.node} ${row.outcome}`)
          .join(", ") +
        (notApplied.length > 5 ? ", …" : ""),
    );
  }
}

/** The reason a report gives, with its first failed item's own reason (each bounded as the wire bounds it). */
function reasonOf(report: string): { reason?: string } {
  const value = JSON.parse(report) as { reason?: unknown; items?: unknown };
  if (typeof value.reason !== "string") return {};
  const items = Array.isArray(value.items) ? (value.items as Array<Record<string, unknown>>) : [];
  const failed = items.find((item) => item.state === "failed" && typeof item.reason === "string");
  return failed === undefined
    ? { reason: value.reason }
    : { reason: `${value.reason}: ${String(failed.id)}: ${String(failed.reason)}` };
}

/** `--wait`'s deadline when `--timeout` is not given. */
export const defaultWaitMs = 60_000;

/** The deadline a command with `--wait` is given: `--timeout`, or a minute. */
export function waitTimeout(timeout: number | undefined, wait: boolean | undefined): number | undefined {
  return timeout ?? (wait === true ? defaultWaitMs : undefined);
}
