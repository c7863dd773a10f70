/**
 * `mesh declare <node>… -f FILE`: what named nodes (or every node) should hold, kept in the plan as a pinned unit —
 * `pin-<node>` for one node, `pin-all` for `--all` — written by the same compare-and-set as `mesh plan apply`, so
 * the plan stays the one source of truth. Declaring again replaces the pin; the node holds its pins and the plan's
 * other units together.
 */
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { parseDeclarationFile } from "../control/declarations.js";
import { pinned } from "../control/plans.js";
import { MeshError, UsageError } from "../errors.js";
import { nodeNameProblem } from "../link/index.js";
import { stdoutOutput } from "../program/output.js";
import type { GlobalFlags } from "./context.js";
import { openRecordedControlSide, optionsFrom, withStore } from "./context.js";
import { applyPlanChange, waitForReports, waitTimeout } from "./rollout.js";

export function registerDeclareCommand(program: Command): void {
  program
    .command("declare")
    .description(
      "pin what nodes should hold into the plan (unit pin-<node>, or pin-all for --all): files, from YAML or JSON {files: [{path, content, mode?}]}",
    )
    .argument("[nodes...]", "the nodes' names (one or more)")
    .requiredOption("-f, --file <file>", "the declaration file (YAML or JSON)")
    .option("--all", "every enrolled node, and every node that enrols later")
    .option("--wait", "wait until each node sent a declaration has reported it, and print each one's outcome")
    .option("--json", 'print {"node","sequence","epoch"} (for several nodes, a list of them)')
    .action(
      async (nodes: string[], flags: { file: string; all?: boolean; wait?: boolean }, command: Command) => {
        const globals = command.optsWithGlobals<GlobalFlags>();
        if (flags.all === true && nodes.length > 0)
          throw new UsageError("give node names or --all, not both");
        if (flags.all !== true && nodes.length === 0)
          throw new UsageError("name a node (or several), or give --all");
        for (const node of nodes) {
          if (nodeNameProblem(node) !== undefined) throw new UsageError(`"${node}" is not a node name`);
        }
        let text: string;
        try {
          text = readFileSync(flags.file, "utf8");
        } catch (error) {
          throw new UsageError(`cannot read ${flags.file}: ${(error as Error).message}`, { cause: error });
        }
        const contents = parseDeclarationFile(text, flags.file);
        const options = optionsFrom({ ...globals, timeout: waitTimeout(globals.timeout, flags.wait) });
        const nothingDone = "nothing was declared";
        const side = await openRecordedControlSide(options, nothingDone);
        const out = stdoutOutput(globals.json === true);
        await withStore(options, async (store) => {
          const targets = flags.all === true ? await store.nodes.namesIn("enrolled") : [...new Set(nodes)];
          if (targets.length === 0) throw new MeshError("no_nodes", `no node is enrolled: ${nothingDone}`);
          // Named nodes must be enrolled ones; --all's are, as just read (the pin holds for whichever enrol later).
          if (flags.all !== true) {
            const standings = await store.nodes.standings(targets);
            const unknown = targets.filter((name) => !standings.has(name));
            if (unknown.length > 0)
              throw new MeshError("node_unknown", `no node named ${unknown.join(", ")}; ${nothingDone}`);
            const retired = targets.filter((name) => standings.get(name)?.state === "retired");
            if (retired.length > 0) {
              const which =
                retired.length === 1
                  ? `node ${retired.join("")} is retired`
                  : `retired: ${retired.join(", ")}`;
              throw new MeshError("node_retired", `${which}; ${nothingDone}`);
            }
          }
          const applied = await applyPlanChange(options, store, side, {
            make: ({ plan }) => pinned(plan, flags.all === true ? { all: true } : targets, contents),
            fileName: flags.file,
            nothingDone,
          });
          // Each node's declaration now: the one just sent, or the one it already held when nothing changed (as read
          // once the revision was sent; a fleet's worth of rows is not read twice).
          const latest = applied.latest ?? (await store.declarations.latestSent(targets));
          const shown = targets.map((node) => {
            const one = latest.get(node);
            return { node, sequence: one?.sequence ?? null, epoch: one?.epoch ?? null };
          });
          if (flags.wait === true) {
            await waitForReports(options, store, applied.sent, out);
            return;
          }
          const [only] = shown;
          if (out.json) {
            out.document(shown.length === 1 && flags.all !== true && only !== undefined ? only : shown);
            return;
          }
          const sentTo = new Set(applied.sent.map((one) => one.node));
          const files = `${contents.files.length} file(s)`;
          const revision = `plan revision ${applied.revision}`;
          for (const { node, sequence, epoch } of shown) {
            out.line(
              sequence === null
                ? `declared ${node}: ${files}, ${revision}; sent when the node enrols`
                : sentTo.has(node)
                  ? `declared ${node}: sequence ${sequence}, epoch ${epoch}, ${files}, ${revision}`
                  : `declared ${node}: unchanged, it holds sequence ${sequence}, ${files}, ${revision}`,
            );
          }
        }).finally(() => side.close());
      },
    );
}
