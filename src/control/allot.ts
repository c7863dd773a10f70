/**
 * Allot: which nodes each unit of the plan goes to, as a pure function of the plan and the fleet's profiles. It is
 * deterministic (the same plan and fleet give the same placements, whatever order either is listed in), stable (a
 * unit with a count ranks its candidates by rendezvous hashing of unit and node names, so a node joining or leaving
 * moves only the placements it must), and respects resources (a placement's request must fit what is left of its
 * node). What cannot be placed is a condition, for a person to read.
 */
import type { Plan, PlanUnit, Selector } from "../link/index.js";
import { parseDuration } from "../config/duration.js";

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
 * The nodes each unit's selector matches and that can hold it, in name order. The fleet is grouped once by all that
 * a selector of this plan can look at (CPUs, memory, drivers, and the values of the label keys some unit selects by)
 * and each unit is matched once per group rather than once per node: to a plan that selects by role and zone, ten
 * thousand nodes are a few dozen groups. A unit naming its nodes (a pin from `mesh declare`) looks only at those.
 */
export function matcher(plan: Plan, fleet: readonly FleetNode[]): (unit: PlanUnit) => FleetNode[] {
  const named = new Map(fleet.map((node) => [node.name, node]));
  const inOrder = [...fleet].sort(byName);
  const labelKeys = [...new Set(plan.units.flatMap((unit) => Object.keys(unit.where?.labels ?? {})))];
  /** Each group's first node, standing for all of it; and each node's group, by its place in `inOrder`. */
  const firsts: FleetNode[] = [];
  const groupOf: number[] = [];
  const groups = new Map<string, number>();
  for (const node of inOrder) {
    const { cpu, memory_mb: memory, drivers, labels } = node.profile;
    const seen = labelKeys.map((key) => (Object.hasOwn(labels, key) ? labels[key] : null));
    const key = JSON.stringify([cpu, memory, [...drivers].sort(), seen]);
    let group = groups.get(key);
    if (group === undefined) {
      group = firsts.length;
      groups.set(key, group);
      firsts.push(node);
    }
    groupOf.push(group);
  }
  return (unit) => {
    const fits = (node: FleetNode) => matches(unit.where, node) && canHold(unit, node);
    const names = unit.where?.nodes;
    if (names !== undefined) {
      return [...new Set(names)]
        .flatMap((name) => {
          const node = named.get(name);
          return node !== undefined && fits(node) ? [node] : [];
        })
        .sort(byName);
    }
    const matched = firsts.map(fits);
    return inOrder.filter((_, index) => matched[groupOf[index] ?? -1] === true);
  };
}

/** By name, as a string sort orders names: nodes, units. */
function byName(a: { name: string }, b: { name: string }): number {
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
}

/**
 * A node's rank for a unit: a 32-bit hash of both names (FNV-1a, then a finaliser that spreads every input bit). It
 * depends on nothing else, which is what makes the choice stable as the fleet changes.
 */
export function rendezvousScore(unit: string, node: string): number {
  return scorerFor(unit)(node);
}

/**
 * {@link rendezvousScore} for one unit and many nodes: the hash of the unit's name (and the separator) is taken once,
 * and each node's name continues from it.
 */
function scorerFor(unit: string): (node: string) => number {
  const prefix = fnv1a(0x811c9dc5, `${unit}\u0000`);
  return (node) => {
    let hash = fnv1a(prefix, node);
    hash ^= hash >>> 16;
    hash = Math.imul(hash, 0x85ebca6b);
    hash ^= hash >>> 13;
    hash = Math.imul(hash, 0xc2b2ae35);
    hash ^= hash >>> 16;
    return hash >>> 0;
  };
}

function fnv1a(start: number, text: string): number {
  let hash = start;
  for (let index = 0; index < text.length; index++) {
    hash ^= text.charCodeAt(index);
    hash = Math.imul(hash, 0x01000193);
  }
  return hash;
}

/** A candidate of a unit with a count, and its rank. */
export interface Ranked {
  name: string;
  score: number;
}

/** Whether `a` ranks before `b`: the higher score, then the name. */
function ranksBefore(a: Ranked, b: Ranked): boolean {
  return a.score !== b.score ? a.score > b.score : a.name < b.name;
}

/**
 * The candidates in rank order, ordered only as far as they are read: a unit placed 5 times among 10,000 candidates
 * reads a few of them.
 */
export function* inRankOrder(candidates: readonly Ranked[]): Generator<Ranked> {
  // A binary heap, best first.
  const heap = [...candidates];
  const sink = (from: number) => {
    for (let at = from; ;) {
      const left = 2 * at + 1;
      const right = left + 1;
      let best = at;
      if (left < heap.length && ranksBefore(heap[left] as Ranked, heap[best] as Ranked)) best = left;
      if (right < heap.length && ranksBefore(heap[right] as Ranked, heap[best] as Ranked)) best = right;
      if (best === at) return;
      [heap[at], heap[best]] = [heap[best] as Ranked, heap[at] as Ranked];
      at = best;
    }
  };
  for (let at = Math.floor(heap.length / 2) - 1; at >= 0; at--) sink(at);
  while (heap.length > 0) {
    const best = heap[0] as Ranked;
    const last = heap.pop() as Ranked;
    if (heap.length > 0) {
      heap[0] = last;
      sink(0);
    }
    yield best;
  }
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
  const matchingOf = matcher(plan, fleet);
  const conditions: Condition[] = [];
  const left = new Map(
    fleet.map((node) => [node.name, { cpu: node.profile.cpu, memory_mb: node.profile.memory_mb }]),
  );
  // By name, so the order units are written in moves nothing; units on every match first: they take no capacity.
  const units = [...plan.units].sort(byName);
  for (const unit of units.filter((one) => one.count === undefined)) {
    const nodes = matchingOf(unit).map((node) => node.name);
    placed.set(unit.name, nodes);
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
      const matching = matchingOf(unit);
      const score = scorerFor(unit.name);
      const candidates = matching
        .filter((node) => moveAfterMs === undefined || (away.get(node.name) ?? 0) < moveAfterMs)
        .map((node) => ({ name: node.name, score: score(node.name) }));
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
    for (const candidate of inRankOrder(entry.candidates.filter((one) => holders.has(one.name)))) {
      if (entry.chosen.length === entry.count) break;
      take(entry, candidate.name);
    }
  }
  for (const entry of counted) {
    const { unit, count, matching, candidates, chosen } = entry;
    for (const candidate of inRankOrder(candidates)) {
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
