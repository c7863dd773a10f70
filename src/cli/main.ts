/** `mesh`: the control plane and the operator's commands. */
import { Command } from "commander";
import { registerDeclareCommand } from "./declare.js";
import { registerLabCommand } from "./lab.js";
import { registerLeaseCommands } from "./lease.js";
import { registerNodeCommands } from "./node.js";
import { registerServeCommands } from "./up.js";
import { runProgram } from "../program/run.js";
import { registerTokenCommands } from "./token.js";
import { meshVersion } from "../program/version.js";

export function meshProgram(): Command {
  const program = new Command("mesh")
    .description("control plane for a fleet of machines")
    .version(meshVersion(), "-V, --version")
    .option("--data <dir>", "the control plane's data dir (default: $MESH_HOME or .mesh)")
    .option("--store <url>", "sqlite:PATH or postgres://… (default: sqlite in the data dir)")
    .option("--out-of-touch-after <duration>", "silence after which a node is out of touch (default 45s)");
  registerTokenCommands(program);
  registerNodeCommands(program);
  registerDeclareCommand(program);
  registerServeCommands(program);
  registerLeaseCommands(program);
  registerLabCommand(program);
  return program;
}

process.exitCode = await runProgram(meshProgram(), process.argv.slice(2));
