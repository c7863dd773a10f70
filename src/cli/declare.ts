/** `mesh declare <node> -f FILE`: what a node should hold, signed and sent to its queue. */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import type { Command } from "commander";
import { declareMany, parseDeclarationFile } from "../control/declarations.js";
import { MeshError, UsageError } from "../errors.js";
import { nodeNameProblem } from "../link/index.js";
import { createLogger } from "../log.js";
import { LeaseHolder } from "../lease/holder.js";
import { epochOf } from "../lease/lease.js";
import type { GlobalFlags } from "./context.js";
import { openRecordedControlSide, optionsFrom, signingIdentity, withStore } from "./context.js";
import { stdoutOutput } from "./output.js";

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
      const side = await openRecordedControlSide(options);
      const signing = signingIdentity(options);
      const sent = await withStore(options, async (store) => {
        // A command that acts does so under the lease: the holder's epoch, or a lease of its own when nobody
        // holds one. It never writes as a second controller.
        const backend = await side.lease(options.lease.ttlMs, store);
        const current = await backend.read();
        let own: LeaseHolder | undefined;
        let epoch: number;
        if (current !== undefined) {
          epoch = epochOf(current);
        } else {
          own = new LeaseHolder({
            backend,
            epochs: store.epochs,
            timings: options.lease,
            holder: {
              id: randomUUID(),
              host: hostname(),
              pid: process.pid,
              taken_at: new Date().toISOString(),
            },
            log: createLogger({ level: "warn" }),
          });
          const taken = await own.tryTake().catch((error: unknown) => {
            throw new MeshError(
              "no_lease",
              `nobody holds the lease and this command could not take one (${(error as Error).message}); nothing was declared`,
              { cause: error },
            );
          });
          if (!taken || own.epoch === undefined) {
            throw new MeshError("lease_busy", "the lease changed hands while declaring; try again");
          }
          epoch = own.epoch;
        }
        try {
          const targets = flags.all === true ? await store.nodes.namesIn("enrolled") : nodes;
          if (targets.length === 0)
            throw new MeshError("no_nodes", "no node is enrolled: nothing was declared");
          const holder = own;
          // Before each chunk: its own lease still renewed, or the holder's lease still at the epoch taken above.
          const gate =
            holder !== undefined
              ? () => holder.canAct()
              : async () => {
                  const now = await backend.read();
                  return now !== undefined && epochOf(now) === epoch;
                };
          return await declareMany(
            { store, signing, bus: side.bus, now: () => new Date(), gate },
            targets,
            files,
            epoch,
          );
        } finally {
          await own?.release();
        }
      }).finally(() => side.close());
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
