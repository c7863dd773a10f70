/** `systemd-analyze verify` on a unit file, as systemd would read it (nothing boots systemd for it). */
import { spawnSync } from "node:child_process";
import { basename } from "node:path";

export interface Verified {
  status: number | null;
  /** The lines of stderr about this unit: an unknown setting, a value it cannot parse, a command it cannot run. */
  aboutUnit: string[];
  /** All of stderr, for a failing assertion's message. */
  stderr: string;
}

export function verifyUnit(unit: string): Verified {
  const result = spawnSync("systemd-analyze", ["verify", unit], { encoding: "utf8" });
  if (result.error !== undefined) {
    throw new Error(
      `cannot run systemd-analyze (bash scripts/services.sh installs it): ${result.error.message}`,
      {
        cause: result.error,
      },
    );
  }
  // It exits 0 on an unknown key or a bad value and only says so on stderr; it may also speak of units the machine
  // has (the targets named in After= or WantedBy=), which are not this unit's fault.
  const name = basename(unit);
  return {
    status: result.status,
    aboutUnit: result.stderr.split("\n").filter((line) => line.includes(name)),
    stderr: result.stderr,
  };
}
