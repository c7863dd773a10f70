/**
 * `mesh plan apply|show|history|diff|render`: the fleet's desired state as revisions of the plan. `apply` writes the
 * next revision by compare-and-set and sees it rolled out; `diff` is its dry run; `render` prints what one node would
 * be sent now, composed by the very function the control plane sends with.
 */
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { stringify as toYaml } from "yaml";
import type { Composition } from "../control/compose.js";
import type { FleetReading, Outlook, PlanAt } from "../control/plans.js";
import { heldOf, needsSending, outlookOf, parsePlanFile, readFleet, readPlan } from "../control/plans.js";
import { MeshError, UsageError } from "../errors.js";
import type { DeclaredItem, Plan } from "../link/index.js";
import { nodeNameProblem } from "../link/index.js";
import { stdoutOutput } from "../program/output.js";
import type { Store } from "../store/index.js";
import type { GlobalFlags } from "./context.js";
import { openRecordedControlSide, optionsFrom, withStore } from "./context.js";
import { applyPlanChange, waitForReports, waitTimeout } from "./rollout.js";

/** A revision number as the operator gives it. */
function revisionFlag(text: string): number {
  if (!/^\d{1,15}$/.test(text) || Number(text) < 1) {
    throw new UsageError(`"${text}" is not a plan revision (a whole number from 1)`);
  }
  return Number(text);
}

function readPlanFile(file: string): Plan {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    throw new UsageError(`cannot read ${file}: ${(error as Error).message}`, { cause: error });
  }
  return parsePlanFile(text, file);
}

export function registerPlanCommands(program: Command): void {
  const plan = program
    .command("plan")
    .description("the fleet's desired state: units placed on nodes by profile");

  plan
    .command("apply")
    .description(
      "write the plan as its next revision (compare-and-set) and send each node whose part changed",
    )
    .option("-f, --file <file>", "the plan (YAML or JSON {units: [...]})")
    .option("--from-revision <n>", "apply an earlier revision again (a roll-back)", revisionFlag)
    .option("--revision <n>", "write only if the plan is still at revision N", revisionFlag)
    .option("--wait", "wait until each node sent a declaration has reported it, and print each one's outcome")
    .option("--json", 'print {"revision","epoch","sent","conditions"} (with --wait: the outcomes)')
    .action(
      async (
        flags: { file?: string; fromRevision?: number; revision?: number; wait?: boolean },
        command: Command,
      ) => {
        const globals = command.optsWithGlobals<GlobalFlags>();
        if ((flags.file === undefined) === (flags.fromRevision === undefined))
          throw new UsageError("give the plan with -f FILE, or --from-revision N, not both");
        const fromFile = flags.file === undefined ? undefined : readPlanFile(flags.file);
        const options = optionsFrom({ ...globals, timeout: waitTimeout(globals.timeout, flags.wait) });
        const nothingDone = "no plan was written";
        const side = await openRecordedControlSide(options, nothingDone);
        const out = stdoutOutput(globals.json === true);
        await withStore(options, async (store) => {
          const made = fromFile ?? (await readPlan(store, flags.fromRevision)).plan;
          const applied = await applyPlanChange(options, store, side, {
            make: () => made,
            ...(flags.revision === undefined ? {} : { expected: flags.revision }),
            fileName: flags.file ?? `revision ${flags.fromRevision ?? ""}`,
            nothingDone,
          });
          const conditions = await store.plans.conditions();
          const said = applied.written
            ? `plan revision ${applied.revision} written (epoch ${applied.epoch}): sent to ${applied.sent.length} node(s)`
            : `the plan is already revision ${applied.revision}: nothing was written`;
          if (flags.wait === true) {
            if (!out.json) out.line(said);
            await waitForReports(options, store, applied.sent, out);
            return;
          }
          if (out.json) {
            out.document({
              revision: applied.revision,
              written: applied.written,
              epoch: applied.epoch,
              sent: applied.sent.map(({ node, sequence }) => ({ node, sequence })),
              conditions: conditions.map(({ unit, reason }) => ({ unit, reason })),
            });
            return;
          }
          out.line(said);
          for (const condition of conditions) out.line(`condition: ${condition.reason}`);
        }).finally(() => side.close());
      },
    );

  plan
    .command("show")
    .description("the plan (newest, or one revision), whether it is sent, and what could not be placed")
    .option("--revision <n>", "an earlier revision", revisionFlag)
    .option("--json", 'print {"revision","written_at","written_by","epoch","plan","sent","conditions"}')
    .action(async (flags: { revision?: number }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const options = optionsFrom(globals);
      const shown = await withStore(options, async (store) => {
        const at = await readPlan(store, flags.revision);
        const record = at.revision === 0 ? undefined : await store.plans.at(at.revision);
        return {
          revision: at.revision,
          written_at: record?.writtenAt ?? null,
          written_by: record?.writtenBy ?? null,
          epoch: record?.epoch ?? null,
          plan: at.plan,
          sent: (await store.plans.sent()) ?? null,
          conditions: await store.plans.conditions(),
        };
      });
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document({
          ...shown,
          sent:
            shown.sent === null
              ? null
              : { revision: shown.sent.revision, epoch: shown.sent.epoch, sent_at: shown.sent.sentAt },
        });
        return;
      }
      if (shown.revision === 0) {
        out.line("no plan was written yet: `mesh plan apply -f FILE` writes the first");
        return;
      }
      out.line(
        `# revision ${shown.revision}, written ${shown.written_at ?? "-"} by ${shown.written_by ?? "-"} at epoch ${shown.epoch ?? "-"}`,
      );
      const sent = shown.sent;
      out.line(
        sent === null
          ? "# not sent yet"
          : sent.revision >= shown.revision
            ? `# sent: revision ${sent.revision} at epoch ${sent.epoch}, ${sent.sentAt}`
            : `# not sent yet: the nodes hold revision ${sent.revision} (sent at epoch ${sent.epoch}, ${sent.sentAt})`,
      );
      for (const condition of shown.conditions) {
        out.line(`# condition since ${condition.since} (epoch ${condition.epoch}): ${condition.reason}`);
      }
      process.stdout.write(toYaml(shown.plan));
    });

  plan
    .command("history")
    .description("every revision of the plan: when, by whom, under which epoch")
    .option("--json", 'print [{"revision","written_at","written_by","epoch"}]')
    .action(async (_flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const history = await withStore(optionsFrom(globals), (store) => store.plans.history());
      const rows = history.map((one) => ({
        revision: one.revision,
        written_at: one.writtenAt,
        written_by: one.writtenBy,
        epoch: one.epoch,
      }));
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(rows);
        return;
      }
      out.table(
        ["REVISION", "WRITTEN AT", "BY", "EPOCH"],
        rows.map((row) => [String(row.revision), row.written_at, row.written_by, String(row.epoch)]),
      );
    });

  plan
    .command("diff")
    .description(
      "the dry run of apply: per node, the items it would gain, lose and change; nothing is written",
    )
    .requiredOption("-f, --file <file>", "the plan (YAML or JSON)")
    .option(
      "--json",
      'print {"revision","nodes":[{"node","gain","lose","change"}],"conditions","would_send"}',
    )
    .action(async (flags: { file: string }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const next = readPlanFile(flags.file);
      const options = optionsFrom(globals);
      const diff = await withStore(options, (store) => planDiff(store, next, options.outOfTouchAfterMs));
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(diff);
        return;
      }
      if (diff.nodes.length === 0) out.line("no node's items would change");
      for (const node of diff.nodes) {
        out.line(`${node.node}:`);
        for (const id of node.gain) out.line(`  + ${id}`);
        for (const id of node.lose) out.line(`  - ${id}`);
        for (const id of node.change) out.line(`  ~ ${id}`);
      }
      for (const condition of diff.conditions) out.line(`condition: ${condition}`);
      out.line(
        `${diff.would_send} node(s) would be sent a new declaration (against revision ${diff.revision})`,
      );
    });

  plan
    .command("render")
    .description("the declaration the control plane would send a node now (unsigned): its units and items")
    .argument("<node>", "the node's name")
    .option("--json", 'print {"node","units","items","digest"}')
    .action(async (name: string, _flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      if (nodeNameProblem(name) !== undefined) throw new UsageError(`"${name}" is not a node name`);
      const options = optionsFrom(globals);
      const rendered = await withStore(options, async (store) => {
        const record = await store.nodes.get(name);
        if (record === undefined) throw new MeshError("node_unknown", `no node named ${name}`);
        if (record.state !== "enrolled") {
          throw new MeshError(
            record.state === "retired" ? "node_retired" : "node_unknown",
            `node ${name} is ${record.state}: only an enrolled node has a profile to compose for`,
          );
        }
        const { revision, plan: current } = await readPlan(store);
        const held = heldOf(await store.declarations.latestSent());
        const outlook = outlookOf(
          current,
          await readFleet(store, new Date(), options.outOfTouchAfterMs),
          held,
        );
        const composition = outlook.compositions.get(name);
        if (composition === undefined) throw new MeshError("internal", `${name} was not composed`);
        return { revision, composition };
      });
      const { composition } = rendered;
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document({
          node: name,
          revision: rendered.revision,
          units: composition.units,
          items: composition.items,
          digest: composition.digest,
        });
        return;
      }
      out.line(
        `# ${name}, plan revision ${rendered.revision}: units ${composition.units.join(", ") || "none"}; ${composition.digest}`,
      );
      for (const conflict of composition.conflicts) {
        out.line(`# conflict: ${conflict.units[0]} and ${conflict.units[1]} both declare ${conflict.id}`);
      }
      process.stdout.write(toYaml({ items: composition.items }));
    });
}

export interface PlanDiff {
  /** The revision the file is compared with (0: none yet). */
  revision: number;
  nodes: Array<{ node: string; gain: string[]; lose: string[]; change: string[] }>;
  conditions: string[];
  /** How many nodes apply would send a new declaration. */
  would_send: number;
}

/** What applying `next` would do to the fleet as it is now, compared with the newest revision. */
export async function planDiff(store: Store, next: Plan, outOfTouchAfterMs: number): Promise<PlanDiff> {
  const current: PlanAt = await readPlan(store);
  const fleet: FleetReading = await readFleet(store, new Date(), outOfTouchAfterMs);
  const last = await store.declarations.latestSent();
  const before: Outlook = outlookOf(current.plan, fleet, heldOf(last));
  const after: Outlook = outlookOf(next, fleet, heldOf(last));
  const nodes: PlanDiff["nodes"] = [];
  let wouldSend = 0;
  for (const [node, composition] of after.compositions) {
    if (needsSending(composition, last.get(node))) wouldSend++;
    const changed = itemChanges(before.compositions.get(node), composition);
    if (changed.gain.length + changed.lose.length + changed.change.length > 0)
      nodes.push({ node, ...changed });
  }
  return {
    revision: current.revision,
    nodes,
    conditions: after.conditions.map((condition) => condition.reason),
    would_send: wouldSend,
  };
}

function itemChanges(
  before: Composition | undefined,
  after: Composition,
): { gain: string[]; lose: string[]; change: string[] } {
  const text = (items: readonly DeclaredItem[]) =>
    new Map(items.map((item) => [item.id, JSON.stringify(item)]));
  const was = text(before?.items ?? []);
  const is = text(after.items);
  return {
    gain: [...is.keys()].filter((id) => !was.has(id)),
    lose: [...was.keys()].filter((id) => !is.has(id)),
    change: [...is].filter(([id, item]) => was.has(id) && was.get(id) !== item).map(([id]) => id),
  };
}
