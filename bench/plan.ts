/**
 * The plan part's fleet and plan, and its in-process figure: allot + compose (`outlookOf`, what the acting control
 * plane runs on every roll-out) for a fleet of varied profiles and a plan of 100 units, timed in CPU. The same
 * profile sets are given to the lab and the same plan is applied on the mesh (bench/plan-mesh.ts), so the figures
 * of both halves are of one fleet and one plan.
 */
import type { FleetNode } from "../src/control/allot.js";
import { allot } from "../src/control/allot.js";
import { outlookOf, parsePlanFile } from "../src/control/plans.js";
import { labNodeName } from "../src/lab/options.js";
import type { ProfileSet } from "../src/lab/profiles.js";
import { labJoinProfiles } from "../src/lab/profiles.js";
import type { Plan } from "../src/link/index.js";
import { declarationEncoder } from "../src/link/index.js";

const roles = [
  // The weights make db exactly a tenth of the fleet (within one node per set): the unit changed on the mesh.
  { role: "web", weight: 4, cpu: 4, memory_mb: 8_192 },
  { role: "worker", weight: 3, cpu: 16, memory_mb: 65_536 },
  { role: "db", weight: 1, cpu: 8, memory_mb: 32_768 },
  { role: "cache", weight: 1, cpu: 4, memory_mb: 16_384 },
  { role: "edge", weight: 1, cpu: 2, memory_mb: 4_096 },
] as const;
const zones = ["a", "b", "c", "d"] as const;
const tiers = ["gold", "silver", "bronze"] as const;

/** The unit whose contents the mesh half changes: on every `role: db` node, a tenth of the fleet. */
export const changedUnit = "role-db";

/** Every role × zone × tier as a profile set (60), weighted by role; gold machines have twice the CPUs. */
export function benchProfileSets(): ProfileSet[] {
  return roles.flatMap(({ role, weight, cpu, memory_mb }) =>
    zones.flatMap((zone) =>
      tiers.map((tier) => ({
        labels: { role, zone, tier },
        cpu: tier === "gold" ? cpu * 2 : cpu,
        memory_mb,
        weight,
      })),
    ),
  );
}

/** The fleet as allot sees it once the lab's nodes (`prefix-0001`, …) have enrolled with `benchProfileSets()`. */
export function benchFleet(names: readonly string[]): FleetNode[] {
  const profiles = labJoinProfiles(benchProfileSets(), names.length);
  return names.map((name, i) => {
    const profile = profiles[i];
    if (profile === undefined) throw new Error(`${name} has no profile`);
    return {
      name,
      profile: {
        cpu: profile.simulated.cpu ?? 1,
        memory_mb: profile.simulated.memory_mb ?? 1,
        labels: profile.labels,
        drivers: profile.simulated.drivers ?? [],
      },
    };
  });
}

export function labNames(prefix: string, nodes: number): string[] {
  return Array.from({ length: nodes }, (_, i) => labNodeName(prefix, i + 1, nodes));
}

/**
 * A plan of 100 units for a fleet of these nodes: 55 on every match (the whole fleet, by role, zone, tier, their
 * pairs, label lists, CPU and memory floors), 40 with a count (sized to the fleet) and resources, 5 naming nodes.
 * Each unit holds one file of its own, so no two units conflict. `changed` rewrites `role-db`'s file; `commonRound`
 * rewrites the file of the unit every node holds (a change that touches the whole fleet).
 */
export function benchPlan(
  names: readonly string[],
  { changed = false, commonRound = 1 }: { changed?: boolean; commonRound?: number } = {},
): Plan {
  const units: Array<Record<string, unknown>> = [];
  const unit = (name: string, rest: Record<string, unknown> = {}) => {
    const round = name === "common" ? commonRound : changed && name === changedUnit ? 2 : 1;
    units.push({
      name,
      ...rest,
      files: [{ path: `/etc/bench-plan/${name}.conf`, content: `${name}, round ${round}\n`, mode: "0644" }],
    });
  };
  unit("common");
  for (const { role } of roles) unit(`role-${role}`, { where: { labels: { role } } });
  for (const zone of zones) unit(`zone-${zone}`, { where: { labels: { zone } } });
  for (const tier of tiers) unit(`tier-${tier}`, { where: { labels: { tier } } });
  for (const { role } of roles)
    for (const zone of zones) unit(`${role}-${zone}`, { where: { labels: { role, zone } } });
  for (const { role } of roles)
    for (const tier of tiers) unit(`${role}-${tier}`, { where: { labels: { role, tier } } });
  for (const zone of zones) unit(`front-${zone}`, { where: { labels: { role: ["web", "edge"], zone } } });
  unit("big-cpu", { where: { cpu: 16 } });
  unit("big-memory", { where: { memory_mb: 32_768 } });
  unit("big-gold", { where: { cpu: 16, labels: { tier: "gold" } } });
  const shares = [0.0005, 0.002, 0.005, 0.01, 0.03];
  for (let i = 0; i < 40; i++) {
    const wheres = [
      undefined,
      { labels: { role: "worker" } },
      { labels: { zone: zones[i % 4] } },
      { cpu: 8 },
    ];
    unit(`svc-${String(i).padStart(2, "0")}`, {
      ...(wheres[i % 4] === undefined ? {} : { where: wheres[i % 4] }),
      count: Math.max(1, Math.round((shares[i % 5] ?? 0.001) * names.length)),
      resources: { cpu: [0.5, 1, 2][i % 3], memory_mb: [256, 512, 1_024][i % 3] },
      ...(i === 7 || i === 23 ? { move_after: "1h" } : {}),
    });
  }
  for (let k = 0; k < 5; k++) {
    const picked = Array.from(
      { length: 5 + k * 3 },
      (_, j) => names[(k * 7_919 + j * 997) % names.length] ?? "",
    );
    unit(`pinned-${k}`, { where: { nodes: [...new Set(picked)] } });
  }
  // Through the CLI's own reading: the plan timed here is exactly one `mesh plan apply` accepts.
  return parsePlanFile(JSON.stringify({ units }), "the bench's plan");
}

export interface OutlookTiming {
  nodes: number;
  units: number;
  runs: number;
  /** CPU (user + system) of each run of `outlookOf`, in ms. */
  cpuMs: number[];
  wallMs: number[];
  /** CPU of `allot` alone, each run. */
  allotCpuMs: number[];
  distinctCompositions: number;
  placements: number;
  conditions: number;
}

/** Times `outlookOf` (allot + compose) for a fleet of `nodes` nodes, `runs` times, in this process. */
export function timeOutlook(nodes: number, runs: number): OutlookTiming {
  const names = labNames("bench", nodes);
  const fleet = { nodes: benchFleet(names), away: new Map<string, number>() };
  const plan = benchPlan(names);
  const cpuMs: number[] = [];
  const wallMs: number[] = [];
  const allotCpuMs: number[] = [];
  let outlook: ReturnType<typeof outlookOf> | undefined;
  for (let run = 0; run < runs; run++) {
    const cpu = process.cpuUsage();
    const started = performance.now();
    outlook = outlookOf(plan, fleet);
    wallMs.push(performance.now() - started);
    const used = process.cpuUsage(cpu);
    cpuMs.push((used.user + used.system) / 1000);
    // Allot alone in the same run, so a busy moment of a shared machine weighs on both alike.
    const allotCpu = process.cpuUsage();
    allot(plan, fleet.nodes, fleet.away);
    const allotUsed = process.cpuUsage(allotCpu);
    allotCpuMs.push((allotUsed.user + allotUsed.system) / 1000);
  }
  if (outlook === undefined) throw new Error("outlookOf was not run");
  return {
    nodes,
    units: plan.units.length,
    runs,
    cpuMs,
    wallMs,
    allotCpuMs,
    distinctCompositions: new Set([...outlook.compositions.values()].map((c) => c.units.join("\n"))).size,
    placements: [...outlook.allotment.placed.values()].reduce((sum, placed) => sum + placed.length, 0),
    conditions: outlook.conditions.length,
  };
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)] ?? Number.NaN;
}

/**
 * The bytes of a declaration such as a roll-out of the bench's plan sends these nodes: the median in length over the
 * nodes. One core's signing rate over these is that roll-out's physical limit. Its declarations are several times
 * the length of `mesh declare --all`'s, and Ed25519 hashes what it signs twice.
 */
export function planDeclarationBytes(names: readonly string[]): Uint8Array {
  const { compositions } = outlookOf(benchPlan(names), { nodes: benchFleet(names), away: new Map() });
  const issuedAt = new Date().toISOString();
  // One declaration per composition (its nodes' names are of one length), and each node's in its place.
  const byDigest = new Map<string, Uint8Array>();
  const each = [...compositions].map(([node, composition]) => {
    let bytes = byDigest.get(composition.digest);
    if (bytes === undefined) {
      bytes = declarationEncoder(
        composition.items,
        composition.digest,
      )({
        node,
        epoch: 1,
        sequence: 1,
        issued_at: issuedAt,
      });
      byDigest.set(composition.digest, bytes);
    }
    return bytes;
  });
  const median = each.sort((a, b) => a.byteLength - b.byteLength)[Math.floor((each.length - 1) / 2)];
  if (median === undefined) throw new Error("the bench's plan composes nothing for an empty fleet");
  return median;
}
