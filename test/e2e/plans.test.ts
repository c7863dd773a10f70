/**
 * Plans end to end, through the built executables on `mesh up` with its own nats-server and real `mesh-host`
 * agents: `plan diff` before an apply matching what the apply sent, a change to one unit sending to that unit's
 * nodes only, `plan render` byte for byte what was then signed and sent, `--wait` naming the node that failed,
 * conditions, pins from `mesh declare`, a roll-back, a retired node's placement moving, and a failover that sends
 * nothing. And the store's fence, from a holder paused between its gate and its write.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import type { TestContext } from "node:test";
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { NatsKvLease } from "../../src/bus/nats/lease-kv.js";
import { LeaseHolder } from "../../src/lease/holder.js";
import { createLogger } from "../../src/log.js";
import { declarationsSentKind, openStore } from "../../src/store/index.js";
import type { Store } from "../../src/store/index.js";
import { meshHost } from "../support/cli.js";
import type { Fleet } from "../support/fleets.js";
import { controlPlanePid, fleetForTest } from "../support/fleets.js";
import type { Running } from "../support/processes.js";
import { eventually } from "../support/processes.js";
import { storeBackends } from "../support/stores.js";

interface Sent {
  node: string;
  sequence: number;
}
interface Diff {
  revision: number;
  nodes: Array<{ node: string; gain: string[]; lose: string[]; change: string[] }>;
  conditions: string[];
  would_send: number;
}

/** Joins `node` with labels and runs its agent on a root of its own (or on `root` when given). */
async function nodeWith(
  fleet: Fleet,
  t: TestContext,
  node: string,
  labels: Record<string, string>,
  root?: string,
  agents?: Map<string, Running>,
): Promise<string> {
  const state = join(fleet.dir, node);
  const labelArgs = Object.entries(labels).flatMap(([key, value]) => ["--label", `${key}=${value}`]);
  const joined = await meshHost(["join", await fleet.issue(node), "--state", state, ...labelArgs]);
  assert.equal(joined.code, 0, joined.stderr);
  const where = root ?? join(fleet.dir, `${node}-root`);
  if (root === undefined) mkdirSync(where);
  const agent = fleet.runAgent(state, where, t);
  agents?.set(node, agent);
  await eventually(`${node} to be heard`, async () =>
    (await fleet.show(node)).last_seen !== null ? true : undefined,
  );
  return where;
}

function writePlan(fleet: Fleet, name: string, webContent: string, webCount = 2): string {
  const file = join(fleet.dir, name);
  writeFileSync(
    file,
    `units:
  - name: motd
    files:
      - {path: /etc/motd, content: "managed by the mesh\\n"}
  - name: web
    where: {labels: {role: web}}
    count: ${webCount}
    files:
      - {path: /etc/web.conf, content: ${JSON.stringify(webContent)}}
`,
  );
  return file;
}

async function json<T>(fleet: Fleet, args: string[], code = 0): Promise<T> {
  const run = await fleet.cli([...args, "--json"]);
  assert.equal(run.code, code, `${args.join(" ")}: ${run.stderr}`);
  return JSON.parse(run.stdout) as T;
}

/** The store the fleet's control plane keeps (SQLite in its data dir), opened beside it for reading. */
async function storeOf(fleet: Fleet, t: TestContext): Promise<Store> {
  const store = await openStore(`sqlite:${join(fleet.data, "mesh.db")}`, { historyLimit: 50 });
  t.after(() => store.close());
  return store;
}

describe("plans (nats)", () => {
  test("plans — diff then apply: motd everywhere, web on 2 of 3; render is what is sent; --wait names the failure; one unit's change reaches its nodes only", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const roots = new Map<string, string>();
    for (const node of ["web-1", "web-2", "web-3"])
      roots.set(node, await nodeWith(fleet, t, node, { role: "web" }));
    roots.set("db-1", await nodeWith(fleet, t, "db-1", { role: "db" }));
    // A node whose root is a regular file: whatever it is sent fails there.
    const notADir = join(fleet.dir, "odd-root");
    writeFileSync(notADir, "");
    await nodeWith(fleet, t, "odd-1", { role: "db" }, notADir);

    const first = writePlan(fleet, "plan-1.yaml", "port 8080\n");
    const diff = await json<Diff>(fleet, ["plan", "diff", "-f", first]);
    assert.equal(diff.revision, 0);
    assert.equal(diff.would_send, 5);
    const gainsWeb = diff.nodes.filter((node) => node.gain.includes("file:/etc/web.conf")).map((n) => n.node);
    assert.equal(gainsWeb.length, 2);
    assert.ok(gainsWeb.every((node) => node.startsWith("web-")));
    assert.deepEqual(await json<unknown[]>(fleet, ["plan", "history"]), [], "the dry run wrote nothing");

    // The apply with --wait: a table of outcomes, the failing node named with its reason, exit 1.
    const waited = await fleet.cli(["plan", "apply", "-f", first, "--wait", "--timeout", "60s"]);
    assert.equal(waited.code, 1, waited.stderr);
    assert.match(waited.stdout, /^plan revision 1 written \(epoch \d+\): sent to 5 node\(s\)$/m);
    assert.match(waited.stdout, /^NODE\s+SEQUENCE\s+OUTCOME\s+REASON$/m);
    assert.match(waited.stdout, /^odd-1\s+1\s+failed\s+\S.*$/m);
    for (const node of ["web-1", "web-2", "web-3", "db-1"]) {
      assert.match(waited.stdout, new RegExp(`^${node}\\s+1\\s+applied`, "m"));
    }
    assert.match(waited.stderr, /1 of 5 nodes did not apply it: odd-1 failed/);
    // What the diff said is what the apply sent: the same nodes, each its first declaration.
    const outcomes = waited.stdout.split("\n").filter((line) => /^\S+\s+\d+\s+(applied|failed)/.test(line));
    assert.deepEqual(
      outcomes.map((line) => line.split(/\s+/)[0]).sort(),
      diff.nodes.map((node) => node.node).sort(),
    );

    for (const node of gainsWeb) {
      assert.equal(readFileSync(join(roots.get(node) ?? "", "etc", "web.conf"), "utf8"), "port 8080\n");
    }
    const unplaced = ["web-1", "web-2", "web-3"].find((node) => !gainsWeb.includes(node)) ?? "";
    assert.equal(existsSync(join(roots.get(unplaced) ?? "", "etc", "web.conf")), false);
    assert.equal(readFileSync(join(roots.get("db-1") ?? "", "etc", "motd"), "utf8"), "managed by the mesh\n");

    // Render is byte for byte what was signed and sent: the items' JSON text inside the signed payload.
    const store = await storeOf(fleet, t);
    for (const node of [gainsWeb[0] ?? "", "db-1"]) {
      const rendered = await json<{ units: string[]; items: unknown[]; digest: string }>(fleet, [
        "plan",
        "render",
        node,
      ]);
      const latest = await store.declarations.latest(node);
      assert.ok(latest !== undefined);
      const envelope = JSON.parse(latest.envelope) as { payload: string };
      const payload = Buffer.from(envelope.payload, "base64").toString("utf8");
      assert.ok(payload.includes(`"items":${JSON.stringify(rendered.items)},`), `${node}: ${payload}`);
      assert.equal(rendered.digest, latest.digest);
      assert.deepEqual(rendered.units, latest.units);
    }

    // One unit changed: only its two nodes are sent anything, as the diff says beforehand.
    const second = writePlan(fleet, "plan-2.yaml", "port 9090\n");
    const changed = await json<Diff>(fleet, ["plan", "diff", "-f", second]);
    assert.equal(changed.revision, 1);
    assert.equal(changed.would_send, 2);
    assert.deepEqual(
      changed.nodes.map((node) => [node.node, node.change]),
      gainsWeb.sort().map((node) => [node, ["file:/etc/web.conf"]]),
    );
    const applied = await json<{ revision: number; sent: Sent[] }>(fleet, ["plan", "apply", "-f", second]);
    assert.equal(applied.revision, 2);
    assert.deepEqual(applied.sent.map((one) => one.node).sort(), gainsWeb);
    assert.ok(applied.sent.every((one) => one.sequence === 2));
    for (const node of gainsWeb) {
      const file = join(roots.get(node) ?? "", "etc", "web.conf");
      await eventually(`${file} to change`, () =>
        readFileSync(file, "utf8") === "port 9090\n" ? true : undefined,
      );
    }
    assert.equal((await fleet.show("db-1")).declaration?.sequence, 1, "db-1 was sent nothing");

    // The same plan again writes nothing; a stale --revision is refused; a conflict is refused naming both units.
    const same = await json<{ revision: number; written: boolean; sent: Sent[] }>(fleet, [
      "plan",
      "apply",
      "-f",
      second,
    ]);
    assert.deepEqual([same.revision, same.written, same.sent.length], [2, false, 0]);
    const stale = await fleet.cli(["plan", "apply", "-f", first, "--revision", "1"]);
    assert.equal(stale.code, 1);
    assert.match(stale.stderr, /plan changed since revision 1/);
    const clash = join(fleet.dir, "clash.yaml");
    writeFileSync(
      clash,
      "units:\n  - {name: a, files: [{path: /etc/x, content: one}]}\n  - {name: b, where: {labels: {role: db}}, files: [{path: /etc/x, content: two}]}\n",
    );
    const refused = await fleet.cli(["plan", "apply", "-f", clash]);
    assert.equal(refused.code, 2);
    assert.match(refused.stderr, /units a and b both declare file:\/etc\/x, differently, for db-1/);
    assert.equal((await json<unknown[]>(fleet, ["plan", "history"])).length, 2, "nothing written");

    // More web placements than web nodes: a condition, shown by plan show, cleared when it resolves.
    await json(fleet, ["plan", "apply", "-f", writePlan(fleet, "plan-5.yaml", "port 9090\n", 5)]);
    const shown = await json<{ revision: number; conditions: Array<{ reason: string; epoch: number }> }>(
      fleet,
      ["plan", "show"],
    );
    assert.deepEqual(
      shown.conditions.map((condition) => condition.reason),
      ["web: 5 wanted, 3 placed: only 3 nodes match"],
    );
    assert.ok((shown.conditions[0]?.epoch ?? 0) >= 1);
    // Rolled back to revision 2: the condition clears, the third web node drops the file again.
    const back = await json<{ revision: number; sent: Sent[] }>(fleet, [
      "plan",
      "apply",
      "--from-revision",
      "2",
    ]);
    assert.equal(back.revision, 4);
    assert.deepEqual(
      back.sent.map((one) => one.node),
      [unplaced],
    );
    assert.deepEqual((await json<{ conditions: unknown[] }>(fleet, ["plan", "show"])).conditions, []);
    const history = await json<Array<{ revision: number; written_by: string; epoch: number }>>(fleet, [
      "plan",
      "history",
    ]);
    assert.deepEqual(
      history.map((one) => one.revision),
      [4, 3, 2, 1],
    );
  });

  test("plans — `mesh declare` pins a unit into the plan; a retired node's placement moves; a failover sends nothing", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const roots = new Map<string, string>();
    for (const node of ["app-1", "app-2", "app-3"])
      roots.set(node, await nodeWith(fleet, t, node, { role: "app" }));
    const planFile = join(fleet.dir, "plan.yaml");
    writeFileSync(
      planFile,
      "units:\n  - {name: leader, where: {labels: {role: app}}, count: 1, files: [{path: /etc/leader, content: me}]}\n",
    );
    const applied = await json<{ sent: Sent[] }>(fleet, ["plan", "apply", "-f", planFile]);
    const [leader] = applied.sent.filter((one) => one.sequence === 1).map((one) => one.node);
    assert.ok(leader !== undefined);

    // A pin beside the plan's units: the node holds both; the plan shows the pin.
    const pinFile = join(fleet.dir, "pin.yaml");
    writeFileSync(pinFile, "files:\n  - {path: /etc/pinned, content: just me}\n");
    const pinned = await json<{ node: string; sequence: number }>(fleet, ["declare", "app-3", "-f", pinFile]);
    assert.equal(pinned.node, "app-3");
    const plan = await json<{ plan: { units: Array<{ name: string; where?: unknown }> } }>(fleet, [
      "plan",
      "show",
    ]);
    assert.deepEqual(
      plan.plan.units.map((unit) => [unit.name, unit.where ?? null]),
      [
        ["leader", { labels: { role: "app" } }],
        ["pin-app-3", { nodes: ["app-3"] }],
      ],
    );
    const pinPath = join(roots.get("app-3") ?? "", "etc", "pinned");
    await eventually("the pinned file", () => (existsSync(pinPath) ? true : undefined));

    // The leader retired: the control plane moves the placement to another app node by itself.
    const retired = await fleet.cli(["node", "retire", leader]);
    assert.equal(retired.code, 0, retired.stderr);
    const successor = await eventually("another node to hold /etc/leader", () =>
      ["app-1", "app-2", "app-3"].find(
        (node) => node !== leader && existsSync(join(roots.get(node) ?? "", "etc", "leader")),
      ),
    );
    await eventually(`${successor} to report it`, async () => {
      const shown = await fleet.show(successor);
      return shown.account?.outcome === "applied" && shown.account.sequence === shown.declaration?.sequence
        ? true
        : undefined;
    });

    // A failover with the plan unchanged: the new control plane composes everything and sends nothing.
    const store = await storeOf(fleet, t);
    const sentBefore = (await store.events.list({ limit: 10_000 })).filter(
      (e) => e.kind === declarationsSentKind,
    );
    assert.ok(sentBefore.length > 0, "the roll-outs before the failover are in the audit trail");
    const before = await store.plans.sent();
    const child = /"event":"control\.serving","epoch":(\d+)/.exec(fleet.up.stderr())?.[1];
    assert.equal(Number(child), before?.epoch);
    process.kill(controlPlanePid(fleet), "SIGKILL");
    const after = await eventually(
      "the next control plane to roll the plan out under its epoch",
      async () => {
        const sent = await store.plans.sent();
        return sent !== undefined && sent.epoch > (before?.epoch ?? 0) ? sent : undefined;
      },
      120_000,
    );
    assert.equal(after.revision, before?.revision);
    const sentAfter = (await store.events.list({ limit: 10_000 })).filter(
      (e) => e.kind === declarationsSentKind,
    );
    assert.equal(sentAfter.length, sentBefore.length, "no declaration was sent by the new epoch");
    // Logged once the roll-out has returned, after it marked the revision sent: waited for, not read at once.
    const rolledOut = new RegExp(
      `"event":"plan\\.rolled_out","revision":${after.revision},"epoch":${after.epoch},"sent":0`,
    );
    await eventually("the new control plane to log its roll-out, sending nothing", () =>
      rolledOut.test(fleet.up.stderr()) ? true : undefined,
    );
  });

  test("plans — a count unit with move_after moves off a node out of touch and stays moved when it is back; declare --wait", async (t) => {
    const fleet = await fleetForTest(t, "nats", { outOfTouchAfter: "3s" });
    const roots = new Map<string, string>();
    const agents = new Map<string, Running>();
    for (const node of ["mv-1", "mv-2", "mv-3"])
      roots.set(node, await nodeWith(fleet, t, node, { role: "mv" }, undefined, agents));
    const holds = (node: string) => existsSync(join(roots.get(node) ?? "", "etc", "svc"));
    const planFile = join(fleet.dir, "plan.yaml");
    writeFileSync(
      planFile,
      "units:\n  - {name: svc, where: {labels: {role: mv}}, count: 1, move_after: 3s, files: [{path: /etc/svc, content: run}]}\n",
    );
    const applied = await json<{ sent: Sent[] }>(fleet, ["plan", "apply", "-f", planFile]);
    assert.equal(applied.sent.length, 1);
    const first = applied.sent[0]?.node ?? "";
    await eventually(`${first} to hold /etc/svc`, () => (holds(first) ? true : undefined));

    // declare --wait: the table says the node applied it, exit 0.
    const pinFile = join(fleet.dir, "pin.yaml");
    writeFileSync(pinFile, "files:\n  - {path: /etc/pinned, content: here}\n");
    const others = ["mv-1", "mv-2", "mv-3"].filter((node) => node !== first);
    const waited = await fleet.cli(["declare", ...others, "-f", pinFile, "--wait"]);
    assert.equal(waited.code, 0, waited.stderr);
    for (const node of others) assert.match(waited.stdout, new RegExp(`^${node}\\s+\\d+\\s+applied`, "m"));

    // The holder goes silent: past move_after the placement moves to another node.
    await agents.get(first)?.stop("SIGTERM");
    const successor = await eventually("another node to hold /etc/svc", () => others.find(holds), 120_000);
    const conditions = await json<{ conditions: unknown[] }>(fleet, ["plan", "show"]);
    assert.deepEqual(conditions.conditions, []);

    // Back again: it drops what it no longer holds, and the placement stays with the successor.
    fleet.runAgent(join(fleet.dir, first), roots.get(first), t);
    await eventually(`${first} to drop /etc/svc`, () => (holds(first) ? undefined : true), 120_000);
    const shown = await fleet.show(first);
    assert.equal(shown.account?.sequence, shown.declaration?.sequence);
    assert.equal(holds(successor), true);
  });
});

for (const backend of storeBackends) {
  test(`plans (${backend.name}) — a holder paused past its lease: once another holds it, the store refuses its plan write`, async (t) => {
    const natsUrl = process.env.MESH_TEST_NATS ?? "nats://127.0.0.1:4222";
    const bucket = `mesh-plan-fence-${randomBytes(4).toString("hex")}`;
    const location = await backend.fresh();
    const ttlMs = 1500;
    const script = new URL("../support/plan-holder.ts", import.meta.url).pathname;
    const paused = spawn(
      process.execPath,
      ["--import", "tsx", script, natsUrl, bucket, location.url, String(ttlMs)],
      {
        stdio: ["pipe", "pipe", "pipe"],
      },
    );
    const exited = new Promise<number | null>((resolve) => paused.once("exit", resolve));
    t.after(async () => {
      if (paused.exitCode === null) paused.kill("SIGKILL");
      await exited;
    });
    const said: Array<Record<string, unknown>> = [];
    createInterface({ input: paused.stdout }).on("line", (line) =>
      said.push(JSON.parse(line) as Record<string, unknown>),
    );
    let stderr = "";
    paused.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
    const next = (index: number) =>
      eventually(`the paused holder's line ${index + 1}`, () => {
        if (paused.exitCode !== null && said.length <= index) throw new Error(`it ended: ${stderr}`);
        return said[index];
      });
    const ready = await next(0);
    assert.equal(ready.gate, true, "its own gate was open when it read the plan");

    // Paused between its gate and its write, for longer than its lease.
    paused.kill("SIGSTOP");
    const nc = await connect({ servers: natsUrl });
    const store = await openStore(location.url, { historyLimit: 5 });
    t.after(async () => {
      await (await jetstreamManager(nc)).streams.delete(`KV_${bucket}`);
      await nc.close();
      await store.close();
      await location.cleanup();
    });
    const successor = new LeaseHolder({
      backend: await NatsKvLease.open(nc, ttlMs, bucket),
      epochs: store.epochs,
      timings: { renewEveryMs: 500, ttlMs, marginMs: 300 },
      holder: { id: "successor", host: "test", pid: process.pid, taken_at: new Date().toISOString() },
      log: createLogger({ level: "error" }),
    });
    await eventually("the successor to take the lease once the paused one's ages out", async () =>
      (await successor.tryTake()) ? true : undefined,
    );
    assert.ok((successor.epoch ?? 0) > Number(ready.epoch));

    paused.kill("SIGCONT");
    paused.stdin.write("write\n");
    const answer = await next(1);
    assert.equal(answer.refused, "fenced", JSON.stringify(answer));
    assert.match(
      String(answer.message),
      new RegExp(`epoch ${String(ready.epoch)} is below the floor ${String(successor.epoch)}`),
    );
    assert.equal(await store.plans.newest(), Number(ready.expected), "nothing was written");
    // The successor writes at its own epoch.
    assert.equal(
      await store.plans.write({
        expected: Number(ready.expected),
        plan: '{"units":[]}',
        at: new Date().toISOString(),
        by: "successor",
        epoch: successor.epoch ?? 0,
      }),
      Number(ready.expected) + 1,
    );
    await successor.release();
    assert.equal(await exited, 0);
  });
}
