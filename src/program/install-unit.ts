/**
 * Writing a service unit and handing it to systemd: what `mesh install` and `mesh-host install` share. The unit is
 * enabled and started only where systemd runs (and systemctl is there); elsewhere — a container, a machine booted
 * by another init — it is written, and the person is told why nothing was started and what to run.
 */
import { execFileSync } from "node:child_process";
import {
  accessSync,
  constants,
  existsSync,
  mkdirSync,
  realpathSync,
  renameSync,
  writeFileSync,
} from "node:fs";
import { delimiter, join, resolve } from "node:path";
import { MeshError, UsageError } from "../errors.js";
import type { Output } from "./output.js";
import type { Executable } from "./service-unit.js";

/** Where units an administrator installs live (systemd reads it first). */
export const defaultUnitDir = "/etc/systemd/system";

export interface UnitInstall {
  /** The unit's file name, `mesh-host.service` say. */
  name: string;
  text: string;
  unitDir: string;
  /** Print the unit and write nothing. */
  dryRun: boolean;
}

/** The executable this process runs as: Node's absolute path and the script it was started with, links resolved. */
export function runningExecutable(): Executable {
  const script = process.argv[1];
  if (script === undefined || script === "") {
    throw new UsageError(
      "install runs from the installed mesh's bin/ script, which this process was not started with",
    );
  }
  return { node: process.execPath, script: realpathSync(script) };
}

export function installUnit(install: UnitInstall, out: Output): void {
  if (install.dryRun) {
    out.line(install.text.trimEnd());
    return;
  }
  const unitDir = resolve(install.unitDir);
  const path = join(unitDir, install.name);
  try {
    mkdirSync(unitDir, { recursive: true });
    // Written whole and then renamed into place: systemd never reads half a unit.
    const partial = `${path}.partial`;
    writeFileSync(partial, install.text, { mode: 0o644 });
    renameSync(partial, path);
  } catch (error) {
    throw new MeshError(
      "service_unit",
      `cannot write ${path}: ${(error as Error).message} (install as root, or choose --unit-dir)`,
      { cause: error },
    );
  }
  out.line(`wrote ${path}`);

  // A unit outside systemd's own directories is linked in by its path.
  const unit = unitDir === defaultUnitDir ? install.name : path;
  const commands = [["daemon-reload"], ["enable", "--now", unit]];
  const systemctl = onPath("systemctl");
  const notRunning =
    systemctl === undefined
      ? "systemctl is not installed here"
      : // sd_booted(3)'s own test: the directory exists only while systemd is PID 1.
        existsSync("/run/systemd/system")
        ? undefined
        : "systemd is not running here (PID 1 is another init, or this is a container)";
  if (systemctl === undefined || notRunning !== undefined) {
    out.line(`not started: ${notRunning}. Where systemd runs, start it with:`);
    for (const args of commands) out.line(`  systemctl ${args.join(" ")}`);
    return;
  }
  for (const args of commands) {
    try {
      execFileSync(systemctl, args, { stdio: "inherit" });
    } catch (error) {
      throw new MeshError("service_unit", `systemctl ${args.join(" ")} failed: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }
  out.line(`enabled and started ${install.name}`);
}

function onPath(command: string): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir === "") continue;
    const candidate = join(dir, command);
    if (isExecutable(candidate)) return candidate;
  }
  return undefined;
}

function isExecutable(path: string): boolean {
  if (!existsSync(path)) return false;
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch (error) {
    // Present but not ours to run: looked past, like a shell would.
    if ((error as NodeJS.ErrnoException).code === "EACCES") return false;
    throw error;
  }
}
