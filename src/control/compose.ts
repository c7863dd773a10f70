/**
 * Compose: what each node should hold, from the units allot placed on it. Each unit's items are made once, and nodes
 * placed on the same set of units share one composition.
 */
import type { DeclaredItem, Plan } from "../link/index.js";
import { MeshError } from "../errors.js";
import { itemsOfContents, itemsTextDigest } from "../link/index.js";
import type { Allotment } from "./allot.js";

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
  const { groups, groupOf } = groupingOf(allotment, nodes);
  const byName = new Map(plan.units.map((unit) => [unit.name, unit]));
  const itemsOfUnit = new Map<string, Array<{ item: DeclaredItem; text: string }>>();
  const itemsOf = (name: string) => {
    let items = itemsOfUnit.get(name);
    if (items === undefined) {
      const unit = byName.get(name);
      items = unit === undefined ? [] : itemsWithTexts(unit);
      itemsOfUnit.set(name, items);
    }
    return items;
  };
  const composed = groups.map((units) => composeUnits(units, itemsOf));
  const compositions = new Map<string, Composition>();
  for (let at = 0; at < nodes.length; at++) {
    const node = nodes[at] ?? "";
    const group = composed[groupOf[at] ?? -1];
    if (group === undefined) throw new MeshError("internal", `${node} was not grouped`);
    // Nodes whose composition holds no conflict share one object for it (nothing changes a composition once made).
    compositions.set(
      node,
      group.conflicts.length === 0
        ? group.clean
        : { ...group.clean, conflicts: group.conflicts.map((conflict) => ({ node, ...conflict })) },
    );
  }
  return compositions;
}

/** The fleet's nodes grouped by the set of units placed on them: `groups[groupOf[i]]` are those of `nodes[i]`. */
interface Grouping {
  nodes: readonly string[];
  /** Each group's units, by name, sorted. */
  groups: string[][];
  groupOf: Uint32Array;
}

/**
 * The grouping of each allotment composed lately, by the allotment: a plan change that moves no unit keeps its
 * allotment (`AllotMemory`), and its nodes fall into the same groups whatever the units hold.
 */
const groupings = new WeakMap<Allotment, Grouping>();

function groupingOf(allotment: Allotment, nodes: readonly string[]): Grouping {
  const known = groupings.get(allotment);
  if (known !== undefined && sameNames(known.nodes, nodes)) return known;
  const unitsOf = new Map<string, string[]>(nodes.map((node) => [node, []]));
  for (const name of [...allotment.placed.keys()].sort()) {
    for (const node of allotment.placed.get(name) ?? []) unitsOf.get(node)?.push(name);
  }
  const groups: string[][] = [];
  const groupOf = new Uint32Array(nodes.length);
  const keys = new Map<string, number>();
  nodes.forEach((node, at) => {
    const units = unitsOf.get(node) ?? [];
    const key = units.join("\n");
    let group = keys.get(key);
    if (group === undefined) {
      group = groups.length;
      keys.set(key, group);
      groups.push(units);
    }
    groupOf[at] = group;
  });
  const grouping = { nodes: [...nodes], groups, groupOf };
  groupings.set(allotment, grouping);
  return grouping;
}

function sameNames(before: readonly string[], now: readonly string[]): boolean {
  return before.length === now.length && before.every((name, at) => name === now[at]);
}

/** One set of units composed: its items in unit-name order, each id once, and where two units clash over one. */
function composeUnits(
  units: string[],
  itemsOf: (unit: string) => ReadonlyArray<{ item: DeclaredItem; text: string }>,
): { clean: Composition; conflicts: Omit<ItemConflict, "node">[] } {
  const byId = new Map<string, { item: DeclaredItem; unit: string; text: string }>();
  const conflicts: Omit<ItemConflict, "node">[] = [];
  for (const unit of units) {
    for (const { item, text } of itemsOf(unit)) {
      const earlier = byId.get(item.id);
      if (earlier === undefined) byId.set(item.id, { item, unit, text });
      else if (earlier.text !== text) conflicts.push({ id: item.id, units: [earlier.unit, unit] });
    }
  }
  const kept = [...byId.values()];
  // Each item's text is its JSON: the items' JSON is theirs end to end, and `itemsDigest` digests that.
  return {
    clean: {
      units,
      items: kept.map(({ item }) => item),
      digest: itemsTextDigest(`[${kept.map(({ text }) => text).join(",")}]`),
      conflicts: [],
    },
    conflicts,
  };
}

/** What one node should hold: `composeFleet` for that node alone (what `mesh plan render` prints). */
export function composeFor(plan: Plan, allotment: Allotment, node: string): Composition {
  const composition = composeFleet(plan, allotment, [node]).get(node);
  if (composition === undefined) throw new MeshError("internal", `${node} was not composed`);
  return composition;
}

/** A unit's items, each with the text two items under one id are compared by: equal texts are one item held once. */
function itemsWithTexts(unit: Plan["units"][number]): Array<{ item: DeclaredItem; text: string }> {
  return itemsOfContents(unit).map((item) => ({ item, text: JSON.stringify(item) }));
}

/**
 * Whether the plan declares some item id twice, differently (in two units, or twice in one): only then can a node's
 * composition hold a conflict, whatever the fleet. A plan that does not is not composed for the whole fleet just to
 * find none (`mesh declare --all` to 10,000 nodes read and composed the fleet for that, a third of a second before
 * it could write anything).
 */
export function mayConflict(plan: Plan): boolean {
  const texts = new Map<string, string>();
  for (const unit of plan.units) {
    for (const { item, text } of itemsWithTexts(unit)) {
      const earlier = texts.get(item.id);
      if (earlier === undefined) texts.set(item.id, text);
      else if (earlier !== text) return true;
    }
  }
  return false;
}
