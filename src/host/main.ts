/** `mesh-host`: the agent on every node. */
import { Command } from "commander";
import { runProgram } from "../program/run.js";
import { meshVersion } from "../program/version.js";
import { registerBrokerCommand, registerHostCommands } from "./commands.js";
import { registerHostInstall } from "./install.js";
import { registerTokenShow } from "./token-show.js";

export function hostProgram(): Command {
  const program = new Command("mesh-host")
    .description("the mesh's agent on a node")
    .version(meshVersion(), "-V, --version");
  registerHostCommands(program);
  registerTokenShow(program);
  registerHostInstall(program);
  registerBrokerCommand(program);
  return program;
}

// No top-level await: the bundle is CommonJS, loaded with its code cache (bin/run-bundle.js).
void runProgram(hostProgram(), process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
