/** `mesh declare <node> -f FILE`: what a node should hold, signed and sent to its queue. */
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { declareMany, parseDeclarationFile } from "../control/declarations.js";
import { MeshError, UsageError } from "../errors.js";
import { nodeNameProblem } from "../link/index.js";
import type { GlobalFlags } from "./context.js";
import {
  openRecordedControlSide,
  optionsFrom,
  signingIdentity,
  withCommandLease,
  withStore,
} from "./context.js";
import { stdoutOutput } from "../program/output.js";

export function registerDeclareCommand(program: Command): void {
  program
    .command("declare")
    .description(
      "declare what a node should hold: files, from YAML or JSON {files: [{path, content, mode?}]}",
    )
    .argument("[nodes...]", "the nodes' names (one or more)")
    .requiredOption("-f, --file <file>", "the declaration file (YAML or JSON)")
    .option("--all", "every enrolled node")
    .option("--json", 'print {"node","sequence","epoch"} (for several nodes, a list of them)')
    .action(async (nodes: string[], flags: { file: string; all?: boolean }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      if (flags.all === true && nodes.length > 0) throw new UsageError("give node names or --all, not both");
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
      const files = parseDeclarationFile(text, flags.file);
      const options = optionsFrom(globals);
      const side = await openRecordedControlSide(options, "nothing was declared");
      const signing = signingIdentity(options);
      const sent = await withStore(options, (store) =>
        // Under the holder's epoch, or a lease of its own: never as a second controller, never without an epoch.
        withCommandLease(
          options,
          store,
          { nothingDone: "nothing was declared", withoutLease: "refuse" },
          async ({ epoch, stillActing }) => {
            const targets = flags.all === true ? await store.nodes.namesIn("enrolled") : nodes;
            if (targets.length === 0)
              throw new MeshError("no_nodes", "no node is enrolled: nothing was declared");
            const context = { store, signing, bus: side.bus, now: () => new Date(), gate: stillActing };
            return declareMany(context, targets, files, epoch);
          },
          side,
        ),
      ).finally(() => side.close());
      const out = stdoutOutput(globals.json === true);
      const shown = sent.map(({ node, sequence, epoch }) => ({ node, sequence, epoch }));
      const [only] = shown;
      if (out.json) {
        out.document(shown.length === 1 && flags.all !== true && only !== undefined ? only : shown);
        return;
      }
      for (const { node, sequence, epoch } of shown) {
        out.line(`declared ${node}: sequence ${sequence}, epoch ${epoch}, ${files.length} file(s)`);
      }
    });
}
