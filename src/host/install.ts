/**
 * `mesh-host install`: the agent as a systemd service, `mesh-host run` from its state dir at every boot with no
 * person and no token. Restarted on failure, but not once the broker refused the node's identity (exit 3).
 */
import { existsSync, mkdirSync } from "node:fs";
import { resolve } from "node:path";
import type { Command } from "commander";
import { MeshError } from "../errors.js";
import { defaultUnitDir, installUnit, runningExecutable } from "../program/install-unit.js";
import { stdoutOutput } from "../program/output.js";
import { hostUnit, unitNames } from "../program/service-unit.js";
import { runRoot } from "./commands.js";
import { HostState, resolveStateDir } from "./state.js";

export function registerHostInstall(program: Command): void {
  program
    .command("install")
    .description("install mesh-host.service: `mesh-host run` at every boot, restarted on failure")
    .option("--state <dir>", "the agent's state dir, as given to join")
    .option("--root <dir>", "where declared files are written (default: as given to join, else /)")
    .option("--unit-dir <dir>", "where the unit is written", defaultUnitDir)
    .option("--dry-run", "print the unit and write nothing")
    .action((flags: { state?: string; root?: string; unitDir: string; dryRun?: boolean }) => {
      const stateDir = resolveStateDir(flags.state);
      const state = new HostState(stateDir);
      // A service that cannot run restarts for nothing: the identity it will run as must be there first.
      if (state.loadIdentity() === undefined) {
        throw new MeshError(
          "not_joined",
          `this machine has not joined a mesh (no identity in ${stateDir}): run mesh-host join <token> --state ${stateDir} first`,
        );
      }
      const root = resolve(runRoot(state, flags.root));
      const text = hostUnit({ ...runningExecutable(), stateDir, root });
      const dryRun = flags.dryRun === true;
      // The unit makes the root writable by name, and systemd refuses to start a unit whose path is missing.
      if (!dryRun && !existsSync(root)) mkdirSync(root, { recursive: true });
      installUnit(
        { name: unitNames["mesh-host"], text, unitDir: flags.unitDir, dryRun },
        stdoutOutput(false),
      );
    });
}
