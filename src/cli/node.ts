/** `mesh node list`: which nodes are here, which are out of touch and for how long, which never spoke. */
import type { Command } from "commander";
import { describeLiveness, livenessOf } from "../control/liveness.js";
import type { GlobalFlags } from "./context.js";
import { optionsFrom, withStore } from "./context.js";
import { stdoutOutput } from "./output.js";

export function registerNodeCommands(program: Command): void {
  const node = program.command("node").description("the nodes of the mesh");

  node
    .command("list")
    .description("list nodes with their state and liveness")
    .option("--json", 'print [{"name","state","liveness","last_seen","out_of_touch_for_s"}]')
    .action(async (_flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const options = optionsFrom(globals);
      const now = new Date();
      const nodes = await withStore(options, (store) => store.nodes.list());
      const rows = nodes.map((n) => {
        const reading = livenessOf(n.lastSeen, now, options.outOfTouchAfterMs);
        return { node: n, reading };
      });
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(
          rows.map(({ node: n, reading }) => ({
            name: n.name,
            state: n.state,
            liveness: reading.liveness,
            last_seen: n.lastSeen,
            out_of_touch_for_s: reading.outOfTouchForS,
          })),
        );
        return;
      }
      out.table(
        ["NAME", "STATE", "LIVENESS", "LAST SEEN"],
        rows.map(({ node: n, reading }) => [n.name, n.state, describeLiveness(reading), n.lastSeen ?? "-"]),
      );
    });
}
