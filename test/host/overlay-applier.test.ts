/**
 * The overlay applier over real tunnels: three network namespaces on one bridged underlay, each running the applier
 * inside it (test/support/overlay-node.ts), and pings across the overlay. wireguard-go stands in where the kernel has
 * no WireGuard; scripts/test installs it and wireguard-tools.
 */
import assert from "node:assert/strict";
import { execFile, spawn, spawnSync } from "node:child_process";
import { randomBytes, randomInt } from "node:crypto";
import { existsSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { z } from "zod";
import type { Drift, ItemResult } from "../../src/host/appliers.js";
import { HostState } from "../../src/host/state.js";
import type { DeclaredItem } from "../../src/link/index.js";
import { eventually, wireguardGoPids } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

type OverlayItem = Extract<DeclaredItem, { type: "overlay" }>;

const root = new URL("../../", import.meta.url).pathname;
const nodeScript = join(root, "test", "support", "overlay-node.ts");
const socketDir = "/var/run/wireguard";
const listenPort = 51820;
// A guard against a hang, not a measurement: handshakes on a busy machine can take a while.
const deadlineMs = 120_000;

const netnsProbe = spawnSync("ip", ["netns", "list"], { encoding: "utf8" });
const skip =
  process.getuid?.() !== 0
    ? "needs root to make network namespaces and interfaces"
    : netnsProbe.status !== 0
      ? `ip netns is unavailable: ${netnsProbe.error?.message ?? netnsProbe.stderr.trim()}`
      : false;

// Unique per run: namespaces, and interface names too, since wireguard-go's control sockets share one directory
// across namespaces (/var/run/wireguard/<interface>.sock).
const run = randomBytes(3).toString("hex");
const subnet = randomInt(0, 256);
const hub = `mesh-ov-${run}-hub`;

interface Node {
  letter: "a" | "b" | "c";
  ns: string;
  iface: string;
  underlay: string;
  overlay: string;
  stateDir: string;
  publicKey: string;
}

const scratch = skip === false ? tempDir("mesh-overlay-applier-") : undefined;
const nodes: Node[] = (["a", "b", "c"] as const).map((letter, index) => ({
  letter,
  ns: `mesh-ov-${run}-${letter}`,
  iface: `ov${run}${letter}`,
  underlay: `10.201.${subnet}.${index + 1}`,
  overlay: `10.99.${subnet}.${index + 1}`,
  stateDir: join(scratch?.path ?? "/nonexistent", letter),
  publicKey: "",
}));
const [nodeA, nodeB, nodeC] = nodes as [Node, Node, Node];
/** Interfaces in b's namespace for the refusal cases: one made by hand, one the applier tries without its tools. */
const foreignIface = `ov${run}f`;
const toollessIface = `ov${run}t`;

/** Runs a command without a shell; rejects with its stderr when it fails. */
function sh(command: string, args: readonly string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { encoding: "utf8" }, (error, stdout, stderr) => {
      if (error === null) resolve(stdout);
      else
        reject(
          new Error(`${command} ${args.join(" ")}: ${stderr.trim() || error.message}`, { cause: error }),
        );
    });
  });
}

/** True when one ping across the overlay from `from` to `to` gets its answer. */
function pings(from: Node, to: Node): Promise<boolean> {
  return new Promise((resolve) => {
    execFile("ip", ["netns", "exec", from.ns, "ping", "-c", "1", "-W", "2", to.overlay], (error) =>
      resolve(error === null),
    );
  });
}

/** Runs the applier inside the node's namespace with one request on stdin; returns its answer. */
async function inNode(
  node: Node,
  request: Record<string, unknown>,
  path: string | undefined = process.env.PATH,
): Promise<unknown> {
  const argv = ["netns", "exec", node.ns, "/usr/bin/env", `PATH=${path ?? ""}`, process.execPath];
  const child = spawn("ip", [...argv, "--import", "tsx", nodeScript], {
    cwd: root,
    stdio: ["pipe", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
  child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString("utf8")));
  child.stdin.end(JSON.stringify({ stateDir: node.stateDir, ...request }));
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (exit) => resolve(exit));
  });
  assert.equal(code, 0, `overlay node ${node.letter} failed (${String(code)}): ${err}`);
  return JSON.parse(out);
}

const resultsSchema = z.object({
  results: z.array(z.object({ id: z.string(), state: z.string(), reason: z.string().optional() })),
});
const driftsSchema = z.object({ drifts: z.array(z.object({ id: z.string(), what: z.string() })) });
const linkSchema = z.object({
  link: z
    .object({ ifindex: z.number(), driver: z.union([z.string(), z.object({ other: z.string() })]) })
    .nullable(),
});

/** Applies `items` in the node's namespace; `path` is the PATH the applier finds its tools on. */
async function apply(node: Node, items: OverlayItem[], path?: string): Promise<ItemResult[]> {
  return resultsSchema.parse(await inNode(node, { action: "apply", items }, path)).results as ItemResult[];
}

async function verify(node: Node, items: OverlayItem[]): Promise<Drift[]> {
  return driftsSchema.parse(await inNode(node, { action: "verify", items })).drifts;
}

async function linkOf(node: Node): Promise<z.infer<typeof linkSchema>["link"]> {
  return linkSchema.parse(await inNode(node, { action: "link", interface: node.iface })).link;
}

/** The node's overlay item, with the given nodes as its peers. */
function overlayOf(node: Node, peers: readonly Node[]): OverlayItem {
  return {
    id: `overlay:${node.iface}`,
    type: "overlay",
    interface: node.iface,
    address: `${node.overlay}/24`,
    listen_port: listenPort,
    peers: peers.map((peer) => ({
      node: `node-${peer.letter}`,
      public_key: peer.publicKey,
      allowed_ips: [`${peer.overlay}/32`],
      endpoint: `${peer.underlay}:${listenPort}`,
    })),
  };
}

function others(node: Node): Node[] {
  return nodes.filter((other) => other !== node);
}

function assertApplied(results: readonly ItemResult[], node: Node): void {
  assert.deepEqual(
    results.map((result) => [result.id, result.state, result.reason]),
    [[`overlay:${node.iface}`, "applied", undefined]],
  );
}

async function namespaces(): Promise<Set<string>> {
  const listed = await sh("ip", ["netns", "list"]);
  return new Set(listed.split("\n").map((line) => line.split(" ")[0] ?? ""));
}

describe("overlay applier", { skip }, () => {
  before(async () => {
    for (const ns of [hub, ...nodes.map((node) => node.ns)]) await sh("ip", ["netns", "add", ns]);
    await sh("ip", ["-n", hub, "link", "add", "br0", "type", "bridge"]);
    await sh("ip", ["-n", hub, "link", "set", "br0", "up"]);
    for (const node of nodes) {
      const hubSide = `v${node.letter}`;
      await sh("ip", [
        "-n",
        hub,
        "link",
        "add",
        hubSide,
        "type",
        "veth",
        "peer",
        "name",
        "u0",
        "netns",
        node.ns,
      ]);
      await sh("ip", ["-n", hub, "link", "set", hubSide, "master", "br0", "up"]);
      await sh("ip", ["-n", node.ns, "address", "add", `${node.underlay}/24`, "dev", "u0"]);
      await sh("ip", ["-n", node.ns, "link", "set", "u0", "up"]);
      await sh("ip", ["-n", node.ns, "link", "set", "lo", "up"]);
      // The key a node makes at join, in its state directory, where the applier reads it.
      node.publicKey = new HostState(node.stateDir).nodeKeys().overlayPublicKey;
    }
  });

  // Everything this file made, each step tried even when an earlier one failed; the failures are reported together.
  after(async () => {
    const failures: unknown[] = [];
    const attempt = async (step: () => Promise<unknown> | void): Promise<void> => {
      try {
        await step();
      } catch (error) {
        failures.push(error);
      }
    };
    const present = await namespaces();
    const made = [
      ...nodes.map((node) => ({ ns: node.ns, iface: node.iface })),
      { ns: nodeB.ns, iface: foreignIface },
      { ns: nodeB.ns, iface: toollessIface },
    ];
    for (const { ns, iface } of made) {
      if (present.has(ns)) {
        const links = await sh("ip", ["-n", ns, "-o", "link", "show"]);
        if (links.includes(`: ${iface}:`)) await attempt(() => sh("ip", ["-n", ns, "link", "del", iface]));
      }
      for (const pid of wireguardGoPids(iface)) await attempt(() => void process.kill(pid, "SIGKILL"));
      const socket = join(socketDir, `${iface}.sock`);
      if (existsSync(socket)) await attempt(() => rmSync(socket, { force: true }));
    }
    for (const ns of [...nodes.map((node) => node.ns), hub]) {
      if (present.has(ns)) await attempt(() => sh("ip", ["netns", "del", ns]));
    }
    scratch?.remove();
    if (failures.length > 0) throw new AggregateError(failures, "overlay test clean-up failed in part");
  });

  test("overlay — three nodes reach each other over real tunnels", async () => {
    for (const node of nodes) assertApplied(await apply(node, [overlayOf(node, others(node))]), node);
    await eventually(
      `${nodeA.ns} to ping ${nodeC.overlay}`,
      async () => ((await pings(nodeA, nodeC)) ? true : undefined),
      deadlineMs,
    );
    await eventually(
      `${nodeB.ns} to ping ${nodeA.overlay}`,
      async () => ((await pings(nodeB, nodeA)) ? true : undefined),
      deadlineMs,
    );
    for (const node of nodes) assert.deepEqual(await verify(node, [overlayOf(node, others(node))]), []);
    // The configuration holds the private key: the owner's alone.
    const config = statSync(join(nodeA.stateDir, "overlay", `${nodeA.iface}.conf`));
    assert.equal(config.mode & 0o777, 0o600);
  });

  test("overlay — an unchanged apply keeps the interface and its wireguard-go", async () => {
    const item = overlayOf(nodeA, others(nodeA));
    const before = await linkOf(nodeA);
    assert.ok(before !== null, "node a has no overlay interface");
    assert.ok(before.driver === "kernel" || before.driver === "wireguard-go", JSON.stringify(before));
    const daemons = wireguardGoPids(nodeA.iface);
    if (before.driver === "wireguard-go")
      assert.equal(daemons.length, 1, `wireguard-go processes: ${daemons.join(", ")}`);

    assertApplied(await apply(nodeA, [item]), nodeA);

    const afterward = await linkOf(nodeA);
    assert.equal(afterward?.ifindex, before.ifindex, "the interface was made again");
    assert.deepEqual(wireguardGoPids(nodeA.iface), daemons, "wireguard-go was restarted");
    assert.ok(await pings(nodeA, nodeC), "the tunnel to c dropped after an unchanged apply");
  });

  test("overlay — a retired peer can no longer be reached", async () => {
    assertApplied(await apply(nodeA, [overlayOf(nodeA, [nodeB])]), nodeA);
    assertApplied(await apply(nodeB, [overlayOf(nodeB, [nodeA])]), nodeB);

    await eventually(
      `${nodeA.ns} to stop reaching ${nodeC.overlay}`,
      async () => ((await pings(nodeA, nodeC)) ? undefined : true),
      deadlineMs,
    );
    assert.ok(await pings(nodeA, nodeB), "the tunnel between a and b dropped when c left");
    assert.deepEqual(await verify(nodeA, [overlayOf(nodeA, [nodeB])]), []);
    // Held against the old declaration, c is the peer that went missing.
    const drifts = await verify(nodeA, [overlayOf(nodeA, [nodeB, nodeC])]);
    assert.equal(drifts.length, 1);
    assert.match(drifts[0]?.what ?? "", /peers differ: 1 declared peers missing/);
  });

  test("overlay — verify reports a deleted interface and apply restores it", async () => {
    const item = overlayOf(nodeA, [nodeB]);
    await sh("ip", ["-n", nodeA.ns, "link", "del", nodeA.iface]);

    assert.deepEqual(await verify(nodeA, [item]), [
      { id: item.id, what: `interface ${nodeA.iface} is missing` },
    ]);
    assertApplied(await apply(nodeA, [item]), nodeA);
    assert.deepEqual(await verify(nodeA, [item]), []);
    await eventually(
      `${nodeA.ns} to ping ${nodeB.overlay} again`,
      async () => ((await pings(nodeA, nodeB)) ? true : undefined),
      deadlineMs,
    );
  });

  test("overlay — an interface no longer declared is taken down with its wireguard-go", async () => {
    assert.ok((await linkOf(nodeC)) !== null, "node c has no overlay interface to take down");

    assert.deepEqual(await apply(nodeC, []), []);

    assert.equal(await linkOf(nodeC), null);
    await eventually(
      `wireguard-go of ${nodeC.iface} to end`,
      () => (wireguardGoPids(nodeC.iface).length === 0 ? true : undefined),
      deadlineMs,
    );
    assert.equal(existsSync(join(nodeC.stateDir, "overlay", `${nodeC.iface}.conf`)), false);
  });

  test("overlay — an interface the mesh did not bring up is refused, not taken over", async () => {
    await sh("ip", ["-n", nodeB.ns, "link", "add", foreignIface, "type", "bridge"]);
    const item = { ...overlayOf(nodeB, [nodeA]), id: `overlay:${foreignIface}`, interface: foreignIface };

    const results = await apply(nodeB, [overlayOf(nodeB, [nodeA]), item]);

    assert.deepEqual(
      results.map((result) => [result.id, result.state]),
      [
        [`overlay:${nodeB.iface}`, "applied"],
        [item.id, "failed"],
      ],
    );
    assert.match(results[1]?.reason ?? "", /exists and was not brought up by the mesh/);
    // Untouched: still the bridge it was, without the overlay's address.
    const held = await sh("ip", ["-n", nodeB.ns, "-d", "address", "show", "dev", foreignIface]);
    assert.match(held, /bridge/);
    assert.doesNotMatch(held, /inet /);
  });

  test("overlay — without WireGuard's tools the item fails naming the package to install", async () => {
    const item = { ...overlayOf(nodeB, [nodeA]), id: `overlay:${toollessIface}`, interface: toollessIface };
    // ip stays on the PATH; wg and wireguard-go (in /usr/bin) do not.
    const toolless = "/usr/sbin:/sbin";
    assert.ok(existsSync("/usr/sbin/ip") || existsSync("/sbin/ip"), "ip is not in /usr/sbin or /sbin");

    const results = await apply(nodeB, [overlayOf(nodeB, [nodeA]), item], toolless);

    const failed = results.find((result) => result.id === item.id);
    assert.equal(failed?.state, "failed", JSON.stringify(results));
    // wireguard-go where the kernel has no WireGuard; wg where it has (the interface is made, then not configured).
    assert.match(failed?.reason ?? "", /install Debian's (wireguard-go|wireguard-tools) package/);
    // b's own interface is there already, but configuring it needs wg.
    assert.deepEqual(
      results.find((result) => result.id === `overlay:${nodeB.iface}`),
      {
        id: `overlay:${nodeB.iface}`,
        state: "failed",
        reason: `${nodeB.iface}: wg is not installed: install Debian's wireguard-tools package`,
      },
    );
  });
});
