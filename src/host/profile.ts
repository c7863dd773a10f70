/** What the machine can be asked to do, as the node tells the control plane at enrolment. */
import { existsSync, statSync } from "node:fs";
import { arch, availableParallelism, hostname, platform, totalmem } from "node:os";
import { join } from "node:path";
import { UsageError } from "../errors.js";
import { enrolSchema } from "../link/index.js";
import type { Enrol } from "../link/index.js";

/** A machine's profile: the `profile` of an enrol message. */
export type MachineProfile = Enrol["profile"];

/** The label every profile carries, set from the machine itself. */
export const hostnameLabel = "hostname";

/** Drivers this agent has appliers for (the kinds of item `Agent`'s appliers take), on any machine. */
const drivers = ["file", "user", "group", "service"];

/**
 * The overlay is advertised only where WireGuard's tools are installed (`wg`, and `wireguard-go` where the kernel has
 * no WireGuard): a node that cannot bring a tunnel up is not put on the overlay.
 */
function canOverlay(): boolean {
  const onPath = (tool: string) =>
    (process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin")
      .split(":")
      .some((dir) => dir !== "" && isExecutable(join(dir, tool)));
  return onPath("wg") && (onPath("wireguard-go") || existsSync("/sys/module/wireguard"));
}

function isExecutable(path: string): boolean {
  const found = statSync(path, { throwIfNoEntry: false });
  return found !== undefined && found.isFile() && (found.mode & 0o111) !== 0;
}

// The contract's own label schema, so a label accepted here is one the control plane accepts.
const labelSchema = enrolSchema.shape.profile.shape.labels.unwrap();

/**
 * This machine's profile: cpu count, memory, OS, architecture and the drivers this agent supports. The operator's
 * `labels` are kept, and `hostname` is always the machine's own.
 */
export function machineProfile(labels: Readonly<Record<string, string>> = {}): MachineProfile {
  return {
    cpu: availableParallelism(),
    memory_mb: Math.floor(totalmem() / 1_048_576),
    os: platform(),
    arch: arch(),
    labels: { ...labels, [hostnameLabel]: hostname() },
    roles: [],
    drivers: canOverlay() ? [...drivers, "overlay"] : [...drivers],
  };
}

/**
 * Reads one `key=value` label as given on the command line. The value may itself contain '='.
 * @throws UsageError when there is no '=', the key is not a valid label key, the value is too long, or the key is
 *   `hostname` (which the machine sets).
 */
export function parseLabel(text: string): { key: string; value: string } {
  const split = text.indexOf("=");
  if (split < 0) throw new UsageError(`label ${JSON.stringify(text)}: expected key=value, e.g. zone=eu-west`);
  const key = text.slice(0, split);
  const value = text.slice(split + 1);
  const keyCheck = labelSchema.keyType.safeParse(key);
  if (!keyCheck.success) {
    throw new UsageError(`label ${JSON.stringify(text)}: ${firstMessage(keyCheck.error)}`, {
      cause: keyCheck.error,
    });
  }
  const valueCheck = labelSchema.valueType.safeParse(value);
  if (!valueCheck.success) {
    throw new UsageError(`label ${JSON.stringify(key)}: value refused: ${firstMessage(valueCheck.error)}`, {
      cause: valueCheck.error,
    });
  }
  if (key === hostnameLabel) {
    throw new UsageError(
      `label ${JSON.stringify(text)}: "${hostnameLabel}" is set from the machine's own name`,
    );
  }
  return { key, value };
}

function firstMessage(error: { issues: readonly { message: string }[] }): string {
  return error.issues[0]?.message ?? "not accepted";
}
