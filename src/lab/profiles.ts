/**
 * `mesh lab --profiles FILE`: the profiles the lab's nodes join with, so a lab can look like a fleet of different
 * machines (web nodes with 4 CPUs, database nodes with 8) instead of N copies of the machine it runs on. The file is
 * a list of profile sets; each node gets one, the same one every time for the same node.
 */
import { isNode, LineCounter, parseDocument } from "yaml";
import { z } from "zod";
import { MeshError, UsageError } from "../errors.js";
import { hostnameLabel } from "../host/profile.js";
import type { MachineProfile } from "../host/profile.js";
import { enrolSchema, labelKey, word } from "../link/messages.js";

/** How many profile sets one file may hold, and the largest weight: enough for any lab, small enough for exact math. */
export const maxProfileSets = 1_000;
export const maxProfileWeight = 1_000;

/** The label every lab node carries, whatever its profile set says besides. */
export const labLabels: Readonly<Record<string, string>> = { lab: "true" };

// The contract's own label values, so a label accepted here is one the control plane accepts.
const labelValue = enrolSchema.shape.profile.shape.labels.unwrap().valueType;

/** One entry of the file: what the nodes given it claim; whatever it leaves out stays as the lab has it. */
export const profileSetSchema = z.strictObject({
  labels: z
    .record(labelKey, labelValue)
    .refine((labels) => !Object.hasOwn(labels, hostnameLabel), {
      error: `"${hostnameLabel}" is set from the machine's own name`,
    })
    .optional(),
  cpu: z
    .int({ error: "expected a whole number of CPUs" })
    .min(1, { error: "expected at least 1 CPU" })
    .optional(),
  memory_mb: z
    .int({ error: "expected a whole number of MiB" })
    .min(1, { error: "expected at least 1 MiB" })
    .optional(),
  drivers: z.array(word).optional(),
  weight: z
    .int({ error: "expected a whole number" })
    .min(1, { error: `expected a weight from 1 to ${maxProfileWeight}` })
    .max(maxProfileWeight, { error: `expected a weight from 1 to ${maxProfileWeight}` })
    .optional(),
});

export const profileFileSchema = z
  .array(profileSetSchema, { error: "expected a list of profile sets, e.g. [{labels: {role: web}, cpu: 4}]" })
  .min(1, { error: "the list is empty: give at least one profile set" })
  .max(maxProfileSets, { error: `expected at most ${maxProfileSets} profile sets` });

export type ProfileSet = z.infer<typeof profileSetSchema>;

/** What one lab node joins with: its labels and the machine facts it claims instead of this machine's. */
export interface LabJoinProfile {
  labels: Record<string, string>;
  simulated: Partial<Pick<MachineProfile, "cpu" | "memory_mb" | "drivers">>;
}

/**
 * Reads a profile file's text (YAML or JSON). Every refusal is a UsageError naming `fileName`, the line and the
 * entry, e.g. `profiles.yaml line 3, [1].cpu: expected at least 1 CPU`.
 */
export function parseProfileFile(text: string, fileName: string): ProfileSet[] {
  const lines = new LineCounter();
  const document = parseDocument(text, { lineCounter: lines, prettyErrors: false });
  const syntax = document.errors[0];
  if (syntax !== undefined) {
    const at = lines.linePos(syntax.pos[0]);
    throw new UsageError(`${fileName} line ${at.line}: is neither YAML nor JSON: ${syntax.message}`, {
      cause: syntax,
    });
  }
  const parsed = profileFileSchema.safeParse(document.toJS());
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  if (issue === undefined)
    throw new UsageError(`${fileName}: not a list of profile sets`, { cause: parsed.error });
  // An unknown key is named where it is written, not at the entry holding it.
  const path = issue.code === "unrecognized_keys" ? [...issue.path, ...issue.keys.slice(0, 1)] : issue.path;
  const node: unknown = path.length === 0 ? document.contents : document.getIn(path, true);
  const range = isNode(node) ? node.range : undefined;
  const line = range == null ? "" : ` line ${lines.linePos(range[0]).line}`;
  const place = path.length === 0 ? "" : `, ${renderPath(path)}`;
  // A record's bad key carries the key schema's own words inside it.
  const message = issue.code === "invalid_key" ? (issue.issues[0]?.message ?? issue.message) : issue.message;
  throw new UsageError(`${fileName}${line}${place}: ${message}`, { cause: parsed.error });
}

/** Renders a path as a person would write it: `[1].labels["app/tier"]`. */
function renderPath(path: readonly PropertyKey[]): string {
  return path
    .map((key) => {
      if (typeof key === "number") return `[${key}]`;
      const name = String(key);
      return /^[A-Za-z_][A-Za-z0-9_]*$/.test(name) ? `.${name}` : `[${JSON.stringify(name)}]`;
    })
    .join("")
    .replace(/^\./, "");
}

/**
 * Which profile set each of `nodes` nodes gets, by index, in node order. Without any weight, node i gets set
 * i mod n. With weights (a set without one weighs 1), every prefix of the nodes holds each set within 1 of its share
 * `prefix × weight / total`, so node i's set never depends on how many nodes follow it: a larger lab keeps the
 * smaller one's assignment.
 */
export function assignProfileSets(sets: readonly Pick<ProfileSet, "weight">[], nodes: number): number[] {
  if (sets.length === 0) throw new MeshError("internal", "no profile sets to assign");
  if (sets.every((set) => set.weight === undefined))
    return Array.from({ length: nodes }, (_, i) => i % sets.length);
  return weightedOrder(
    sets.map((set) => set.weight ?? 1),
    nodes,
  );
}

/**
 * The chairman assignment (Tijdeman 1980): at each step, among the sets still below their upper bound, the one
 * whose lower bound comes due first. It keeps every count within 1 − 1/(2(m−1)) of its share at every step, where
 * the simpler "largest deficit first" drifts past 1. Integer arithmetic throughout, so the order is exact: with
 * δ = 1/D, set i may be chosen at step t when t·wᵢ ≥ (cᵢ + δ)·W, and its next turn is due by (cᵢ + 1 − δ)·W / wᵢ.
 */
function weightedOrder(weights: readonly number[], nodes: number): number[] {
  const total = weights.reduce((sum, weight) => sum + weight, 0);
  const d = weights.length < 2 ? 2 : 2 * (weights.length - 1);
  const counts = weights.map(() => 0);
  const order: number[] = [];
  for (let step = 1; step <= nodes; step++) {
    let chosen = -1;
    let chosenDue = 0;
    let chosenWeight = 1;
    for (let i = 0; i < weights.length; i++) {
      const weight = weights[i] ?? 1;
      const count = counts[i] ?? 0;
      if (step * weight * d < (count * d + 1) * total) continue;
      // Due (count + 1 − δ)·W / weight: compared across sets by cross-multiplying, W and D cancel out.
      const due = (count + 1) * d - 1;
      if (chosen < 0 || due * chosenWeight < chosenDue * weight) {
        chosen = i;
        chosenDue = due;
        chosenWeight = weight;
      }
    }
    // The theorem says some set is always eligible; were it not so, the order would be wrong, not merely uneven.
    if (chosen < 0)
      throw new MeshError(
        "internal",
        `no profile set is eligible at node ${step} of weights ${weights.join(":")}`,
      );
    counts[chosen] = (counts[chosen] ?? 0) + 1;
    order.push(chosen);
  }
  return order;
}

/** The drivers of the lab's applier (`MemoryApplier`): files only. */
export const labDrivers = ["file"] as const;

/** What a node given `set` joins with: the lab's own label plus the set's, and the machine facts the set names. */
export function labJoinProfile(set: ProfileSet | undefined): LabJoinProfile {
  // A lab node holds files in memory and nothing else: it says so unless its set claims more.
  const simulated: LabJoinProfile["simulated"] = { drivers: [...labDrivers] };
  if (set?.cpu !== undefined) simulated.cpu = set.cpu;
  if (set?.memory_mb !== undefined) simulated.memory_mb = set.memory_mb;
  if (set?.drivers !== undefined) simulated.drivers = [...set.drivers];
  return { labels: { ...labLabels, ...set?.labels }, simulated };
}

/** Each of `nodes` nodes' join profile in node order: the lab's defaults when no profile sets are given. */
export function labJoinProfiles(sets: readonly ProfileSet[] | undefined, nodes: number): LabJoinProfile[] {
  if (sets === undefined) return Array.from({ length: nodes }, () => labJoinProfile(undefined));
  return assignProfileSets(sets, nodes).map((index) => labJoinProfile(sets[index]));
}
