import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { parse as parseYaml } from "yaml";
import type { FleetNode } from "../../src/control/allot.js";
import { allot, canHold, matcher, matches, rankOrder, rendezvousScore } from "../../src/control/allot.js";
import { composeFor } from "../../src/control/compose.js";
import type { Plan } from "../../src/link/index.js";
import { planSchema } from "../../src/link/index.js";

const node = (name: string, labels: Record<string, string> = {}, cpu = 4, memory_mb = 8192): FleetNode => ({
  name,
  profile: { cpu, memory_mb, labels, drivers: ["file"] },
});

const plan = (units: unknown[]): Plan => planSchema.parse({ units });

test("plan — the contract's first example parses as written", () => {
  const text = `
units:
  - name: motd                 # no selector, no count: every enrolled node
    files:
      - {path: /etc/motd, content: "managed by the mesh\\n"}
  - name: web
    where: {labels: {role: web}}
    count: 3                   # three distinct nodes labelled role=web
    files:
      - {path: /etc/web.conf, content: "port 8080\\n"}
`;
  const parsed = planSchema.parse(parseYaml(text));
  assert.deepEqual(
    parsed.units.map((unit) => [unit.name, unit.count ?? null, unit.files.length]),
    [
      ["motd", null, 1],
      ["web", 3, 1],
    ],
  );
});

test("plan — a repeated unit name, and resources or move_after without a count, are refused where they are", () => {
  const problems = (units: unknown[]) =>
    planSchema.safeParse({ units }).error?.issues.map((issue) => `${issue.path.join(".")}: ${issue.message}`);
  assert.deepEqual(problems([{ name: "a" }, { name: "a" }]), [
    "units.1.name: repeats an earlier unit's name",
  ]);
  assert.match(
    problems([{ name: "a", resources: { cpu: 1 } }])?.[0] ?? "",
    /^units\.0\.resources: applies only/,
  );
  assert.match(problems([{ name: "a", move_after: "5m" }])?.[0] ?? "", /^units\.0\.move_after: applies only/);
  assert.match(problems([{ name: "A b" }])?.[0] ?? "", /^units\.0\.name: expected a unit name/);
  assert.match(problems([{ name: "a", colour: "red" }])?.[0] ?? "", /colour/);
});

test("allot — the first example: motd everywhere, web on three of the role=web nodes", () => {
  const fleet = [
    node("w-1", { role: "web" }),
    node("w-2", { role: "web" }),
    node("w-3", { role: "web" }),
    node("w-4", { role: "web" }),
    node("d-1", { role: "db" }),
  ];
  const example = plan([
    { name: "motd", files: [{ path: "/etc/motd", content: "m\n" }] },
    {
      name: "web",
      where: { labels: { role: "web" } },
      count: 3,
      files: [{ path: "/etc/web.conf", content: "w\n" }],
    },
  ]);
  const { placed, conditions } = allot(example, fleet);
  assert.deepEqual(placed.get("motd"), ["d-1", "w-1", "w-2", "w-3", "w-4"]);
  assert.equal(placed.get("web")?.length, 3);
  assert.ok(placed.get("web")?.every((name) => name.startsWith("w-")));
  assert.deepEqual(conditions, []);
});

test("allot — what cannot be placed is a condition saying why", () => {
  const fleet = [node("w-1", { role: "web" }), node("w-2", { role: "web" }, 1), node("d-1", { role: "db" })];
  const { conditions } = allot(
    plan([
      { name: "web", where: { labels: { role: "web" } }, count: 3 },
      { name: "big", where: { labels: { role: "web" } }, count: 2, resources: { cpu: 2 } },
      { name: "gpu", where: { drivers: ["gpu"] } },
    ]),
    fleet,
  );
  assert.deepEqual(
    conditions.map((condition) => condition.reason),
    [
      "gpu: no node matches",
      "big: 2 wanted, 1 placed: 2 match, 1 without room for cpu 2",
      "web: 3 wanted, 2 placed: only 2 nodes match",
    ],
  );
});

test("allot — selectors: labels by value or set, drivers, least cpu and memory, names", () => {
  const one = node("n-1", { role: "web", zone: "b" }, 8, 16_384);
  assert.equal(matches({ labels: { zone: ["a", "b"] } }, one), true);
  assert.equal(matches({ labels: { zone: ["a", "c"] } }, one), false);
  assert.equal(
    matches({ labels: { constructor: "x" } }, one),
    false,
    "no label reaches the object's prototype",
  );
  assert.equal(matches({ drivers: ["file"], cpu: 8, memory_mb: 16_384 }, one), true);
  assert.equal(matches({ cpu: 9 }, one), false);
  assert.equal(matches({ nodes: ["n-2"] }, one), false);
});

test("compose — a node holds its units' items once each; two units' different items under one id are a conflict", () => {
  const fleet = [node("n-1"), node("n-2", { role: "web" })];
  const clashing = plan([
    { name: "base", files: [{ path: "/etc/motd", content: "base\n" }] },
    { name: "same", files: [{ path: "/etc/motd", content: "base\n" }] },
    { name: "web", where: { labels: { role: "web" } }, files: [{ path: "/etc/motd", content: "web\n" }] },
  ]);
  const allotment = allot(clashing, fleet);
  const quiet = composeFor(clashing, allotment, "n-1");
  assert.deepEqual(quiet.units, ["base", "same"]);
  assert.deepEqual(
    quiet.items.map((item) => item.id),
    ["file:/etc/motd"],
  );
  assert.deepEqual(quiet.conflicts, []);
  assert.deepEqual(composeFor(clashing, allotment, "n-2").conflicts, [
    { node: "n-2", id: "file:/etc/motd", units: ["base", "web"] },
  ]);
});

/** Fleets of up to 40 nodes with a role label from a small set, and plans of count units over them. */
const fleetArbitrary = fc
  .uniqueArray(fc.integer({ min: 0, max: 999 }), { minLength: 0, maxLength: 40 })
  .chain((ids) =>
    fc.tuple(
      ...ids.map((id) =>
        fc
          .record({ role: fc.constantFrom("web", "db", "cache"), cpu: fc.integer({ min: 1, max: 8 }) })
          .map(({ role, cpu }) => node(`n-${id}`, { role }, cpu, cpu * 1024)),
      ),
    ),
  );
const unitsArbitrary = (withResources: boolean) =>
  fc.uniqueArray(
    fc.record({
      name: fc.constantFrom("alpha", "beta", "gamma", "delta", "eps"),
      role: fc.constantFrom("web", "db", "cache", undefined),
      count: fc.integer({ min: 1, max: 12 }),
      cpu: withResources ? fc.integer({ min: 1, max: 4 }) : fc.constant(undefined),
    }),
    { selector: (unit) => unit.name, maxLength: 5 },
  );
const planOf = (units: Array<{ name: string; role?: string; count: number; cpu?: number }>) =>
  plan(
    units.map((unit) => ({
      name: unit.name,
      count: unit.count,
      ...(unit.role === undefined ? {} : { where: { labels: { role: unit.role } } }),
      ...(unit.cpu === undefined ? {} : { resources: { cpu: unit.cpu } }),
    })),
  );

test("allot — deterministic: the same plan and fleet, in any order, give the same placements", () => {
  fc.assert(
    fc.property(fleetArbitrary, unitsArbitrary(true), fc.integer(), (fleet, units, seed) => {
      const shuffled = [...fleet].sort(
        (a, b) => ((a.name.length * 31 + seed) % 7) - ((b.name.length * 17 + seed) % 5),
      );
      const first = allot(planOf(units), fleet);
      const second = allot(planOf([...units].reverse()), shuffled);
      assert.deepEqual([...first.placed].sort(), [...second.placed].sort());
      assert.deepEqual(first.conditions, second.conditions);
    }),
  );
});

test("allot — placements match, never exceed the count, and fill it when enough nodes match", () => {
  fc.assert(
    fc.property(fleetArbitrary, unitsArbitrary(false), (fleet, units) => {
      const thePlan = planOf(units);
      const { placed } = allot(thePlan, fleet);
      for (const unit of thePlan.units) {
        const nodes = placed.get(unit.name) ?? [];
        const matching = fleet.filter((one) => matches(unit.where, one));
        assert.equal(new Set(nodes).size, nodes.length, "distinct nodes");
        assert.ok(nodes.every((name) => matching.some((one) => one.name === name)));
        assert.equal(nodes.length, Math.min(unit.count ?? 0, matching.length));
      }
    }),
  );
});

test("allot — resources: what is placed on a node never asks more than the node has", () => {
  fc.assert(
    fc.property(fleetArbitrary, unitsArbitrary(true), (fleet, units) => {
      const thePlan = planOf(units);
      const { placed } = allot(thePlan, fleet);
      for (const one of fleet) {
        const asked = thePlan.units
          .filter((unit) => placed.get(unit.name)?.includes(one.name))
          .reduce((sum, unit) => sum + (unit.resources?.cpu ?? 0), 0);
        assert.ok(asked <= one.profile.cpu, `${one.name}: ${asked} of ${one.profile.cpu} cpu`);
      }
    }),
  );
});

test("allot — stable: a node joining or leaving moves at most one placement of each unit", () => {
  fc.assert(
    fc.property(
      fleetArbitrary,
      unitsArbitrary(false),
      fc.constantFrom("web", "db", "cache"),
      (fleet, units, role) => {
        const thePlan = planOf(units);
        const before = allot(thePlan, fleet).placed;
        const joined = allot(thePlan, [...fleet, node("n-new", { role })]).placed;
        for (const unit of thePlan.units) {
          const was = new Set(before.get(unit.name));
          const now = joined.get(unit.name) ?? [];
          const moved = now.filter((name) => !was.has(name) && name !== "n-new").length;
          assert.equal(moved, 0, `${unit.name}: only the joining node may come in`);
          assert.ok(
            [...was].filter((name) => !now.includes(name)).length <= 1,
            `${unit.name}: at most one out`,
          );
        }
        const leaving = fleet[0];
        if (leaving === undefined) return;
        const left = allot(
          thePlan,
          fleet.filter((one) => one !== leaving),
        ).placed;
        for (const unit of thePlan.units) {
          const was = before.get(unit.name) ?? [];
          const now = new Set(left.get(unit.name));
          assert.ok(
            was.every((name) => name === leaving.name || now.has(name)),
            `${unit.name}: only the leaving node goes`,
          );
          assert.ok(
            [...now].filter((name) => !was.includes(name)).length <= 1,
            `${unit.name}: at most one in`,
          );
        }
      },
    ),
  );
});

/**
 * Fleets of 20 to 60 nodes whose profiles differ in every way a selector looks at (some lack a label a selector
 * names, one label no selector names), few enough ways that many nodes are alike in what selectors see.
 */
const variedFleetArbitrary = fc
  .uniqueArray(fc.integer({ min: 0, max: 999 }), { minLength: 20, maxLength: 60 })
  .chain((ids) =>
    fc.tuple(
      ...ids.map((id) =>
        fc
          .record({
            role: fc.constantFrom("web", "db", undefined),
            zone: fc.constantFrom("a", "", undefined),
            other: fc.constantFrom("x", "y"),
            cpu: fc.integer({ min: 1, max: 2 }),
            memory: fc.constantFrom(1_024, 2_048),
            drivers: fc.subarray(["file", "user", "service"]),
          })
          .map(({ role, zone, other, cpu, memory, drivers }) => ({
            name: `n-${id}`,
            profile: {
              cpu,
              memory_mb: memory,
              labels: {
                other,
                ...(role === undefined ? {} : { role }),
                ...(zone === undefined ? {} : { zone }),
              },
              drivers,
            },
          })),
      ),
    ),
  );
/** Selectors over a fleet: each field or none, names drawn from the fleet's own (repeated, and one not in it). */
const selectorArbitrary = (names: readonly string[]) =>
  fc.record(
    {
      labels: fc.record(
        { role: fc.constantFrom("web", ["web", "db"]), zone: fc.constantFrom("a", "", ["a", "b"]) },
        { requiredKeys: [] },
      ),
      drivers: fc.subarray(["file", "user", "service"], { minLength: 1 }),
      cpu: fc.integer({ min: 1, max: 2 }),
      memory_mb: fc.constantFrom(1_024, 2_048),
      nodes: fc.array(fc.constantFrom(...names, "n-gone"), { minLength: 1, maxLength: 30 }),
    },
    { requiredKeys: [] },
  );
/** A varied fleet and units over it: some counted, with resources and `move_after`, some holding users too. */
const fleetAndUnitsArbitrary = variedFleetArbitrary.chain((fleet) =>
  fc.tuple(
    fc.constant(fleet),
    fc.array(
      fc.record({
        where: fc.option(selectorArbitrary(fleet.map((one) => one.name)), { nil: undefined }),
        users: fc.boolean(),
        count: fc.option(fc.integer({ min: 1, max: 12 }), { nil: undefined }),
        cpu: fc.option(fc.constantFrom(0.5, 1, 2), { nil: undefined }),
        moveAfter: fc.boolean(),
      }),
      { minLength: 1, maxLength: 8 },
    ),
  ),
);
const variedPlanOf = (
  units: ReadonlyArray<{ where?: unknown; users: boolean; count?: number; cpu?: number; moveAfter: boolean }>,
) =>
  plan(
    units.map(({ where, users, count, cpu, moveAfter }, index) => ({
      name: `u-${index}`,
      ...(where === undefined ? {} : { where }),
      files: [{ path: `/etc/u-${index}`, content: "x" }],
      ...(users ? { users: [{ name: `user${index}` }] } : {}),
      ...(count === undefined
        ? {}
        : {
            count,
            ...(cpu === undefined ? {} : { resources: { cpu } }),
            ...(moveAfter ? { move_after: "1h" } : {}),
          }),
    })),
  );

/** Each unit's matching, by groups, is exactly what matching `fleet` node by node finds. */
function matchesOneByOne(thePlan: Plan, fleet: readonly FleetNode[], grouped: readonly FleetNode[]): void {
  const matchingOf = matcher(thePlan, grouped);
  for (const unit of thePlan.units) {
    assert.deepEqual(
      matchingOf(unit).map((one) => one.name),
      fleet
        .filter((one) => matches(unit.where, one) && canHold(unit, one))
        .map((one) => one.name)
        .sort(),
    );
  }
}

test("allot — matching by groups of alike nodes finds exactly the nodes a selector matches one by one", () => {
  fc.assert(
    fc.property(fleetAndUnitsArbitrary, ([fleet, units]) =>
      matchesOneByOne(variedPlanOf(units), fleet, fleet),
    ),
    { numRuns: 300 },
  );
});

test("allot — matching finds the same nodes when alike nodes share one profile object, as the fleet is read", () => {
  fc.assert(
    fc.property(fleetAndUnitsArbitrary, ([fleet, units]) => {
      // Nodes whose profiles read alike get one object for it, as `readFleet` gives them.
      const read = new Map<string, FleetNode["profile"]>();
      const shared = fleet.map((one) => {
        const text = JSON.stringify(one.profile);
        const profile = read.get(text) ?? one.profile;
        read.set(text, profile);
        return { name: one.name, profile };
      });
      matchesOneByOne(variedPlanOf(units), fleet, shared);
    }),
    { numRuns: 300 },
  );
});

test("allot — a label set to the empty string is not a label missing", () => {
  const fleet = [node("n-1", { zone: "" }), node("n-2"), node("n-3", { zone: "a" })];
  const thePlan = plan([
    { name: "empty", where: { labels: { zone: "" } } },
    { name: "a", where: { labels: { zone: "a" } } },
  ]);
  const { placed } = allot(thePlan, fleet);
  assert.deepEqual(placed.get("empty"), ["n-1"]);
  assert.deepEqual(placed.get("a"), ["n-3"]);
});

/**
 * Allot's rules, node by node: every node matched against every unit, every counted unit's candidates sorted in
 * full, held placements kept first, then the rest filled by rank where they fit.
 */
function allotOneByOne(
  thePlan: Plan,
  fleet: readonly FleetNode[],
  away: ReadonlyMap<string, number>,
  held: ReadonlyMap<string, ReadonlySet<string>>,
): Map<string, string[]> {
  const left = new Map(fleet.map((one) => [one.name, { ...one.profile }]));
  const units = [...thePlan.units].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const placed = new Map<string, string[]>();
  const matching = (unit: Plan["units"][number]) =>
    fleet.filter((one) => matches(unit.where, one) && canHold(unit, one));
  for (const unit of units.filter((one) => one.count === undefined))
    placed.set(
      unit.name,
      matching(unit)
        .map((one) => one.name)
        .sort(),
    );
  const counted = units
    .filter((one) => one.count !== undefined)
    .map((unit) => ({
      unit,
      chosen: [] as string[],
      ranked: matching(unit)
        .filter((one) => unit.move_after === undefined || (away.get(one.name) ?? 0) < 3_600_000)
        .map((one) => ({ name: one.name, score: rendezvousScore(unit.name, one.name) }))
        .sort((a, b) => b.score - a.score || (a.name < b.name ? -1 : 1)),
    }));
  const take = (entry: (typeof counted)[number], name: string) => {
    const room = left.get(name);
    const cpu = entry.unit.resources?.cpu ?? 0;
    if (room === undefined || room.cpu < cpu || entry.chosen.includes(name)) return;
    room.cpu -= cpu;
    entry.chosen.push(name);
  };
  for (const entry of counted) {
    for (const { name } of entry.ranked) {
      if (entry.chosen.length < (entry.unit.count ?? 0) && held.get(entry.unit.name)?.has(name))
        take(entry, name);
    }
  }
  for (const entry of counted) {
    for (const { name } of entry.ranked) if (entry.chosen.length < (entry.unit.count ?? 0)) take(entry, name);
    placed.set(entry.unit.name, entry.chosen.sort());
  }
  return placed;
}

test("allot — places exactly as its rules say, node by node, with holders and nodes away", () => {
  fc.assert(
    fc.property(fleetAndUnitsArbitrary, fc.integer({ min: 2, max: 5 }), ([fleet, units], every) => {
      const thePlan = variedPlanOf(units);
      const away = new Map(
        fleet.filter((_, index) => index % every === 0).map((one) => [one.name, 7_200_000]),
      );
      // Holders the unit now places elsewhere, and holders that are no candidate: a node it no longer matches, or
      // no node of the fleet at all.
      const held = new Map(
        [...allot(thePlan, fleet).placed].map(([unit, nodes]) => [
          unit,
          new Set([
            ...nodes.filter((_, index) => index % every !== 1),
            ...fleet.filter((_, index) => index % every === 2).map((one) => one.name),
            "no-such-node",
          ]),
        ]),
      );
      assert.deepEqual(
        [...allot(thePlan, fleet, away, held).placed].sort(),
        [...allotOneByOne(thePlan, fleet, away, held)].sort(),
      );
    }),
    { numRuns: 300 },
  );
});

test("allot — candidates come in rank order: the higher score first, then the name; only those asked for", () => {
  fc.assert(
    fc.property(
      fc.array(fc.record({ name: fc.constantFrom("a", "b", "c", "d", "e"), score: fc.nat({ max: 5 }) })),
      fc.array(fc.boolean()),
      (candidates, asked) => {
        const inOrder = (ranked: readonly { name: string; score: number }[]) =>
          [...ranked]
            .sort((a, b) => b.score - a.score || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
            .map(({ name, score }) => `${score} ${name}`);
        const names = candidates.map(({ name }) => name);
        const scores = Uint32Array.from(candidates.map(({ score }) => score));
        const read = (next: () => number) => {
          const places: number[] = [];
          for (let at = next(); at >= 0; at = next()) places.push(at);
          return places.map((at) => `${scores[at]} ${names[at]}`);
        };
        assert.deepEqual(read(rankOrder(names, scores)), inOrder(candidates));
        const among = candidates.flatMap((_, at) => (asked[at] === true ? [at] : []));
        assert.deepEqual(
          read(rankOrder(names, scores, among)),
          inOrder(among.map((at) => candidates[at] ?? { name: "", score: 0 })),
        );
      },
    ),
    { numRuns: 300 },
  );
});

test("allot — a node's rank for a unit is the same as it always was: placements do not move on upgrade", () => {
  // These values never change: a node's rank moving would move placements when the control plane is upgraded.
  assert.deepEqual(
    [
      ["web", "node-0001"],
      ["svc-07", "bench-09999"],
      ["", ""],
      ["db", "é-ノード"],
    ].map(([unit, node]) => rendezvousScore(unit ?? "", node ?? "")),
    [453816320, 4085621817, 91794203, 1710471433],
  );
});
