import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import type { Away, FleetNode, Held } from "../../src/control/allot.js";
import { allot } from "../../src/control/allot.js";
import { AllotMemory } from "../../src/control/allot-memory.js";
import { composeFleet } from "../../src/control/compose.js";
import type { Plan } from "../../src/link/index.js";
import { planSchema } from "../../src/link/index.js";

/** One of a handful of profiles, each one object, as `readFleet` shares the profile of nodes that sent the same. */
const profiles: FleetNode["profile"][] = [
  { cpu: 4, memory_mb: 8_192, labels: { role: "web" }, drivers: ["file"] },
  { cpu: 8, memory_mb: 16_384, labels: { role: "db" }, drivers: ["file", "user"] },
  { cpu: 2, memory_mb: 4_096, labels: { role: "web" }, drivers: ["file", "user"] },
  { cpu: 16, memory_mb: 65_536, labels: {}, drivers: ["file"] },
];

const profileAt = (at: number): FleetNode["profile"] => {
  const profile = profiles[at % profiles.length];
  if (profile === undefined) throw new Error(`no profile ${at}`);
  return profile;
};

interface UnitShape {
  role?: string;
  /** The unit names its nodes (`where.nodes`), by number. */
  nodes?: number[];
  memory?: number;
  count?: number;
  cpu?: number;
  moveAfter?: string;
  users: boolean;
  content: string;
}

const planOf = (units: readonly UnitShape[]): Plan =>
  planSchema.parse({
    units: units.map((unit, index) => ({
      name: `u-${index}`,
      ...(unit.role === undefined && unit.nodes === undefined && unit.memory === undefined
        ? {}
        : {
            where: {
              ...(unit.role === undefined ? {} : { labels: { role: unit.role } }),
              ...(unit.nodes === undefined
                ? {}
                : { nodes: unit.nodes.map((at) => `n-${String(at).padStart(2, "0")}`) }),
              ...(unit.memory === undefined ? {} : { memory_mb: unit.memory }),
            },
          }),
      ...(unit.count === undefined
        ? {}
        : {
            count: unit.count,
            ...(unit.cpu === undefined ? {} : { resources: { cpu: unit.cpu } }),
            ...(unit.moveAfter === undefined ? {} : { move_after: unit.moveAfter }),
          }),
      files: [{ path: `/etc/u-${index}`, content: unit.content }],
      ...(unit.users ? { users: [{ name: `user${index}` }] } : {}),
    })),
  });

const unitArbitrary: fc.Arbitrary<UnitShape> = fc.record(
  {
    role: fc.constantFrom("web", "db"),
    nodes: fc.array(fc.nat(30), { minLength: 1, maxLength: 5 }),
    memory: fc.constantFrom(8_192, 16_384),
    count: fc.integer({ min: 1, max: 6 }),
    cpu: fc.constantFrom(1, 2),
    moveAfter: fc.constantFrom("1h", "2h"),
    users: fc.boolean(),
    content: fc.constantFrom("a", "b"),
  },
  { requiredKeys: ["users", "content"] },
);

/** What changes between two roll-outs: what a unit holds, how it is placed, the fleet, who is away, who holds what. */
const changeArbitrary = fc.oneof(
  fc.record({ kind: fc.constant("content" as const), unit: fc.nat(), content: fc.string({ maxLength: 3 }) }),
  fc.record({ kind: fc.constant("unit" as const), unit: fc.nat(), shape: unitArbitrary }),
  fc.record({ kind: fc.constant("users" as const), unit: fc.nat() }),
  fc.record({ kind: fc.constant("profile" as const), node: fc.nat(), profile: fc.nat(profiles.length - 1) }),
  fc.record({ kind: fc.constant("drop" as const), node: fc.nat() }),
  fc.record({ kind: fc.constant("join" as const), name: fc.nat(30), profile: fc.nat(profiles.length - 1) }),
  fc.record({ kind: fc.constant("rename" as const), node: fc.nat(), name: fc.nat(30) }),
  fc.record({
    kind: fc.constant("pin" as const),
    unit: fc.nat(),
    nodes: fc.array(fc.nat(30), { minLength: 1, maxLength: 5 }),
  }),
  fc.record({ kind: fc.constant("add" as const), shape: unitArbitrary }),
  fc.record({ kind: fc.constant("remove" as const), unit: fc.nat() }),
  fc.record({
    kind: fc.constant("away" as const),
    node: fc.nat(),
    ms: fc.constantFrom(0, 30 * 60_000, 60 * 60_000, 90 * 60_000, 3 * 60 * 60_000),
  }),
  fc.record({
    kind: fc.constant("held" as const),
    unit: fc.nat(),
    nodes: fc.array(fc.nat(), { maxLength: 4 }),
  }),
  fc.constant({ kind: "none" as const }),
);

test("allot memory — after any changes, in any order, it answers what allot answers afresh", () => {
  fc.assert(
    fc.property(
      fc.array(fc.nat(profiles.length - 1), { minLength: 1, maxLength: 25 }),
      fc.array(unitArbitrary, { minLength: 1, maxLength: 6 }),
      fc.array(changeArbitrary, { minLength: 1, maxLength: 12 }),
      (profileOf, startUnits, changes) => {
        let fleet: FleetNode[] = profileOf.map((profile, at) => ({
          name: `n-${String(at).padStart(2, "0")}`,
          profile: profileAt(profile),
        }));
        let units = [...startUnits];
        let away: Away = new Map();
        let held: Held = new Map();
        const memory = new AllotMemory();
        const check = () => {
          const thePlan = planOf(units);
          assert.deepEqual(memory.allot(thePlan, fleet, away, held), allot(thePlan, fleet, away, held));
        };
        check();
        for (const change of changes) {
          const nodeAt = (at: number) => fleet[at % Math.max(fleet.length, 1)];
          const unitAt = (at: number) => at % units.length;
          switch (change.kind) {
            case "content": {
              const at = unitAt(change.unit);
              units = units.map((unit, index) =>
                index === at ? { ...unit, content: change.content } : unit,
              );
              break;
            }
            case "unit": {
              const at = unitAt(change.unit);
              units = units.map((unit, index) => (index === at ? change.shape : unit));
              break;
            }
            case "users": {
              // Holding users too: only nodes whose agent can apply users can hold the unit.
              const at = unitAt(change.unit);
              units = units.map((unit, index) => (index === at ? { ...unit, users: !unit.users } : unit));
              break;
            }
            case "profile": {
              const target = nodeAt(change.node);
              const profile = profileAt(change.profile);
              fleet = fleet.map((one) => (one === target ? { name: one.name, profile } : one));
              break;
            }
            case "drop": {
              const target = nodeAt(change.node);
              fleet = fleet.filter((one) => one !== target);
              break;
            }
            case "join": {
              // A node enrols (a name the fleet may not have yet), at the end of the fleet or in its order.
              const name = `n-${String(change.name).padStart(2, "0")}`;
              if (fleet.some((one) => one.name === name)) break;
              const joined = { name, profile: profileAt(change.profile) };
              fleet = [...fleet, joined].sort((a, b) => (a.name < b.name ? -1 : 1));
              break;
            }
            case "rename": {
              // One node leaves and another with the same profile enrols: the fleet's size and profiles stay.
              const target = nodeAt(change.node);
              const name = `n-${String(change.name).padStart(2, "0")}`;
              if (target === undefined || fleet.some((one) => one.name === name)) break;
              fleet = fleet
                .map((one) => (one === target ? { name, profile: one.profile } : one))
                .sort((a, b) => (a.name < b.name ? -1 : 1));
              break;
            }
            case "pin": {
              const at = unitAt(change.unit);
              units = units.map((unit, index) => (index === at ? { ...unit, nodes: change.nodes } : unit));
              break;
            }
            case "add":
              units = [...units, change.shape];
              break;
            case "remove": {
              if (units.length === 1) break;
              const at = unitAt(change.unit);
              units = units.filter((_, index) => index !== at);
              break;
            }
            case "away": {
              const target = nodeAt(change.node);
              if (target === undefined) break;
              const next = new Map(away);
              if (change.ms === 0) next.delete(target.name);
              else next.set(target.name, change.ms);
              away = next;
              break;
            }
            case "held": {
              const names = change.nodes.flatMap((at) => {
                const one = nodeAt(at);
                return one === undefined ? [] : [one.name];
              });
              const next = new Map(held);
              next.set(`u-${unitAt(change.unit)}`, new Set(names));
              held = next;
              break;
            }
            case "none":
              break;
            default: {
              const unknown: never = change;
              throw new Error(`unknown change ${JSON.stringify(unknown)}`);
            }
          }
          check();
        }
      },
    ),
    { numRuns: 300 },
  );
});

test("allot memory — a plan change only to what units hold gives the same allotment; a holder away too long moves", () => {
  const fleet: FleetNode[] = Array.from({ length: 12 }, (_, at) => ({
    name: `n-${at}`,
    profile: profileAt(at % profiles.length),
  }));
  // Role web and users: only n-2, n-6 and n-10 can hold u-1, and it is placed on two of them.
  const units: UnitShape[] = [
    { users: false, content: "one" },
    { role: "web", count: 2, cpu: 1, moveAfter: "1h", users: true, content: "one" },
  ];
  const placed = allot(planOf(units), fleet, new Map(), new Map()).placed.get("u-1") ?? [];
  assert.equal(placed.length, 2);
  const [holder] = placed;
  assert.ok(holder !== undefined);
  const held: Held = new Map([["u-1", new Set(placed)]]);
  const memory = new AllotMemory();
  const first = memory.allot(planOf(units), fleet, new Map(), held);
  const changed = units.map((unit) => ({ ...unit, content: "two" }));
  assert.equal(memory.allot(planOf(changed), [...fleet], new Map(), new Map(held)), first);
  // Away, but not yet past the unit's move_after: nothing moves either.
  assert.equal(memory.allot(planOf(changed), fleet, new Map([[holder, 60_000]]), held), first);
  // Past it: the placement moves to the third node that can hold it.
  const moved = memory.allot(planOf(changed), fleet, new Map([[holder, 2 * 3_600_000]]), held);
  assert.notEqual(moved, first);
  const now = moved.placed.get("u-1") ?? [];
  assert.equal(now.length, 2);
  assert.ok(!now.includes(holder), `${holder} is away past move_after and no longer holds u-1`);
  assert.deepEqual(moved, allot(planOf(changed), fleet, new Map([[holder, 2 * 3_600_000]]), held));
});

test("compose — a kept allotment composed with new contents gives what composing a fresh one gives", () => {
  const fleet: FleetNode[] = Array.from({ length: 30 }, (_, at) => ({
    name: `n-${at}`,
    profile: profileAt(at % profiles.length),
  }));
  const names = fleet.map((one) => one.name);
  const units = (content: string): UnitShape[] => [
    { users: false, content },
    { role: "web", users: false, content: "web" },
    { role: "db", count: 3, users: true, content },
  ];
  const memory = new AllotMemory();
  const before = planOf(units("one"));
  const kept = memory.allot(before, fleet, new Map(), new Map());
  composeFleet(before, kept, names);
  const after = planOf(units("two"));
  assert.equal(memory.allot(after, fleet, new Map(), new Map()), kept);
  const fresh = allot(after, fleet, new Map(), new Map());
  assert.notEqual(fresh, kept);
  const composed = composeFleet(after, kept, names);
  assert.deepEqual(composed, composeFleet(after, fresh, names));
  assert.ok(
    [...composed.values()].every((composition) =>
      composition.items.every(
        (item) => item.type !== "file" || item.content === "two" || item.path === "/etc/u-1",
      ),
    ),
    "every node holds the new contents",
  );
});
