/**
 * Allot: which nodes each unit of the plan goes to, as a pure function of the plan and the fleet's profiles. It is
 * deterministic (the same plan and fleet give the same placements, whatever order either is listed in), stable (a
 * unit with a count ranks its candidates by rendezvous hashing of unit and node names, so a node joining or leaving
 * moves only the placements it must), and respects resources (a placement's request must fit what is left of its
 * node). What cannot be placed is a condition, for a person to read.
 */
import type { DeclaredItem, Plan, PlanUnit, Selector } from "../link/index.js";
import { parseDuration } from "../config/duration.js";
import { MeshError } from "../errors.js";
import { itemsDigest, itemsOfContents } from "../link/index.js";

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
 * Whether a node's agent can apply every kind of item the unit holds: each kind is a driver the agent advertises in
 * its profile (`file` for files, directories and links; `user`, `group`, `service`). A node that cannot is no match.
 */
export function canHold(unit: PlanUnit, node: FleetNode): boolean {
  const kinds = [
    ...(unit.files.length > 0 ? ["file"] : []),
    ...(unit.users.length > 0 ? ["user"] : []),
    ...(unit.groups.length > 0 ? ["group"] : []),
    ...(unit.services.length > 0 ? ["service"] : []),
  ];
  return kinds.every((kind) => node.profile.drivers.includes(kind));
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

/**
 * How long each node has been out of touch, in milliseconds (absent: here, or never heard). A unit with `move_after`
 * does not count a node out of touch that long among its candidates, so its placement moves elsewhere.
 */
export type Away = ReadonlyMap<string, number>;

/** Unit name → the nodes that hold it now (what they were last sent): a count unit stays where it stands. */
export type Held = ReadonlyMap<string, ReadonlySet<string>>;

/**
 * Places every unit. A unit with a count keeps the nodes that already hold it while they still match, fit and are
 * not away past its `move_after` — a node coming back does not pull a placement back from where it moved — and fills
 * the rest by rank.
 */
export function allot(
  plan: Plan,
  fleet: readonly FleetNode[],
  away: Away = new Map(),
  held: Held = new Map(),
): Allotment {
  const placed = new Map<string, readonly string[]>();
  const byName = new Map(fleet.map((node) => [node.name, node]));
  // A unit naming its nodes (a pin from `mesh declare`) looks only at those: ten thousand pins stay cheap.
  const candidatesOf = (selector: Selector | undefined): readonly FleetNode[] =>
    selector?.nodes === undefined
      ? fleet
      : [...new Set(selector.nodes)].flatMap((name) => {
          const node = byName.get(name);
          return node === undefined ? [] : [node];
        });
  const conditions: Condition[] = [];
  const left = new Map(
    fleet.map((node) => [node.name, { cpu: node.profile.cpu, memory_mb: node.profile.memory_mb }]),
  );
  // By name, so the order units are written in moves nothing; units on every match first: they take no capacity.
  const units = [...plan.units].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const unit of units.filter((one) => one.count === undefined)) {
    const nodes = candidatesOf(unit.where)
      .filter((node) => matches(unit.where, node) && canHold(unit, node))
      .map((node) => node.name);
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
  // Units with a count, in two passes: first every placement a node already holds keeps its room (so no unit takes
  // the room of another's standing placement), then the rest are filled by rank.
  const counted = units
    .filter((one) => one.count !== undefined)
    .map((unit) => {
      const moveAfterMs =
        unit.move_after === undefined ? undefined : parseDuration(unit.move_after, "move_after");
      const matching = candidatesOf(unit.where).filter(
        (node) => matches(unit.where, node) && canHold(unit, node),
      );
      const candidates = matching
        .filter((node) => moveAfterMs === undefined || (away.get(node.name) ?? 0) < moveAfterMs)
        .map((node) => ({ name: node.name, score: rendezvousScore(unit.name, node.name) }))
        .sort((a, b) => b.score - a.score || (a.name < b.name ? -1 : 1));
      return {
        unit,
        count: unit.count ?? 0,
        matching,
        candidates,
        chosen: [] as string[],
        taken: new Set<string>(),
        lacking: 0,
      };
    });
  const take = (entry: (typeof counted)[number], name: string): boolean => {
    const room = left.get(name);
    const cpu = entry.unit.resources?.cpu ?? 0;
    const memory = entry.unit.resources?.memory_mb ?? 0;
    if (room === undefined || room.cpu < cpu || room.memory_mb < memory) return false;
    room.cpu -= cpu;
    room.memory_mb -= memory;
    entry.chosen.push(name);
    entry.taken.add(name);
    return true;
  };
  for (const entry of counted) {
    const holders = held.get(entry.unit.name);
    if (holders === undefined) continue;
    for (const candidate of entry.candidates) {
      if (entry.chosen.length === entry.count) break;
      if (holders.has(candidate.name)) take(entry, candidate.name);
    }
  }
  for (const entry of counted) {
    const { unit, count, matching, candidates, chosen } = entry;
    for (const candidate of candidates) {
      if (chosen.length === count) break;
      if (entry.taken.has(candidate.name)) continue;
      if (!take(entry, candidate.name)) entry.lacking++;
    }
    placed.set(unit.name, [...chosen].sort());
    if (chosen.length < count)
      conditions.push(
        shortOf(
          unit,
          count,
          chosen.length,
          candidates.length,
          entry.lacking,
          matching.length - candidates.length,
        ),
      );
  }
  return { placed, conditions };
}

function shortOf(
  unit: PlanUnit,
  wanted: number,
  placed: number,
  matching: number,
  lacking: number,
  away: number,
): Condition {
  const head = `${unit.name}: ${wanted} wanted, ${placed} placed`;
  const request = Object.entries(unit.resources ?? {})
    .map(([name, value]) => `${name} ${value}`)
    .join(", ");
  const reason =
    lacking === 0
      ? `${head}: only ${matching} node${matching === 1 ? "" : "s"} match${matching === 1 ? "es" : ""}`
      : `${head}: ${matching} match, ${lacking} without room for ${request}`;
  const moved =
    away === 0
      ? ""
      : `; ${away} more match but ${away === 1 ? "is" : "are"} out of touch longer than ${unit.move_after ?? ""}`;
  return { unit: unit.name, wanted, placed, reason: reason + moved };
}

/** Two units that would put different items under one id on one node: the plan cannot be applied. */
export interface ItemConflict {
  node: string;
  id: string;
  units: [string, string];
}

/** What one node should hold, as composed from the units placed on it. */
export interface Composition {
  /** The units placed on the node, by name, sorted. */
  units: string[];
  /** Their items, in unit-name order, an item two units declare identically held once. */
  items: DeclaredItem[];
  /** `itemsDigest(items)`: what is compared with the digest last sent. */
  digest: string;
  conflicts: ItemConflict[];
}

/**
 * Composes what every node of the fleet should hold: each unit's items are made once, and nodes placed on the same
 * set of units share one composition (a fleet of ten thousand nodes usually has a handful of distinct ones). A node
 * with no unit composes to holding nothing. Conflicts are returned, not resolved: a plan with any is refused whole.
 */
export function composeFleet(
  plan: Plan,
  allotment: Allotment,
  nodes: readonly string[],
): Map<string, Composition> {
  const unitsOf = new Map<string, string[]>(nodes.map((node) => [node, []]));
  for (const name of [...allotment.placed.keys()].sort()) {
    for (const node of allotment.placed.get(name) ?? []) unitsOf.get(node)?.push(name);
  }
  const byName = new Map(plan.units.map((unit) => [unit.name, unit]));
  const itemsOfUnit = new Map<string, Array<{ item: DeclaredItem; text: string }>>();
  const itemsOf = (name: string) => {
    let items = itemsOfUnit.get(name);
    if (items === undefined) {
      const unit = byName.get(name);
      items = (unit === undefined ? [] : itemsOfContents(unit)).map((item) => ({
        item,
        text: JSON.stringify(item),
      }));
      itemsOfUnit.set(name, items);
    }
    return items;
  };
  const shared = new Map<
    string,
    Omit<Composition, "conflicts"> & { conflicts: Omit<ItemConflict, "node">[] }
  >();
  const compositions = new Map<string, Composition>();
  for (const node of nodes) {
    const units = unitsOf.get(node) ?? [];
    const key = units.join("\n");
    let composed = shared.get(key);
    if (composed === undefined) {
      const byId = new Map<string, { item: DeclaredItem; unit: string; text: string }>();
      const conflicts: Omit<ItemConflict, "node">[] = [];
      for (const unit of units) {
        for (const { item, text } of itemsOf(unit)) {
          const earlier = byId.get(item.id);
          if (earlier === undefined) byId.set(item.id, { item, unit, text });
          else if (earlier.text !== text) conflicts.push({ id: item.id, units: [earlier.unit, unit] });
        }
      }
      const items = [...byId.values()].map(({ item }) => item);
      composed = { units, items, digest: itemsDigest(items), conflicts };
      shared.set(key, composed);
    }
    compositions.set(node, {
      units: composed.units,
      items: composed.items,
      digest: composed.digest,
      conflicts: composed.conflicts.map((conflict) => ({ node, ...conflict })),
    });
  }
  return compositions;
}

/** What one node should hold: `composeFleet` for that node alone (what `mesh plan render` prints). */
export function composeFor(plan: Plan, allotment: Allotment, node: string): Composition {
  const composition = composeFleet(plan, allotment, [node]).get(node);
  if (composition === undefined) throw new MeshError("internal", `${node} was not composed`);
  return composition;
}
