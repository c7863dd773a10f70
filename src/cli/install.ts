/**
 * `mesh install`: the control plane as a systemd service, run the way the operator runs it — `mesh up` with its own
 * nats-server, or `mesh serve --broker URL` on a broker that runs already — from a data dir of its own.
 */
import { resolve } from "node:path";
import type { Command } from "commander";
import { brokerKindOf } from "../bus/index.js";
import { defaultUnitDir, installUnit, runningExecutable } from "../program/install-unit.js";
import { stdoutOutput } from "../program/output.js";
import { meshUnit, unitNames } from "../program/service-unit.js";
import type { GlobalFlags } from "./context.js";

/** A service's data dir when none is given: the unit's StateDirectory, which systemd makes and keeps. */
const serviceDataDir = "/var/lib/mesh";

export function registerInstallCommand(program: Command): void {
  program
    .command("install")
    .description(
      "install mesh.service: the control plane at every boot (mesh up, or mesh serve --broker URL), restarted on failure; its data dir is --data, else /var/lib/mesh",
    )
    .option("--broker <url>", "run `mesh serve --broker URL` (default: `mesh up` with its own nats-server)")
    .option("--unit-dir <dir>", "where the unit is written", defaultUnitDir)
    .option("--dry-run", "print the unit and write nothing")
    .action((flags: { broker?: string; unitDir: string; dryRun?: boolean }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      // A bad URL is bad usage now, not a service that fails at every boot.
      if (flags.broker !== undefined) brokerKindOf(flags.broker);
      const text = meshUnit({
        ...runningExecutable(),
        dataDir: resolve(globals.data ?? serviceDataDir),
        broker: flags.broker,
        store: globals.store,
      });
      installUnit(
        { name: unitNames.mesh, text, unitDir: flags.unitDir, dryRun: flags.dryRun === true },
        stdoutOutput(false),
      );
    });
}
