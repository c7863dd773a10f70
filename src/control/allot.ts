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
 * Of what a unit holds, allot reads only this (whether each kind is empty): `AllotMemory` relies on it.
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
    const found: FleetNode[] = [];
    for (let index = 0; index < inOrder.length; index++) {
      const node = inOrder[index];
      if (node !== undefined && matched[groupOf[index] ?? -1] === true) found.push(node);
    }
    return found;
  };
}

/** Where `name` is in `names` (in name order, as `byName` orders them), or -1. */
function placeOf(names: readonly string[], name: string): number {
  let low = 0;
  let high = names.length - 1;
  while (low <= high) {
    const middle = (low + high) >>> 1;
    const found = names[middle] ?? "";
    if (found === name) return middle;
    if (found < name) low = middle + 1;
    else high = middle - 1;
  }
  return -1;
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

/**
 * Candidates in rank order (the higher score, then the name), ordered only as far as they are read: a unit placed 5
 * times among 10,000 candidates reads a few of them. The candidates are two arrays, their names and their scores at
 * the same places, and are given and answered as places: each call answers the place of the next best, or -1 when
 * none is left (`among`: only these places). A fleet's count units rank tens of thousands of candidates in all; as
 * numbers in a binary heap, best first, they are ranked without an object for each.
 */
export function rankOrder(
  names: readonly string[],
  scores: Uint32Array,
  among?: readonly number[],
): () => number {
  // Filled by a loop: `Int32Array.from` over an iterator of 10,000 places cost as much as ranking them.
  const heap = new Int32Array(among?.length ?? names.length);
  for (let at = 0; at < heap.length; at++) heap[at] = among === undefined ? at : (among[at] ?? 0);
  let size = heap.length;
  const before = (a: number, b: number) => {
    const scoreA = scores[a] ?? 0;
    const scoreB = scores[b] ?? 0;
    return scoreA !== scoreB ? scoreA > scoreB : (names[a] ?? "") < (names[b] ?? "");
  };
  const sink = (from: number) => {
    let at = from;
    const moving = heap[at] ?? 0;
    for (;;) {
      const left = 2 * at + 1;
      if (left >= size) break;
      const right = left + 1;
      const child = right < size && before(heap[right] ?? 0, heap[left] ?? 0) ? right : left;
      if (!before(heap[child] ?? 0, moving)) break;
      heap[at] = heap[child] ?? 0;
      at = child;
    }
    heap[at] = moving;
  };
  for (let at = Math.floor(size / 2) - 1; at >= 0; at--) sink(at);
  return () => {
    if (size === 0) return -1;
    const best = heap[0] ?? -1;
    size--;
    if (size > 0) {
      heap[0] = heap[size] ?? 0;
      sink(0);
    }
    return best;
  };
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
      const names: string[] = [];
      for (const node of matching) {
        if (moveAfterMs === undefined || (away.get(node.name) ?? 0) < moveAfterMs) names.push(node.name);
      }
      const scores = new Uint32Array(names.length);
      for (let at = 0; at < names.length; at++) scores[at] = score(names[at] ?? "");
      return {
        unit,
        count: unit.count ?? 0,
        matching,
        candidates: { names, scores },
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
    const { names, scores } = entry.candidates;
    // Each holder found among the candidates (in name order) by halving: a unit is held by a few of thousands.
    const holding: number[] = [];
    for (const holder of holders) {
      const at = placeOf(names, holder);
      if (at >= 0) holding.push(at);
    }
    const next = rankOrder(names, scores, holding);
    for (let at = next(); at >= 0 && entry.chosen.length < entry.count; at = next())
      take(entry, names[at] ?? "");
  }
  for (const entry of counted) {
    const { unit, count, matching, candidates, chosen } = entry;
    const { names, scores } = candidates;
    const next = rankOrder(names, scores);
    for (let at = next(); at >= 0 && chosen.length < count; at = next()) {
      const name = names[at] ?? "";
      if (entry.taken.has(name)) continue;
      if (!take(entry, name)) entry.lacking++;
    }
    placed.set(unit.name, [...chosen].sort());
    if (chosen.length < count)
      conditions.push(
        shortOf(unit, count, chosen.length, names.length, entry.lacking, matching.length - names.length),
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
