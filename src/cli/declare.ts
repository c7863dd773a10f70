/** `mesh declare <node> -f FILE`: what a node should hold, signed and sent to its queue. */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import type { Command } from "commander";
import { declare, parseDeclarationFile } from "../control/declarations.js";
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
    .argument("<node>", "the node's name")
    .requiredOption("-f, --file <file>", "the declaration file (YAML or JSON)")
    .option("--json", 'print {"node","sequence","epoch"}')
    .action(async (node: string, flags: { file: string }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const problem = nodeNameProblem(node);
      if (problem !== undefined) throw new UsageError(`"${node}" is not a node name`);
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
          return await declare({ store, signing, bus: side.bus, now: () => new Date() }, node, files, epoch);
        } finally {
          await own?.release();
        }
      }).finally(() => side.close());
      const out = stdoutOutput(globals.json === true);
      if (out.json) out.document({ node: sent.node, sequence: sent.sequence, epoch: sent.epoch });
      else
        out.line(
          `declared ${sent.node}: sequence ${sent.sequence}, epoch ${sent.epoch}, ${files.length} file(s)`,
        );
    });
}
