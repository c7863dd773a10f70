/**
 * The overlay end to end: `mesh serve` on an operator's nats-server listening on a bridge, three nodes each in its
 * own network namespace running `mesh-host` (wireguard-go on a TUN device: this machine has no WireGuard module),
 * one plan with an overlay. Node A pings node C over the overlay; C is retired and the ping stops, with nobody
 * touching A.
 */
import assert from "node:assert/strict";
import { execFile, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { freePort, startNatsServer } from "../../src/bus/index.js";
import type { RunningNatsServer } from "../../src/bus/index.js";
import { writeNatsServerConfig } from "../../src/bus/nats/server.js";
import { mesh } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin, startCommand, wireguardGoPids } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

const root = new URL("../../", import.meta.url).pathname;
const probe = spawnSync("ip", ["netns", "list"], { encoding: "utf8" });
const skip =
  process.getuid?.() !== 0
    ? "needs root for network namespaces"
    : probe.status !== 0
      ? `ip netns is unavailable: ${probe.stderr.trim()}`
      : false;

const run = (command: string, args: readonly string[]) =>
  new Promise<string>((resolve, reject) =>
    execFile(command, args, { encoding: "utf8" }, (error, stdout, stderr) =>
      error === null
        ? resolve(stdout)
        : reject(new Error(`${command} ${args.join(" ")}: ${stderr || error.message}`)),
    ),
  );

const tag = randomBytes(3).toString("hex");
const subnet = `10.202.${(parseInt(tag.slice(0, 2), 16) % 250) + 1}`;
const bridge = `mbr${tag}`;
const overlayIface = `mo${tag}`;
const nodes = ["a", "b", "c"].map((letter, index) => ({
  name: `ov-${letter}`,
  ns: `mesh-e2e-${tag}-${letter}`,
  veth: `mv${tag}${letter}`,
  underlay: `${subnet}.${index + 2}`,
}));

function pings(from: string, to: string): Promise<boolean> {
  return new Promise((resolve) =>
    execFile("ip", ["netns", "exec", from, "ping", "-c", "1", "-W", "1", to], (error) =>
      resolve(error === null),
    ),
  );
}

describe("overlay (nats, network namespaces)", { skip }, () => {
  const dir = tempDir("mesh-overlay-e2e-");
  const data = join(dir.path, "data");
  let server: RunningNatsServer | undefined;
  let serve: Running | undefined;
  const agents: Running[] = [];
  const cli = (args: readonly string[]) => mesh(["--data", data, ...args]);

  before(async () => {
    await run("ip", ["link", "add", bridge, "type", "bridge"]);
    await run("ip", ["address", "add", `${subnet}.1/24`, "dev", bridge]);
    await run("ip", ["link", "set", bridge, "up"]);
    for (const node of nodes) {
      await run("ip", ["netns", "add", node.ns]);
      await run("ip", ["link", "add", node.veth, "type", "veth", "peer", "name", "u0", "netns", node.ns]);
      await run("ip", ["link", "set", node.veth, "master", bridge, "up"]);
      await run("ip", ["-n", node.ns, "address", "add", `${node.underlay}/24`, "dev", "u0"]);
      await run("ip", ["-n", node.ns, "link", "set", "u0", "up"]);
      await run("ip", ["-n", node.ns, "link", "set", "lo", "up"]);
    }
    // The broker on the bridge, where the namespaces reach it; configured as an operator configures one.
    const printed = await cli(["broker", "config", "--json"]);
    assert.equal(printed.code, 0, printed.stderr);
    const fragment = JSON.parse(printed.stdout) as {
      operator: string;
      system_account: string;
      resolver_preload: Record<string, string>;
    };
    const listen = { host: `${subnet}.1`, port: await freePort() };
    const config = writeNatsServerConfig({
      dir: join(dir.path, "nats"),
      ...listen,
      operatorJwt: fragment.operator,
      systemAccount: fragment.system_account,
      accounts: fragment.resolver_preload,
    });
    server = await startNatsServer(config, listen, join(dir.path, "nats.log"));
    serve = startBin("mesh", ["--data", data, "--out-of-touch-after", "1m", "serve", "--broker", server.url]);
    const started = serve;
    await eventually("serve to act", () => (/control\.serving/.test(started.stderr()) ? true : undefined));
  });

  after(async () => {
    for (const agent of agents) await agent.stop("SIGTERM");
    await serve?.stop();
    await server?.stop();
    for (const node of nodes) {
      await run("ip", ["netns", "del", node.ns]).catch((error: unknown) => console.error(String(error)));
    }
    await run("ip", ["link", "del", bridge]).catch((error: unknown) => console.error(String(error)));
    for (const pid of wireguardGoPids(overlayIface)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch (error) {
        // Ended by itself since it was found.
        if ((error as NodeJS.ErrnoException).code !== "ESRCH") throw error;
      }
    }
    const socket = `/var/run/wireguard/${overlayIface}.sock`;
    if (existsSync(socket)) rmSync(socket, { force: true });
    dir.remove();
  });

  test("overlay — A pings C over the overlay the plan declares; C retired, the ping stops", async () => {
    for (const node of nodes) {
      const token = JSON.parse((await cli(["token", "issue", node.name, "--json"])).stdout) as {
        token: string;
      };
      const state = join(dir.path, node.name);
      // Joined from the node's own namespace: the broker is on the bridge.
      const joined = await runIn(node.ns, "mesh-host", [
        "join",
        token.token,
        "--state",
        state,
        "--label",
        `overlay-endpoint=${node.underlay}:51820`,
      ]);
      assert.equal(joined.code, 0, joined.stderr);
      const nodeRoot = join(dir.path, `${node.name}-root`);
      mkdirSync(nodeRoot);
      agents.push(
        startIn(node.ns, [
          join(root, "bin", "mesh-host.js"),
          "run",
          "--state",
          state,
          "--root",
          nodeRoot,
          "--alive-every",
          "300ms",
        ]),
      );
    }
    const plan = join(dir.path, "plan.yaml");
    writeFileSync(
      plan,
      `units: []\noverlay: {cidr: 10.99.${subnet.split(".")[2]}.0/24, interface: ${overlayIface}}\n`,
    );
    const applied = await cli(["plan", "apply", "-f", plan, "--wait", "--timeout", "120s"]);
    assert.equal(applied.code, 0, applied.stderr + applied.stdout);
    const overlayOf = (index: number) => `10.99.${subnet.split(".")[2]}.${index + 1}`;
    const [a, , c] = nodes;
    assert.ok(a !== undefined && c !== undefined);
    await eventually(
      "A to ping C over the overlay",
      async () => ((await pings(a.ns, overlayOf(2))) ? true : undefined),
      120_000,
    );

    // C retired: the control plane composes A's and B's peers again by itself, and the tunnel to C is gone.
    const retired = await cli(["node", "retire", c.name]);
    assert.equal(retired.code, 0, retired.stderr);
    await eventually(
      "the ping from A to C to stop",
      async () => ((await pings(a.ns, overlayOf(2))) ? undefined : true),
      120_000,
    );
    // B was never pinged before: its first packet waits for a handshake, so this too is awaited.
    await eventually(
      "A to still reach B",
      async () => ((await pings(a.ns, overlayOf(1))) ? true : undefined),
      120_000,
    );
  });
});

/** Runs a built executable inside a network namespace to its end. */
function runIn(
  ns: string,
  bin: "mesh" | "mesh-host",
  args: readonly string[],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      "ip",
      ["netns", "exec", ns, process.execPath, join(root, "bin", `${bin}.js`), ...args],
      { encoding: "utf8", env: { ...process.env, MESH_HOME: "" } },
      (error, stdout, stderr) =>
        resolve({ code: error === null ? 0 : ((error.code as number | null) ?? 1), stdout, stderr }),
    );
  });
}

/** Starts a Node script inside a network namespace, kept running until stopped. */
function startIn(ns: string, args: readonly string[]): Running {
  // Each node in its own mount namespace too, with its own /var/run/wireguard: the machines this stands for do not
  // share wireguard-go's control sockets, and one interface name on all three must not collide.
  mkdirSync("/var/run/wireguard", { recursive: true });
  const inside = 'mount -t tmpfs tmpfs /var/run/wireguard && exec "$@"';
  const command = [
    "netns",
    "exec",
    ns,
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    inside,
    "sh",
  ];
  return startCommand("ip", [...command, process.execPath, ...args]);
}
