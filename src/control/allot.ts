/**
 * Allot: which nodes each unit of the plan goes to, as a pure function of the plan and the fleet's profiles. It is
 * deterministic (the same plan and fleet give the same placements, whatever order either is listed in), stable (a
 * unit with a count ranks its candidates by rendezvous hashing of unit and node names, so a node joining or leaving
 * moves only the placements it must), and respects resources (a placement's request must fit what is left of its
 * node). What cannot be placed is a condition, for a person to read.
 */
import type { DeclaredItem, Plan, PlanUnit, Selector } from "../link/index.js";
import { fileItemsOf } from "../link/index.js";

/** A node as allot sees it: its name and the profile it sent at enrolment. */
export interface FleetNode {
  name: string;
  profile: {
    cpu: number;
    memory_mb: number;
    labels: Readonly<Record<string, string>>;
    drivers: readonly string[];
  };
}

/** A unit that could not be placed as asked: `web: 3 wanted, 2 placed: only 2 nodes match`. */
export interface Condition {
  unit: string;
  /** How many placements the unit asked for (`every` for a unit without a count). */
  wanted: number | "every";
  placed: number;
  reason: string;
}

export interface Allotment {
  /** Unit name → the nodes it is placed on, by name, sorted. */
  placed: ReadonlyMap<string, readonly string[]>;
  conditions: Condition[];
}

export function matches(selector: Selector | undefined, node: FleetNode): boolean {
  if (selector === undefined) return true;
  const { labels, drivers, cpu, memory_mb: memory, nodes } = selector;
  if (nodes !== undefined && !nodes.includes(node.name)) return false;
  if (cpu !== undefined && node.profile.cpu < cpu) return false;
  if (memory !== undefined && node.profile.memory_mb < memory) return false;
  if (drivers !== undefined && !drivers.every((driver) => node.profile.drivers.includes(driver)))
    return false;
  for (const [key, wanted] of Object.entries(labels ?? {})) {
    const value = Object.hasOwn(node.profile.labels, key) ? node.profile.labels[key] : undefined;
    if (value === undefined) return false;
    if (typeof wanted === "string" ? value !== wanted : !wanted.includes(value)) return false;
  }
  return true;
}

/**
 * A node's rank for a unit: a 32-bit hash of both names (FNV-1a, then a finaliser that spreads every input bit). It
 * depends on nothing else, which is what makes the choice stable as the fleet changes.
 */
export function rendezvousScore(unit: string, node: string): number {
  let hash = 0x811c9dc5;
  const text = `${unit}\u0000${node}`;
  for (let index = 0; index < text.length; index++) {
    hash ^= text.charCodeAt(index);
    hash = Math.imul(hash, 0x01000193);
  }
  hash ^= hash >>> 16;
  hash = Math.imul(hash, 0x85ebca6b);
  hash ^= hash >>> 13;
  hash = Math.imul(hash, 0xc2b2ae35);
  hash ^= hash >>> 16;
  return hash >>> 0;
}

export function allot(plan: Plan, fleet: readonly FleetNode[]): Allotment {
  const placed = new Map<string, readonly string[]>();
  const conditions: Condition[] = [];
  const left = new Map(
    fleet.map((node) => [node.name, { cpu: node.profile.cpu, memory_mb: node.profile.memory_mb }]),
  );
  // By name, so the order units are written in moves nothing; units on every match first: they take no capacity.
  const units = [...plan.units].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const unit of units.filter((one) => one.count === undefined)) {
    const nodes = fleet.filter((node) => matches(unit.where, node)).map((node) => node.name);
    placed.set(unit.name, nodes.sort());
    if (nodes.length === 0) {
      conditions.push({
        unit: unit.name,
        wanted: "every",
        placed: 0,
        reason: `${unit.name}: no node matches`,
      });
    }
  }
  for (const unit of units.filter((one) => one.count !== undefined)) {
    const count = unit.count ?? 0;
    const candidates = fleet
      .filter((node) => matches(unit.where, node))
      .map((node) => ({ name: node.name, score: rendezvousScore(unit.name, node.name) }))
      .sort((a, b) => b.score - a.score || (a.name < b.name ? -1 : 1));
    const chosen: string[] = [];
    let lacking = 0;
    for (const candidate of candidates) {
      if (chosen.length === count) break;
      const room = left.get(candidate.name);
      const cpu = unit.resources?.cpu ?? 0;
      const memory = unit.resources?.memory_mb ?? 0;
      if (room === undefined || room.cpu < cpu || room.memory_mb < memory) {
        lacking++;
        continue;
      }
      room.cpu -= cpu;
      room.memory_mb -= memory;
      chosen.push(candidate.name);
    }
    placed.set(unit.name, chosen.sort());
    if (chosen.length < count)
      conditions.push(shortOf(unit, count, chosen.length, candidates.length, lacking));
  }
  return { placed, conditions };
}

function shortOf(
  unit: PlanUnit,
  wanted: number,
  placed: number,
  matching: number,
  lacking: number,
): Condition {
  const head = `${unit.name}: ${wanted} wanted, ${placed} placed`;
  const request = Object.entries(unit.resources ?? {})
    .map(([name, value]) => `${name} ${value}`)
    .join(", ");
  const reason =
    lacking === 0
      ? `${head}: only ${matching} node${matching === 1 ? "" : "s"} match${matching === 1 ? "es" : ""}`
      : `${head}: ${matching} match, ${lacking} without room for ${request}`;
  return { unit: unit.name, wanted, placed, reason };
}

/** Two units that would put different items under one id on one node: the plan cannot be applied. */
export interface ItemConflict {
  node: string;
  id: string;
  units: [string, string];
}

/**
 * What one node should hold: the items of every unit placed on it, in unit-name order, an item two units declare
 * identically held once. Conflicts are returned, not resolved: a plan with any is refused whole.
 */
export function composeFor(
  plan: Plan,
  allotment: Allotment,
  node: string,
): { items: DeclaredItem[]; units: string[]; conflicts: ItemConflict[] } {
  const units = plan.units
    .filter((unit) => allotment.placed.get(unit.name)?.includes(node) === true)
    .sort((a, b) => (a.name < b.name ? -1 : 1));
  const byId = new Map<string, { item: DeclaredItem; unit: string; text: string }>();
  const conflicts: ItemConflict[] = [];
  for (const unit of units) {
    for (const item of fileItemsOf(unit.files)) {
      const text = JSON.stringify(item);
      const earlier = byId.get(item.id);
      if (earlier === undefined) byId.set(item.id, { item, unit: unit.name, text });
      else if (earlier.text !== text) conflicts.push({ node, id: item.id, units: [earlier.unit, unit.name] });
    }
  }
  return {
    items: [...byId.values()].map(({ item }) => item),
    units: units.map((unit) => unit.name),
    conflicts,
  };
}
