import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import type { FleetNode } from "../../src/control/allot.js";
import { allot } from "../../src/control/allot.js";
import { composeFleet, composeFor, mayConflict } from "../../src/control/compose.js";
import {
  needsSending,
  outlookOf,
  parsePlanFile,
  pinName,
  pinned,
  planText,
  refuseConflicts,
} from "../../src/control/plans.js";
import { UsageError } from "../../src/errors.js";
import type { Plan } from "../../src/link/index.js";
import { emptyDigest, itemsDigest, planSchema, unitContentsSchema } from "../../src/link/index.js";

const node = (name: string, labels: Record<string, string> = {}): FleetNode => ({
  name,
  profile: { cpu: 4, memory_mb: 8192, labels, drivers: ["file"] },
});
const plan = (units: unknown[]): Plan => planSchema.parse({ units });
const file = (path: string, content: string) => ({ path, content });
const contents = (files: Array<{ path: string; content: string }>) => unitContentsSchema.parse({ files });

test("plan file — the issue's example reads as written; bad files are usage errors naming the place", () => {
  const example = parsePlanFile(
    `units:
  - name: motd
    files:
      - {path: /etc/motd, content: "managed by the mesh\\n"}
  - name: web
    where: {labels: {role: web}}
    count: 3
    files:
      - {path: /etc/web.conf, content: "port 8080\\n"}
`,
    "plan.yaml",
  );
  assert.deepEqual(
    example.units.map((unit) => unit.name),
    ["motd", "web"],
  );
  const refused = (text: string) =>
    assert.throws(
      () => parsePlanFile(text, "p.yaml"),
      (error: unknown) => error instanceof UsageError && error.message.startsWith("p.yaml"),
    );
  refused("units: [{name: a, files: [{path: etc/motd, content: x}]}]");
  refused("units: [{name: a, files: [{path: /a/../b, content: x}]}]");
  refused("units: [{name: a, files: [{path: /a, content: x}, {path: /a, content: y}]}]");
  refused("units: [{name: a, files: [{path: /a, content: x, mode: rwx}]}]");
  refused("units: [{name: a, count: 0}]");
  refused("units: {");
  refused("[]");
  assert.throws(
    () =>
      parsePlanFile("units: [{name: a, files: [{path: /a, content: x}, {path: /a, content: y}]}]", "p.yaml"),
    /p\.yaml: units\[0\] \(a\): files\[1\]\.path: repeats an earlier file's path/,
  );
});

test("pins — `mesh declare` replaces only its own pin, for one node or for all", () => {
  const base = plan([{ name: "motd", files: [file("/etc/motd", "m")] }]);
  const one = pinned(base, ["web-1"], contents([file("/etc/a", "1")]));
  assert.deepEqual(
    one.units.map((unit) => unit.name),
    ["motd", "pin-web-1"],
  );
  assert.deepEqual(one.units[1]?.where, { nodes: ["web-1"] });
  const again = pinned(one, ["web-1", "web-2"], contents([file("/etc/a", "2")]));
  assert.deepEqual(
    again.units.map((unit) => [unit.name, (unit.files[0] as { content?: string } | undefined)?.content]),
    [
      ["motd", "m"],
      ["pin-web-1", "2"],
      ["pin-web-2", "2"],
    ],
  );
  const all = pinned(again, { all: true }, contents([file("/etc/all", "x")]));
  assert.equal(all.units.at(-1)?.name, pinName({ all: true }));
  assert.equal(all.units.at(-1)?.where, undefined);
  // What a pin makes is a plan the contract accepts, for the longest node name too.
  planSchema.parse(pinned(base, ["n".repeat(63)], contents([])));
});

test("compose — nodes on the same units share one composition; a node with none holds nothing", () => {
  const thePlan = plan([
    { name: "motd", files: [file("/etc/motd", "m")] },
    { name: "web", where: { labels: { role: "web" } }, files: [file("/etc/web", "w")] },
  ]);
  const fleet = [node("a", { role: "web" }), node("b", { role: "web" }), node("c"), node("d")];
  const all = composeFleet(thePlan, allot(thePlan, fleet), ["a", "b", "c", "d"]);
  assert.equal(all.get("a")?.items, all.get("b")?.items, "one composition object for both web nodes");
  assert.deepEqual(all.get("a")?.units, ["motd", "web"]);
  assert.deepEqual(all.get("c")?.units, ["motd"]);
  const none = composeFleet(plan([]), allot(plan([]), fleet), ["a"]).get("a");
  assert.deepEqual(none?.items, []);
  assert.equal(none?.digest, emptyDigest);
  // composeFor is composeFleet for one node: the same items, the same digest.
  const alone = composeFor(thePlan, allot(thePlan, fleet), "a");
  assert.equal(alone.digest, all.get("a")?.digest);
  assert.equal(alone.digest, itemsDigest(alone.items));
});

test("compose — each node holds the units placed on it, in name order; nodes on the same units share one composition", () => {
  const names = Array.from({ length: 12 }, (_, i) => `n-${i}`);
  const units = Array.from({ length: 6 }, (_, i) => `u-${i}`);
  const thePlan = plan(units.map((name) => ({ name, files: [file(`/etc/${name}`, name)] })));
  fc.assert(
    fc.property(
      fc.array(fc.subarray(names), { minLength: units.length, maxLength: units.length }),
      fc.subarray(names, { minLength: 1 }),
      (placements, composed) => {
        // Given in reverse name order of units; a node placed that is not composed is left out.
        const placed = new Map(units.map((name, i) => [name, placements[i] ?? []] as const).reverse());
        const all = composeFleet(thePlan, { placed, conditions: [] }, composed);
        assert.deepEqual([...all.keys()], composed);
        const unitsOf = (node: string) => units.filter((name) => placed.get(name)?.includes(node));
        for (const one of composed) {
          const composition = all.get(one);
          assert.deepEqual(composition?.units, unitsOf(one));
          assert.deepEqual(
            composition?.items.map((item) => item.id),
            unitsOf(one).map((name) => `file:/etc/${name}`),
          );
          assert.equal(composition?.digest, itemsDigest(composition?.items ?? []));
          for (const other of composed) {
            const same = unitsOf(one).join() === unitsOf(other).join();
            assert.equal(all.get(other) === composition, same, `${one} and ${other}`);
          }
        }
      },
    ),
    { numRuns: 300 },
  );
});

test("send only what changed — a new epoch alone, or the same items again, sends nothing", () => {
  const thePlan = plan([{ name: "motd", files: [file("/etc/motd", "m")] }]);
  const composition = composeFor(thePlan, allot(thePlan, [node("a")]), "a");
  assert.equal(needsSending(composition, undefined), true, "never sent anything");
  assert.equal(needsSending(composition, { digest: composition.digest, units: ["motd"] }), false);
  assert.equal(needsSending(composition, { digest: emptyDigest, units: ["motd"] }), true);
  assert.equal(needsSending(composition, { digest: composition.digest, units: ["old-name"] }), true);
  const nothing = composeFor(plan([]), allot(plan([]), [node("a")]), "a");
  assert.equal(needsSending(nothing, undefined), false, "holding nothing and sent nothing");
  assert.equal(needsSending(nothing, { digest: composition.digest, units: ["motd"] }), true, "told to drop");
});

test("conflicts — refused at apply naming both units; found later, a condition and nothing sent there", () => {
  const clashing = plan([
    { name: "a", files: [file("/etc/x", "1")] },
    { name: "b", where: { labels: { role: "db" } }, files: [file("/etc/x", "2")] },
  ]);
  const quiet = outlookOf(clashing, { nodes: [node("n-1")], away: new Map() });
  assert.doesNotThrow(() => refuseConflicts(quiet, "p.yaml"), "no node holds both yet");
  const fleet = {
    nodes: [node("n-1"), node("n-2", { role: "db" }), node("n-3", { role: "db" })],
    away: new Map(),
  };
  const clash = outlookOf(clashing, fleet);
  assert.throws(
    () => refuseConflicts(clash, "p.yaml"),
    /^UsageError: p\.yaml: units a and b both declare file:\/etc\/x, differently, for n-2 \(and 1 more nodes\); nothing was written$/,
  );
  assert.deepEqual(
    clash.conditions.map((condition) => condition.reason),
    [
      "b: conflicts with a over file:/etc/x on n-2 and 1 more node: those nodes keep what they were last sent",
    ],
  );
  const n2 = clash.compositions.get("n-2");
  assert.ok(n2 !== undefined);
  assert.equal(needsSending(n2, undefined), false, "a conflicting node is sent nothing");
});

test("conflicts — a plan that declares no item id twice differently cannot conflict, and is not composed to find out", () => {
  const clashing = plan([
    { name: "a", files: [file("/etc/x", "1")] },
    { name: "b", where: { labels: { role: "db" } }, files: [file("/etc/x", "2")] },
  ]);
  assert.equal(mayConflict(clashing), true, "two units, one path, two contents");
  assert.equal(
    mayConflict(
      plan([
        { name: "a", files: [file("/etc/x", "1")] },
        { name: "b", files: [file("/etc/x", "1"), file("/etc/y", "2")] },
      ]),
    ),
    false,
    "one path declared alike twice is held once",
  );
  assert.equal(mayConflict(pinned(clashing, { all: true }, contents([file("/etc/z", "z")]))), true);
  assert.equal(
    mayConflict(
      pinned(
        plan([{ name: "a", files: [file("/etc/x", "1")] }]),
        { all: true },
        contents([file("/etc/z", "z")]),
      ),
    ),
    false,
    "`mesh declare --all` of a new path",
  );
});

test("conflicts — property: any fleet on which a plan conflicts is a fleet of a plan that may conflict", () => {
  let conflicting = 0;
  fc.assert(
    fc.property(
      fc.array(
        fc.record({
          role: fc.option(fc.constantFrom("web", "db"), { nil: undefined }),
          count: fc.option(fc.integer({ min: 1, max: 3 }), { nil: undefined }),
          files: fc.uniqueArray(
            fc.record({
              path: fc.constantFrom("/etc/a", "/etc/b", "/etc/c"),
              content: fc.constantFrom("1", "2"),
            }),
            { selector: (one) => one.path, maxLength: 3 },
          ),
        }),
        { minLength: 1, maxLength: 4 },
      ),
      fc.array(fc.constantFrom("web", "db", "cache"), { minLength: 1, maxLength: 8 }),
      (units, roles) => {
        const thePlan = plan(
          units.map(({ role, count, files }, index) => ({
            name: `u${index}`,
            ...(role === undefined ? {} : { where: { labels: { role } } }),
            ...(count === undefined ? {} : { count }),
            files,
          })),
        );
        const fleet = { nodes: roles.map((role, index) => node(`n-${index}`, { role })), away: new Map() };
        const conflicts = outlookOf(thePlan, fleet).conflicts.length;
        if (conflicts > 0) conflicting++;
        assert.ok(
          conflicts === 0 || mayConflict(thePlan),
          `conflicts on a plan said not to: ${planText(thePlan)}`,
        );
      },
    ),
    { numRuns: 2000 },
  );
  assert.ok(conflicting > 100, `only ${conflicting} of 2000 generated plans conflicted on their fleet`);
});

test("move_after — a node out of touch longer moves a count unit's placement; shorter, or without it, stays", () => {
  const thePlan = plan([
    { name: "svc", count: 1, move_after: "5m", files: [file("/etc/svc", "s")] },
    { name: "pinned", count: 1, files: [file("/etc/p", "p")] },
  ]);
  const fleet = ["n-1", "n-2", "n-3", "n-4"].map((name) => node(name));
  const [first] = allot(thePlan, fleet).placed.get("svc") ?? [];
  const [firstPinned] = allot(thePlan, fleet).placed.get("pinned") ?? [];
  assert.ok(first !== undefined && firstPinned !== undefined);
  const away = (ms: number) => new Map([first, firstPinned].map((name) => [name, ms]));
  assert.deepEqual(allot(thePlan, fleet, away(4 * 60_000)).placed.get("svc"), [first], "not long enough");
  const moved = allot(thePlan, fleet, away(5 * 60_000));
  assert.notDeepEqual(moved.placed.get("svc"), [first], "moved after 5m");
  assert.deepEqual(moved.placed.get("pinned"), [firstPinned], "no move_after: never moves");
  // Nowhere to go: a condition that says why.
  const lone = allot(thePlan, [node("solo")], new Map([["solo", 10 * 60_000]]));
  assert.match(
    lone.conditions.map((condition) => condition.reason).join("\n"),
    /svc: 1 wanted, 0 placed: only 0 nodes match; 1 more match but is out of touch longer than 5m/,
  );
});

test("plans — the stored text is canonical: a plan read back is the plan written", () => {
  fc.assert(
    fc.property(
      fc.array(
        fc.record({
          name: fc.stringMatching(/^[a-z][a-z0-9]{0,8}$/),
          count: fc.option(fc.integer({ min: 1, max: 5 }), { nil: undefined }),
          content: fc.string({ maxLength: 20 }),
        }),
        { maxLength: 6 },
      ),
      (units) => {
        const unique = [...new Map(units.map((unit) => [unit.name, unit])).values()];
        const written = plan(
          unique.map(({ name, count, content }) => ({
            name,
            ...(count === undefined ? {} : { count }),
            files: [file(`/etc/${name}`, content)],
          })),
        );
        const text = planText(written);
        assert.equal(planText(planSchema.parse(JSON.parse(text))), text);
      },
    ),
  );
});

test("sticky — a count unit stays on the nodes that hold it; a node back from away does not pull it back", () => {
  const thePlan = plan([{ name: "svc", count: 1, move_after: "5m", files: [file("/etc/svc", "s")] }]);
  const fleet = ["n-1", "n-2", "n-3", "n-4"].map((name) => node(name));
  const [ranked] = allot(thePlan, fleet).placed.get("svc") ?? [];
  const other = fleet.map((one) => one.name).find((name) => name !== ranked) ?? "";
  // Held by a node of lower rank: it stays there.
  assert.deepEqual(allot(thePlan, fleet, new Map(), new Map([["svc", new Set([other])]])).placed.get("svc"), [
    other,
  ]);
  // Moved away from the top-ranked node while it was out of touch...
  const moved = allot(thePlan, fleet, new Map([[ranked ?? "", 6 * 60_000]]));
  const [successor] = moved.placed.get("svc") ?? [];
  assert.notEqual(successor, ranked);
  // ...and it stays with the successor once the first is back.
  assert.deepEqual(
    allot(thePlan, fleet, new Map(), new Map([["svc", new Set([successor ?? ""])]])).placed.get("svc"),
    [successor],
  );
  // A holder that no longer matches, or more holders than the count, give way by rank.
  const shrunk = plan([{ name: "svc", count: 1, where: { nodes: ["n-1", "n-2"] }, files: [] }]);
  const both = new Map([["svc", new Set(["n-1", "n-2", "n-3"])]]);
  const [kept] = allot(shrunk, fleet, new Map(), both).placed.get("svc") ?? [];
  assert.ok(kept === "n-1" || kept === "n-2");
  assert.deepEqual(
    allot(shrunk, fleet, new Map(), both).placed.get("svc"),
    allot(shrunk, fleet).placed.get("svc"),
  );
});

test("sticky — a standing placement keeps its room before any other unit is placed", () => {
  const small = [node("a"), node("b")].map((one) => ({ ...one, profile: { ...one.profile, cpu: 2 } }));
  const thePlan = plan([
    { name: "aaa", count: 1, resources: { cpu: 2 }, files: [] },
    { name: "zzz", count: 1, resources: { cpu: 2 }, files: [] },
  ]);
  for (const holder of ["a", "b"]) {
    const placed = allot(thePlan, small, new Map(), new Map([["zzz", new Set([holder])]])).placed;
    assert.deepEqual(placed.get("zzz"), [holder], "zzz keeps its node though aaa is placed first by name");
    assert.deepEqual(placed.get("aaa"), [holder === "a" ? "b" : "a"]);
  }
});

test("sticky — property: with what the last allotment placed held, the same fleet moves nothing", () => {
  fc.assert(
    fc.property(
      fc.array(fc.constantFrom("web", "db", "cache"), { minLength: 1, maxLength: 30 }),
      fc.integer({ min: 1, max: 6 }),
      (roles, count) => {
        const fleet = roles.map((role, index) => node(`n-${index}`, { role }));
        const thePlan = plan([
          { name: "w", where: { labels: { role: "web" } }, count, resources: { cpu: 1 }, files: [] },
          { name: "any", count, resources: { cpu: 2 }, files: [] },
        ]);
        const first = allot(thePlan, fleet).placed;
        const held = new Map([...first].map(([unit, nodes]) => [unit, new Set(nodes)]));
        assert.deepEqual(allot(thePlan, fleet, new Map(), held).placed, first);
      },
    ),
  );
});
