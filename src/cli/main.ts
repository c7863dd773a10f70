/** `mesh`: the control plane and the operator's commands. */
import { Command } from "commander";
import { registerDeclareCommand } from "./declare.js";
import { registerInstallCommand } from "./install.js";
import { registerLabCommand } from "./lab.js";
import { registerLeaseCommands } from "./lease.js";
import { registerNodeCommands } from "./node.js";
import { registerPlanCommands } from "./plan.js";
import { registerServeCommands } from "./up.js";
import { runProgram } from "../program/run.js";
import { registerTokenCommands } from "./token.js";
import { meshVersion } from "../program/version.js";
import { parseDuration } from "../config/duration.js";

export function meshProgram(): Command {
  const program = new Command("mesh")
    .description("control plane for a fleet of machines")
    .version(meshVersion(), "-V, --version")
    .option("--data <dir>", "the control plane's data dir (default: $MESH_HOME or .mesh)")
    .option("--store <url>", "sqlite:PATH or postgres://… (default: sqlite in the data dir)")
    .option("--out-of-touch-after <duration>", "silence after which a node is out of touch (default 45s)")
    .option(
      "--timeout <duration>",
      "how long a command waits for the broker before it gives up and exits 1 (default 10s; not up, serve, lab)",
      // Read as the flag is parsed: a bad duration is a usage error before any command runs.
      (text: string) => parseDuration(text, "--timeout"),
    );
  registerTokenCommands(program);
  registerNodeCommands(program);
  registerDeclareCommand(program);
  registerPlanCommands(program);
  registerServeCommands(program);
  registerLeaseCommands(program);
  registerLabCommand(program);
  registerInstallCommand(program);
  return program;
}

// No top-level await: the bundle is CommonJS, loaded with its code cache (bin/run-bundle.js).
void runProgram(meshProgram(), process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
