/**
 * A whole mesh run through its built executables, on either broker, as a fixture for one end-to-end scenario:
 * `mesh up` with its own nats-server in operator mode, or `mesh up --broker amqp://…` on a scratch vhost of the
 * machine's RabbitMQ. Each test opens a fleet of its own (its own data dir, control plane, nodes and agents) and the
 * fleet is closed when that test ends, so no test depends on another's nodes, processes or order.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type { TestContext } from "node:test";
import amqp from "amqplib";
import type { Channel, ChannelModel } from "amqplib";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import { openNatsIdentities } from "../../src/bus/index.js";
import { nodeQueue } from "../../src/link/index.js";
import type { Run } from "./cli.js";
import { mesh, meshHost, runScript } from "./cli.js";
import type { Running } from "./processes.js";
import { eventually, startBin, startScript } from "./processes.js";
import type { ScratchVhost } from "./rabbit.js";
import { scratchVhost } from "./rabbit.js";
import { tempDir } from "./tmp.js";

export type BrokerName = "nats" | "amqp";

/** `mesh node show --json`. */
export interface Shown {
  state: string;
  liveness: string;
  last_seen: string | null;
  declaration: { sequence: number; epoch: number; digest: string } | null;
  account: {
    outcome: string;
    reason: string | null;
    sequence: number | null;
    report_sequence: number | null;
    received_at: string;
    items: Array<{ id: string; state: string }>;
  } | null;
  refused: Record<string, number>;
}

/** `mesh node list --json`. */
export interface Listed {
  name: string;
  state: string;
  liveness: string;
}

/** What `mesh-host join` leaves in the state dir: the node's name and its own broker identity. */
export interface NodeIdentity {
  node: string;
  broker: {
    url: string;
    credential:
      | { type: "amqp"; username: string; password: string }
      | { type: "nats"; jwt: string; [key: string]: unknown };
  };
}

/** RabbitMQ seen from the administrator's side: accounts, queues and connections as the broker has them. */
export interface RabbitView {
  scratch: ScratchVhost;
  /** The administrator on the scratch vhost. */
  observer: ChannelModel;
  /** The URL nodes are given (no one's credentials in it). */
  nodeUrl: string;
  /** The mesh's broker accounts that exist now, by role and node. */
  accounts(role: "token" | "node", node: string): Promise<string[]>;
  /** A queue's depth and consumers now (the management API's figures lag by seconds), or undefined if absent. */
  queueNow(queue: string): Promise<{ messageCount: number; consumerCount: number } | undefined>;
}

/**
 * The executables of an installed package (bin/mesh.js, bin/mesh-host.js, each in the package it came in), run
 * from that package's own directory instead of the project's build.
 */
export interface InstalledBins {
  mesh: string;
  meshHost: string;
}

export interface FleetOptions {
  /** The control plane's out-of-touch threshold (default 1m). */
  outOfTouchAfter?: string;
  /** Run `mesh` and `mesh-host` from an installed package (default: the project's build). */
  bins?: InstalledBins;
}

export interface Fleet {
  broker: BrokerName;
  /** A temp dir for the nodes' state dirs, roots and declaration files. */
  dir: string;
  /** The control plane's data dir. */
  data: string;
  up: Running;
  /** The broker's address as the control plane holds it (for NATS, what `mesh up` printed). */
  brokerUrl: string;
  /** RabbitMQ's side of things; undefined on NATS. */
  rabbit: RabbitView | undefined;
  cli(args: readonly string[]): Promise<Run>;
  /** Runs `mesh-host` (the fleet's own: the project's, or the installed package's). */
  host(args: readonly string[]): Promise<Run>;
  show(node: string): Promise<Shown>;
  list(): Promise<Listed[]>;
  issue(node: string, ttl?: string): Promise<string>;
  /**
   * Starts `mesh-host run` (alive every 200 ms); it is stopped when the test `t` ends, if given, and at the latest
   * when the fleet closes.
   */
  runAgent(state: string, root?: string, t?: TestContext): Running;
  declareFiles(
    node: string,
    files: Array<{ path: string; content: string; mode?: string }>,
  ): Promise<{ node: string; sequence: number; epoch: number }>;
  identityOf(state: string): NodeIdentity;
  /** Puts raw bytes on a node's own queue as a declaration, with the control plane's (or the administrator's) rights. */
  sendToNode(node: string, body: Uint8Array): Promise<void>;
  close(): Promise<void>;
}

/** The channel's end as the broker states it: the close reason amqplib reports, or a timeout. */
export function channelEnd(channel: Channel, ms = 30_000): Promise<string> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve("the channel stayed open"), ms);
    channel.once("error", (error: Error) => {
      clearTimeout(timer);
      resolve(error.message);
    });
  });
}

/** Resolves with the process's exit code, or "still running" after `ms` (a generous deadline, not a measurement). */
export function exitWithin(process: Running, ms = 60_000): Promise<number | null | "still running"> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    process.exited,
    new Promise<"still running">((resolve) => (timer = setTimeout(() => resolve("still running"), ms))),
  ]).finally(() => clearTimeout(timer));
}

/** The pid of the control plane under the fleet's `mesh up`: its child `mesh serve --under-up`. */
export function controlPlanePid(fleet: Fleet): number {
  const pids = execFileSync("pgrep", ["-P", String(fleet.up.child.pid), "-f", "serve --under-up"], {
    encoding: "utf8",
  })
    .trim()
    .split("\n")
    .map(Number);
  assert.equal(pids.length, 1, `one control plane under mesh up: ${pids.join(", ")}`);
  return pids[0] as number;
}

/** A fleet of the test `t`'s own, closed when `t` ends. */
export async function fleetForTest(
  t: TestContext,
  broker: BrokerName,
  options: FleetOptions = {},
): Promise<Fleet> {
  const opened: { fleet?: Fleet } = {};
  t.after(() => opened.fleet?.close());
  opened.fleet = await openFleet(broker, options);
  return opened.fleet;
}

/**
 * Starts a mesh on `broker`; `close()` stops it (agents first, then `mesh up`, whose exit code must be 0, then the
 * broker's scratch space). It returns once the control plane serves. `outOfTouchAfter` is the control plane's
 * threshold; the default is generous so that "here" does not depend on how busy the machine is. A test about going
 * out of touch gives a short one.
 */
export async function openFleet(broker: BrokerName, options: FleetOptions = {}): Promise<Fleet> {
  const { bins } = options;
  // An installed executable runs from its package's directory (bin/x.js → the package), never the project's.
  const packageOf = (script: string) => resolve(script, "..", "..");
  const startMesh = (args: readonly string[]) =>
    bins === undefined ? startBin("mesh", args) : startScript(bins.mesh, args, { cwd: packageOf(bins.mesh) });
  const startHost = (args: readonly string[]) =>
    bins === undefined
      ? startBin("mesh-host", args)
      : startScript(bins.meshHost, args, { cwd: packageOf(bins.meshHost) });
  const temp = tempDir(`mesh-e2e-${broker}-`);
  const dir = temp.path;
  const data = join(dir, "data");
  const agents: Running[] = [];
  let up: Running | undefined;
  let scratch: ScratchVhost | undefined;
  let observer: ChannelModel | undefined;
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    for (const agent of agents) await agent.stop("SIGTERM");
    const code = await up?.stop();
    await observer?.close();
    await scratch?.drop();
    temp.remove();
    if (up !== undefined) assert.equal(code, 0, up.stderr());
  };
  try {
    return await start();
  } catch (error) {
    await close().catch(() => undefined);
    throw error;
  }

  async function start(): Promise<Fleet> {
    const threshold = options.outOfTouchAfter ?? "1m";
    let brokerUrl: string;
    let rabbit: RabbitView | undefined;
    if (broker === "nats") {
      up = startMesh(["--data", data, "--out-of-touch-after", threshold, "up", "--nats-port", "0"]);
      const started = up;
      brokerUrl = await eventually(
        "mesh up to print its broker",
        () => /broker\s+(nats:\/\/\S+)/.exec(started.stdout())?.[1],
        60_000,
      );
    } else {
      scratch = await scratchVhost();
      const vhost = scratch;
      const admin = await amqp.connect(vhost.url);
      observer = admin;
      const queueNow: RabbitView["queueNow"] = async (queue) => {
        const channel = await admin.createChannel();
        const end = channelEnd(channel);
        const checked = await channel.checkQueue(queue).then(
          (found) => found,
          (error: unknown) => {
            if (!/404 \(NOT-FOUND\)/.test(String(error))) throw error;
            return undefined;
          },
        );
        if (checked === undefined) assert.match(await end, /404 \(NOT-FOUND\)/);
        else await channel.close();
        return checked;
      };
      rabbit = {
        scratch: vhost,
        observer: admin,
        nodeUrl: `amqp://127.0.0.1:5672/${encodeURIComponent(vhost.vhost)}`,
        accounts: async (role, node) =>
          (await vhost.api.users()).filter((user) =>
            user.startsWith(`${vhost.users.prefix}.${role}.${node}.`),
          ),
        queueNow,
      };
      brokerUrl = vhost.url;
      up = startMesh(["--data", data, "--out-of-touch-after", threshold, "up", "--broker", vhost.url]);
      const started = up;
      await eventually(
        "mesh up to say it is up",
        () =>
          /The mesh is up\.\n\s+broker\s+amqp:\/\/\S+ \(RabbitMQ\)/.test(started.stdout()) ? true : undefined,
        60_000,
      );
    }
    const running = up;
    // It says it is up before it holds the lease; it serves once it consumes the control queue.
    await eventually(
      "the control plane to serve",
      async () =>
        /control\.serving/.test(running.stderr()) &&
        (rabbit === undefined || (await rabbit.queueNow("control"))?.consumerCount === 1)
          ? true
          : undefined,
      60_000,
    );

    const cli = (args: readonly string[]) =>
      bins === undefined
        ? mesh(["--data", data, ...args])
        : runScript(bins.mesh, ["--data", data, ...args], { cwd: packageOf(bins.mesh) });
    const host = (args: readonly string[]) =>
      bins === undefined ? meshHost(args) : runScript(bins.meshHost, args, { cwd: packageOf(bins.meshHost) });
    let declarations = 0;
    const fleet: Fleet = {
      broker,
      dir,
      data,
      up: running,
      brokerUrl,
      rabbit,
      cli,
      host,
      async show(node) {
        const run = await cli(["node", "show", node, "--json"]);
        assert.equal(run.code, 0, run.stderr);
        return JSON.parse(run.stdout) as Shown;
      },
      async list() {
        const run = await cli(["node", "list", "--json"]);
        assert.equal(run.code, 0, run.stderr);
        return JSON.parse(run.stdout) as Listed[];
      },
      async issue(node, ttl = "1h") {
        const run = await cli(["token", "issue", node, "--ttl", ttl, "--json"]);
        assert.equal(run.code, 0, run.stderr);
        return (JSON.parse(run.stdout) as { token: string }).token;
      },
      runAgent(state, root, t) {
        const rootArgs = root === undefined ? [] : ["--root", root];
        const agent = startHost(["run", "--state", state, ...rootArgs, "--alive-every", "200ms"]);
        agents.push(agent);
        t?.after(async () => {
          await agent.stop("SIGTERM");
        });
        return agent;
      },
      async declareFiles(node, files) {
        declarations += 1;
        const file = join(dir, `decl-${declarations}.json`);
        writeFileSync(file, JSON.stringify({ files }));
        const run = await cli(["declare", node, "-f", file, "--json"]);
        assert.equal(run.code, 0, run.stderr);
        return JSON.parse(run.stdout) as { node: string; sequence: number; epoch: number };
      },
      identityOf: (state) => JSON.parse(readFileSync(join(state, "identity.json"), "utf8")) as NodeIdentity,
      async sendToNode(node, body) {
        if (observer !== undefined) {
          const channel = await observer.createConfirmChannel();
          channel.publish("", nodeQueue(node), Buffer.from(body), {
            persistent: true,
            type: "declaration",
            contentType: "application/json",
          });
          await channel.waitForConfirms();
          await channel.close();
          return;
        }
        const record = openNatsIdentities(data, brokerUrl);
        try {
          const identity = await record.controlIdentity();
          const nc = await connect({
            servers: brokerUrl,
            authenticator: jwtAuthenticator(identity.jwt, new TextEncoder().encode(identity.seed)),
          });
          try {
            nc.publish(`node.${node}.declaration`, body);
            await nc.flush();
          } finally {
            await nc.close();
          }
        } finally {
          await record.close();
        }
      },
      close,
    };
    return fleet;
  }
}
