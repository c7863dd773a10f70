/**
 * `node list` and `node show` after a plan, through the built executables on `mesh up` with its own nats-server and
 * real `mesh-host` agents: each node's units and whether its latest account holds what it was last sent (current,
 * behind while its agent is down, failed where its root cannot take a file, none when never sent anything), and
 * `node list --where` filtering by the labels nodes joined with, a malformed one refused before the store is opened.
 */
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import type { TestContext } from "node:test";
import { meshHost } from "../support/cli.js";
import type { Fleet } from "../support/fleets.js";
import { fleetForTest } from "../support/fleets.js";
import { eventually } from "../support/processes.js";

/** `mesh node list --json`, with the fields this test reads. */
interface Listed {
  name: string;
  state: string;
  units: string[];
  holding: string;
}

/** Joins `node` with `labels` into a state dir of its own and returns that dir; its agent is not started. */
async function joinWith(fleet: Fleet, node: string, labels: Record<string, string>): Promise<string> {
  const state = join(fleet.dir, node);
  const labelArgs = Object.entries(labels).flatMap(([key, value]) => ["--label", `${key}=${value}`]);
  const joined = await meshHost(["join", await fleet.issue(node), "--state", state, ...labelArgs]);
  assert.equal(joined.code, 0, joined.stderr);
  return state;
}

/** Runs the agent of `state` on `root` and waits until the control plane has heard it. */
async function runHeard(fleet: Fleet, t: TestContext, node: string, state: string, root: string) {
  fleet.runAgent(state, root, t);
  await eventually(`${node} to be heard`, async () =>
    (await fleet.show(node)).last_seen !== null ? true : undefined,
  );
}

async function listed(fleet: Fleet, where: string[] = []): Promise<Listed[]> {
  const run = await fleet.cli(["node", "list", ...where.flatMap((w) => ["--where", w]), "--json"]);
  assert.equal(run.code, 0, run.stderr);
  const nodes = JSON.parse(run.stdout) as Listed[];
  assert.ok(Array.isArray(nodes), "node list --json stays an array");
  return nodes;
}

/** Each node's holding and units (sorted), by name. */
async function standing(fleet: Fleet): Promise<Record<string, [string, string[]]>> {
  return Object.fromEntries(
    (await listed(fleet)).map((node) => [node.name, [node.holding, [...node.units].sort()]]),
  );
}

describe("node holding (nats)", () => {
  test("node holding — after a plan each node lists its units and current, behind, failed or none; --where picks by label", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    // Invited only: no profile, never sent anything.
    await fleet.issue("spare-1");
    for (const [node, role] of [
      ["web-1", "web"],
      ["web-2", "web"],
      ["db-1", "db"],
    ] as const) {
      const root = join(fleet.dir, `${node}-root`);
      mkdirSync(root);
      await runHeard(fleet, t, node, await joinWith(fleet, node, { role }), root);
    }
    // A root that is a regular file: whatever the node is sent fails there.
    const notADir = join(fleet.dir, "odd-root");
    writeFileSync(notADir, "");
    await runHeard(fleet, t, "odd-1", await joinWith(fleet, "odd-1", { role: "db" }), notADir);
    // Joined, its agent not running yet: it cannot report what it is sent.
    const lateState = await joinWith(fleet, "late-1", { role: "db" });

    const nothingSent: [string, string[]] = ["none", []];
    assert.deepEqual(await standing(fleet), {
      "db-1": nothingSent,
      "late-1": nothingSent,
      "odd-1": nothingSent,
      "spare-1": nothingSent,
      "web-1": nothingSent,
      "web-2": nothingSent,
    });

    const plan = join(fleet.dir, "plan.yaml");
    writeFileSync(
      plan,
      `units:
  - name: motd
    files:
      - {path: /etc/motd, content: "hi\\n"}
  - name: web
    where: {labels: {role: web}}
    files:
      - {path: /etc/web.conf, content: "port 8080\\n"}
`,
    );
    const applied = await fleet.cli(["plan", "apply", "-f", plan]);
    assert.equal(applied.code, 0, applied.stderr);

    // Until every running agent has reported: then late-1, whose agent is down, is still behind.
    const reported = await eventually(
      "the running nodes to report the plan",
      async () => {
        const now = await standing(fleet);
        const settled = ["web-1", "web-2", "db-1", "odd-1"].every((node) =>
          ["current", "failed"].includes(now[node]?.[0] ?? ""),
        );
        return settled ? now : undefined;
      },
      120_000,
    );
    assert.deepEqual(reported, {
      "db-1": ["current", ["motd"]],
      "late-1": ["behind", ["motd"]],
      "odd-1": ["failed", ["motd"]],
      "spare-1": ["none", []],
      "web-1": ["current", ["motd", "web"]],
      "web-2": ["current", ["motd", "web"]],
    });

    // The table: HOLDING and UNITS after the columns there were.
    const table = await fleet.cli(["node", "list"]);
    assert.equal(table.code, 0, table.stderr);
    assert.match(table.stdout, /^NAME\s+STATE\s+LIVENESS\s+LAST SEEN\s+HOLDING\s+UNITS$/m);
    assert.match(table.stdout, /^web-1\s+enrolled\s+here\s+\S+\s+current\s+motd,web$/m);
    assert.match(table.stdout, /^odd-1\s+enrolled\s+here\s+\S+\s+failed\s+motd$/m);
    assert.match(table.stdout, /^spare-1\s+invited\s+never spoken\s+-\s+none\s+-$/m);

    // node show: the same two facts, in JSON beside everything it showed before, and as lines.
    const shown = JSON.parse((await fleet.cli(["node", "show", "web-2", "--json"])).stdout) as {
      units: string[];
      holding: string;
      declaration: { sequence: number } | null;
      account: { outcome: string } | null;
    };
    assert.deepEqual([[...shown.units].sort(), shown.holding], [["motd", "web"], "current"]);
    assert.equal(shown.account?.outcome, "applied");
    assert.ok(shown.declaration !== null);
    const odd = await fleet.cli(["node", "show", "odd-1"]);
    assert.equal(odd.code, 0, odd.stderr);
    assert.match(odd.stdout, /^units\s+motd$/m);
    assert.match(odd.stdout, /^holding\s+failed$/m);
    assert.match(odd.stdout, /^account\s+failed/m);

    // late-1 catches up once its agent runs: the control plane sends it the latest again.
    const lateRoot = join(fleet.dir, "late-1-root");
    mkdirSync(lateRoot);
    fleet.runAgent(lateState, lateRoot, t);
    await eventually(
      "late-1 to hold the plan",
      async () => ((await standing(fleet))["late-1"]?.[0] === "current" ? true : undefined),
      120_000,
    );

    // --where: every one must hold; a comma list is one of; an invited node (no profile) never matches.
    const names = async (where: string[]) => (await listed(fleet, where)).map((node) => node.name);
    assert.deepEqual(await names(["role=web"]), ["web-1", "web-2"]);
    assert.deepEqual(await names(["role=db"]), ["db-1", "late-1", "odd-1"]);
    assert.deepEqual(await names(["role=web,db"]), ["db-1", "late-1", "odd-1", "web-1", "web-2"]);
    assert.deepEqual(await names(["role=web,db", "role=db"]), ["db-1", "late-1", "odd-1"]);
    assert.deepEqual(await names(["role=web", "role=db"]), []);
    assert.deepEqual(await names(["tier=front"]), []);
    const webTable = await fleet.cli(["node", "list", "--where", "role=web"]);
    assert.equal(webTable.code, 0, webTable.stderr);
    assert.deepEqual(
      webTable.stdout
        .split("\n")
        .filter((line) => /^\S+\s+enrolled\s/.test(line))
        .map((line) => line.split(/\s+/)[0]),
      ["web-1", "web-2"],
    );

    // A malformed --where is a usage error naming the flag and the value, before the store is opened: the same
    // command on a store that cannot be reached fails there (exit 1) only when the filter is good.
    const unreachable = ["--store", "postgres://mesh@127.0.0.1:1/mesh"];
    for (const [bad, said] of [
      ["role", /--where "role": expected KEY=VALUE/],
      ["=web", /--where "=web": "" is not a label key \(expected a label key/],
      ["-role=web", /--where "-role=web": "-role" is not a label key/],
      ["role name=web", /--where "role name=web": "role name" is not a label key/],
    ] as const) {
      const run = await fleet.cli([...unreachable, "node", "list", "--where", "role=web", "--where", bad]);
      assert.equal(run.code, 2, `${bad}: ${run.stderr}`);
      assert.match(run.stderr, said);
      assert.equal(run.stdout, "");
    }
    const good = await fleet.cli([...unreachable, "node", "list", "--where", "role=web"]);
    assert.equal(good.code, 1, good.stderr);
  });
});
