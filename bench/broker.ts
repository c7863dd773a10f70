/**
 * The broker a bench runs on, and what the bench does on it beside the mesh: the baselines (the same client library
 * with nothing of the mesh on top) and the plumbing of the ingest part. NATS is an operator-mode nats-server of the
 * bench's own; RabbitMQ is the machine's broker, in a vhost of the bench's own that is deleted afterwards.
 */
import { randomBytes } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import type { ChannelModel } from "amqplib";
import amqp from "amqplib";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import type { ConsumerInfo } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { NodeBus } from "../src/bus/index.js";
import {
  freePort,
  openEnrolmentSide,
  openNatsIdentities,
  openNodeSide,
  RabbitManagement,
  startNatsServer,
} from "../src/bus/index.js";
import { MeshUsers } from "../src/bus/amqp/users.js";
import { BusError } from "../src/bus/errors.js";
import { openLabConnection } from "../src/bus/lab.js";
import { writeNatsServerConfig } from "../src/bus/nats/server.js";
import type { HostIdentity } from "../src/host/state.js";
import { declarationChunk } from "../src/control/declarations.js";
import { controlQueue, declarationSubject, decodeToken } from "../src/link/index.js";
import { errorText } from "../src/log.js";
import { stopWhenInterrupted } from "./interrupt.js";
import { meshCli } from "./mesh.js";

export type BrokerKind = "nats" | "amqp";

export interface BenchBroker {
  kind: BrokerKind;
  /** What `mesh serve --broker` is given. */
  url: string;
  /** The broker's name and version, for the results. */
  version: string;
  /** The broker's process, for its CPU; undefined when it cannot be told apart. */
  pid: number | undefined;
  /**
   * Set when the bench restarted the machine's broker with a higher file-descriptor limit for its run (RabbitMQ:
   * one connection per node); `stop` restarts it with the limit it had.
   */
  fdLimitRaised?: { from: number; to: number };
  /** The broker's share of a join: a token's identity connecting as the mesh connects it, and leaving. */
  connectAndLeave(token: string): Promise<void>;
  /**
   * Where the broker itself does more for a join than take connections (RabbitMQ: an account, its permissions
   * and a queue, made through its management API), all of the broker's work for join number `index`, with the
   * client libraries alone: the token's identity connects and leaves, the account and queue are made as the
   * control plane makes them, and the new account connects, reads its queue and leaves. `clear` deletes what the
   * joins of these numbers made, so the mesh is measured on a broker holding only its own.
   */
  joinAlone?: {
    one(token: string, index: number): Promise<void>;
    clear(indexes: readonly number[]): Promise<void>;
  };
  /** Publishes `count` copies of `body` with the client library alone, as the control plane; returns the ms. */
  publishRaw(count: number, body: Uint8Array): Promise<number>;
  /** Messages waiting in the control queue (read while no control plane consumes it). */
  queued(): Promise<number>;
  /** Drains the control queue with the client library alone: consume, acknowledge, count. */
  drainRaw(): Promise<Drained>;
  /**
   * Connects as each node, ready to send: opened first, so that sending costs no connection's set-up (the ingest
   * part stops serve while a backlog is sent, and keeps that stop short).
   */
  openAsNodes(nodes: readonly string[], identityOf: (node: string) => HostIdentity): Promise<AsNodes>;
  stop(): Promise<void>;
}

/** Connections as each of a set of nodes. */
export interface AsNodes {
  /** Sends, as each node, what `send` sends on that node's bus. */
  send(send: (node: string, bus: NodeBus) => Promise<void>): Promise<void>;
  close(): Promise<void>;
}

/** Opens every connection `open` makes, `together` at a time; should one fail, those opened are closed. */
async function openAll<T extends { close(): Promise<void> }>(
  count: number,
  together: number,
  open: (index: number) => Promise<T>,
): Promise<T[]> {
  const opened: T[] = [];
  try {
    for (let i = 0; i < count; i += together) {
      const indexes = Array.from({ length: Math.min(together, count - i) }, (_, k) => i + k);
      // Each open in a promise of its own: one that throws at once fails like one that rejects.
      const settled = await Promise.allSettled(indexes.map((index) => Promise.resolve(index).then(open)));
      for (const one of settled) if (one.status === "fulfilled") opened.push(one.value);
      const failure = settled.find((one) => one.status === "rejected");
      if (failure !== undefined) throw failure.reason;
    }
  } catch (error) {
    // The open's failure is what is thrown; a close failing after it would only hide it.
    await Promise.allSettled(opened.map((one) => one.close()));
    throw error;
  }
  return opened;
}

/** Closes every one of them, and then throws the first failure, if any. */
async function closeAll(all: readonly { close(): Promise<void> }[]): Promise<void> {
  const failure = (await Promise.allSettled(all.map((one) => one.close()))).find(
    (one) => one.status === "rejected",
  );
  if (failure !== undefined) throw failure.reason;
}

/** The machine's RabbitMQ, as the tests take it (MESH_BENCH_RABBITMQ, MESH_BENCH_RABBITMQ_API). */
const rabbitUrl = process.env.MESH_BENCH_RABBITMQ ?? "amqp://guest:guest@127.0.0.1:5672";
const rabbitApi = process.env.MESH_BENCH_RABBITMQ_API ?? "http://guest:guest@127.0.0.1:15672";

/** Which share of a drained backlog is taken as warm-up, before the steady rate is timed. */
export const warmUpShare = 0.2;

/** A drain timed whole, and over what follows its warm-up share. */
export interface Drained {
  messages: number;
  ms: number;
  steady: { messages: number; ms: number };
}

/** Times a drain of `total` messages as each one is counted. */
class DrainClock {
  private readonly started = performance.now();
  private counted = 0;
  private warm: { at: number; counted: number } | undefined;

  constructor(private readonly total: number) {}

  count(): void {
    this.counted++;
    if (this.warm === undefined && this.counted >= this.total * warmUpShare)
      this.warm = { at: performance.now(), counted: this.counted };
  }

  result(): Drained {
    const now = performance.now();
    const warm = this.warm ?? { at: this.started, counted: 0 };
    return {
      messages: this.counted,
      ms: now - this.started,
      steady: { messages: this.counted - warm.counted, ms: now - warm.at },
    };
  }
}

/** A connection to an operator-mode nats-server as the control plane's identity, as `mesh serve` makes one. */
export async function connectAsControl(data: string, url: string): Promise<NatsConnection> {
  const identities = openNatsIdentities(data, url);
  const identity = await identities.controlIdentity();
  await identities.close();
  return connect({
    servers: url,
    authenticator: jwtAuthenticator(identity.jwt, new TextEncoder().encode(identity.seed)),
  });
}

export async function startBenchBroker(
  kind: BrokerKind,
  data: string,
  dir: string,
  nodes = 0,
): Promise<BenchBroker> {
  return kind === "nats" ? startNats(data, dir) : startRabbit(nodes);
}

async function startNats(data: string, dir: string): Promise<BenchBroker> {
  const fragment = JSON.parse(meshCli(data, ["broker", "config", "--json"])) as {
    operator: string;
    system_account: string;
    resolver_preload: Record<string, string>;
  };
  const port = await freePort();
  mkdirSync(join(dir, "nats"), { recursive: true });
  const config = writeNatsServerConfig({
    dir: join(dir, "nats"),
    host: "127.0.0.1",
    port,
    operatorJwt: fragment.operator,
    systemAccount: fragment.system_account,
    accounts: fragment.resolver_preload,
  });
  const server = await startNatsServer(config, { host: "127.0.0.1", port }, join(dir, "nats.log"));
  const url = server.url;
  const streams = ["MESH_CONTROL", "MESH_ALIVE"];
  const control = () => connectAsControl(data, url);
  const { execFileSync } = await import("node:child_process");
  return {
    kind: "nats",
    url,
    version: execFileSync("/usr/sbin/nats-server", ["--version"], { encoding: "utf8" }).trim(),
    pid: server.pid === 0 ? undefined : server.pid,
    connectAndLeave: (token) => connectAndLeave(token),
    publishRaw: async (count, body) => {
      const nc = await control();
      // A publish the server refuses is told only as a status: any, and the baseline is no baseline.
      const refusals: string[] = [];
      void (async () => {
        for await (const status of nc.status())
          if (status.type === "error") refusals.push(status.error.message);
      })();
      const subjects = Array.from({ length: count }, (_, i) => declarationSubject(`bench-raw-${i}`));
      const started = performance.now();
      // Like for like: a declaration is a plain publish to its node's own subject, flushed a chunk at a time; these
      // name nodes that do not exist, so nobody hears them (the control plane's identity may publish nothing else).
      for (let start = 0; start < count; start += declarationChunk) {
        for (const subject of subjects.slice(start, start + declarationChunk)) nc.publish(subject, body);
        await nc.flush();
      }
      const ms = performance.now() - started;
      // The server tells a refusal before it answers the next ping.
      await nc.flush();
      await nc.close();
      if (refusals.length > 0) throw new Error(`the raw publish was refused: ${refusals[0] ?? ""}`);
      return ms;
    },
    queued: async () => {
      const nc = await control();
      try {
        const jsm = await jetstreamManager(nc);
        let total = 0;
        // Under interest retention a stream holds what its consumer has not acknowledged.
        for (const stream of streams) total += (await jsm.streams.info(stream)).state.messages;
        return total;
      } finally {
        await nc.close();
      }
    },
    drainRaw: async () => {
      const nc = await control();
      const jsm = await jetstreamManager(nc);
      const js = jetstream(nc);
      // The consumer serve made, which it left when it stopped (one per stream).
      const consumers = await Promise.all(
        streams.map(async (stream) => {
          const all: ConsumerInfo[] = [];
          for await (const info of jsm.consumers.list(stream)) all.push(info);
          if (all.length !== 1)
            throw new Error(`stream ${stream} has ${all.length} consumers, not serve's one`);
          return all[0] as ConsumerInfo;
        }),
      );
      const pending = consumers.map((info) => info.num_pending);
      const clock = new DrainClock(pending.reduce((sum, n) => sum + n, 0));
      await Promise.all(
        streams.map(async (stream, i) => {
          let left = pending[i] ?? 0;
          if (left === 0) return;
          const consumer = await js.consumers.get(stream, consumers[i]?.name ?? "");
          const iterator = await consumer.consume({ max_messages: 256 });
          for await (const msg of iterator) {
            msg.ack();
            clock.count();
            if (--left === 0) break;
          }
          await iterator.close();
        }),
      );
      await nc.flush();
      const drained = clock.result();
      await nc.close();
      return drained;
    },
    // In groups of 20 on a shared lab connection, as the lab runs above a few hundred nodes.
    openAsNodes: async (nodes) => {
      const groups = Array.from({ length: Math.ceil(nodes.length / 20) }, (_, i) =>
        nodes.slice(i * 20, i * 20 + 20),
      );
      const connections = await openAll(groups.length, 10, (i) =>
        openLabConnection(data, url, groups[i] ?? []),
      );
      return {
        send: async (send) => {
          for (const [i, connection] of connections.entries()) {
            for (const node of groups[i] ?? []) await send(node, connection.nodeBus(node));
          }
        },
        close: () => closeAll(connections),
      };
    },
    stop: () => server.stop(),
  };
}

async function startRabbit(nodes: number): Promise<BenchBroker> {
  const admin = new URL(rabbitApi);
  // Every node holds a connection of its own, and a RabbitMQ out of file descriptors breaks for everyone on it
  // (its internal database stops). The machine's RabbitMQ starts with 1,024 (its service user's default): for a
  // larger fleet the bench restarts it with a higher limit for the run, says so, and gives the old one back after.
  let fds = await rabbitFds(admin);
  let fdLimitRaised: { from: number; to: number } | undefined;
  let unnameRestore = () => false;
  if (fds.free < nodes + 100) {
    // Twice what the fleet needs, within what this process may hand on (its own hard limit: raising that takes a
    // capability this machine's root may lack).
    const ceiling = hardFdLimit();
    const to = Math.min(Math.max(8192, 2 * (nodes + 100)), ceiling);
    if (to < nodes + 200) {
      throw new Error(
        `${nodes} nodes need a connection each, and RabbitMQ could have at most ${ceiling} file descriptors ` +
          `here (this process's hard limit): bench at most ${ceiling - 200} --nodes on RabbitMQ`,
      );
    }
    if (beamPid() === undefined || process.getuid?.() !== 0) {
      throw new Error(
        `RabbitMQ here has ${fds.free} free file descriptors and ${nodes} nodes need a connection each: ` +
          "start it with a higher limit (ulimit -n) or bench fewer --nodes",
      );
    }
    process.stdout.write(
      `RabbitMQ: restarting it with ${to} file descriptors for this run (it had ${fds.total})\n`,
    );
    // Interrupted from here on, the broker gets its own limit back (once the restart under way has ended).
    const raising = restartRabbit(admin, to);
    unnameRestore = stopWhenInterrupted(async () => {
      await raising.catch(() => undefined);
      await restartRabbit(admin, undefined);
    });
    await raising;
    fdLimitRaised = { from: fds.total, to };
    fds = await rabbitFds(admin);
    if (fds.free < nodes + 100)
      throw new Error(`RabbitMQ has ${fds.free} free file descriptors after its restart`);
  }
  const vhost = `mesh_bench_${process.pid}_${randomBytes(4).toString("hex")}`;
  const api = new RabbitManagement(rabbitApi);
  await api.ensureVhost(vhost);
  const adminUser = decodeURIComponent(admin.username);
  // The administrator drains the control queue for the raw baseline.
  await api.setPermissions(vhost, adminUser, {
    configure: ".*",
    write: ".*",
    read: ".*",
    topic: { exchange: "mesh", write: ".*", read: ".*" },
  });
  const url = `${rabbitUrl}/${encodeURIComponent(vhost)}`;
  const users = new MeshUsers(vhost);
  const overview = (await managementJson(admin, "/api/overview")) as { rabbitmq_version?: string };
  const withAdmin = async <T>(work: (connection: ChannelModel) => Promise<T>): Promise<T> => {
    const connection = await amqp.connect(url);
    try {
      return await work(connection);
    } finally {
      await connection.close();
    }
  };
  // From here the caller names the broker's own stop, which gives the limit back.
  unnameRestore();
  return {
    kind: "amqp",
    url,
    version: `RabbitMQ ${overview.rabbitmq_version ?? "unknown"}`,
    pid: beamPid(),
    ...(fdLimitRaised === undefined ? {} : { fdLimitRaised }),
    connectAndLeave: (token) => connectAndLeave(token),
    joinAlone: {
      one: async (token, index) => {
        await connectAndLeave(token);
        // Named under the mesh's prefix, so the cleanup below deletes them with the mesh's own accounts.
        const user = `${users.prefix}.alone.${index}`;
        const password = randomBytes(24).toString("base64url");
        const queue = `alone.${index}`;
        await Promise.all([
          api.putQueue(vhost, queue),
          api.putUser(user, password).then(() =>
            api.setPermissions(vhost, user, {
              configure: "^$",
              write: "^$",
              read: `^alone\\.${index}$`,
              topic: { exchange: "mesh", write: "^$", read: "^$" },
            }),
          ),
        ]);
        const address = new URL(url);
        const connection = await amqp.connect({
          protocol: "amqp",
          hostname: address.hostname,
          port: Number(address.port || 5672),
          vhost,
          username: user,
          password,
        });
        // A refusal rejects the call that met it, which fails the run; the same refusal is also emitted as an
        // event, which must have a listener or it would end the process before the call could say what it was.
        let emitted: Error | undefined;
        connection.on("error", (error: Error) => (emitted = error));
        try {
          const channel = await connection.createChannel();
          channel.on("error", (error: Error) => (emitted = error));
          await channel.consume(queue, () => undefined);
        } catch (error) {
          throw new Error(`the broker alone, join ${index}: ${(error as Error).message}`, {
            cause: emitted ?? error,
          });
        } finally {
          await connection.close().catch((error: unknown) => {
            if (emitted === undefined) throw error;
          });
        }
      },
      clear: async (indexes) => {
        await api.deleteUsers(indexes.map((index) => `${users.prefix}.alone.${index}`));
        for (const index of indexes) await api.deleteQueue(vhost, `alone.${index}`);
      },
    },
    // Like for like: a declaration is a persistent message in its node's own durable queue, confirmed by the
    // broker a chunk at a time, as the control plane sends it; these queues are made for the baseline and deleted.
    publishRaw: (count, body) =>
      withAdmin(async (connection) => {
        const channel = await connection.createConfirmChannel();
        const queues = Array.from({ length: count }, (_, index) => `bench.raw.${index}`);
        for (const queue of queues) await channel.assertQueue(queue, { durable: true });
        const publishAll = async () => {
          for (let start = 0; start < count; start += declarationChunk) {
            for (const queue of queues.slice(start, start + declarationChunk))
              channel.publish("", queue, Buffer.from(body), {
                persistent: true,
                contentType: "application/json",
              });
            await channel.waitForConfirms();
          }
        };
        try {
          // A queue's first message costs the broker more than its next ones (the mesh's node queues are long in
          // use by now): one pass untimed, then the timed one.
          await publishAll();
          const started = performance.now();
          await publishAll();
          return performance.now() - started;
        } finally {
          for (const queue of queues) await channel.deleteQueue(queue);
        }
      }),
    queued: () =>
      withAdmin(async (connection) => {
        const channel = await connection.createChannel();
        return (await channel.checkQueue(controlQueue)).messageCount;
      }),
    drainRaw: () =>
      withAdmin(async (connection) => {
        const channel = await connection.createChannel();
        let left = (await channel.checkQueue(controlQueue)).messageCount;
        await channel.prefetch(256);
        const clock = new DrainClock(left);
        if (left > 0) {
          await new Promise<void>((resolve) => {
            void channel.consume(controlQueue, (message) => {
              if (message === null) return;
              channel.ack(message);
              clock.count();
              if (--left === 0) resolve();
            });
          });
        }
        return clock.result();
      }),
    // Each node on its own connection: RabbitMQ checks every message's user against its connection's.
    openAsNodes: async (nodes, identityOf) => {
      const buses = await openAll(nodes.length, 10, (i) => {
        const node = nodes[i] ?? "";
        const identity = identityOf(node);
        return openNodeSide(identity.broker.url, node, identity.broker.credential, undefined);
      });
      return {
        // A hundred nodes at a time, each waiting for the broker's confirm of every message it sends.
        send: async (send) => {
          for (let i = 0; i < buses.length; i += 100) {
            await Promise.all(buses.slice(i, i + 100).map((bus, k) => send(nodes[i + k] ?? "", bus)));
          }
        },
        close: () => closeAll(buses),
      };
    },
    stop: async () => {
      // Each step taken whatever the one before it did: a user deletion that the broker, busy with 9,800
      // connections, did not answer in time (an interrupted run) once left the vhost behind and the broker on the
      // run's descriptor limit.
      const failures: unknown[] = [];
      const step = (work: () => Promise<unknown>) =>
        work().then(
          () => true,
          (error: unknown) => {
            failures.push(error);
            return false;
          },
        );
      // The vhost first: deleting it closes the nodes' connections at once, which deleting their users would
      // otherwise close one by one.
      const vhostGone = await step(() => deleteVhostAskingAgain(api, vhost));
      // In bulk: one call per user took minutes at 9,800 nodes.
      await step(async () =>
        api.deleteUsers((await api.users()).filter((user) => user.startsWith(`${users.prefix}.`))),
      );
      if (fdLimitRaised !== undefined) {
        if (vhostGone) {
          process.stdout.write(
            `RabbitMQ: restarting it with its own ${fdLimitRaised.from} file descriptors\n`,
          );
          await step(() => restartRabbit(admin, undefined));
        } else {
          // A broker starts by recovering every queue, a descriptor each: with its own limit, below the fleet's
          // queues, it would hang there.
          failures.push(
            new Error(
              `RabbitMQ is left with ${fdLimitRaised.to} file descriptors: ${vhost} is still there, and its ` +
                `queues would not all open again with ${fdLimitRaised.from}; delete the vhost, then restart it`,
            ),
          );
        }
      }
      if (failures.length > 0) {
        throw new Error(`cleaning up after the run: ${failures.map((error) => errorText(error)).join("; ")}`);
      }
    },
  };
}

/**
 * How long the bench keeps asking for its vhost's deletion while the calls end without an answer. At 9,800 nodes the
 * broker clears each node user's permissions in the vhost, then their topic permissions (about 50 ms a user each),
 * before it deletes a queue: the call ended without an answer after about two minutes ("socket hang up"), the broker
 * went on clearing for twenty more and then stopped short of the queues, and a second call deleted the vhost in 13 s.
 */
const vhostGoneWithinMs = 40 * 60_000;

/** Deletes the vhost, asking again every half minute while the calls end without an answer. */
async function deleteVhostAskingAgain(api: RabbitManagement, vhost: string): Promise<void> {
  const startedAt = Date.now();
  for (;;) {
    try {
      await api.deleteVhost(vhost);
      return;
    } catch (error) {
      // Refused is refused; only a call that got no answer may have left the broker part of the way.
      if (!(error instanceof BusError && error.code === "broker_unreachable")) throw error;
      if (Date.now() - startedAt > vhostGoneWithinMs) {
        throw new Error(
          `${vhost} was not deleted within ${vhostGoneWithinMs / 60_000} min, every call ending without an answer ` +
            `(the last: ${errorText(error)})`,
          { cause: error },
        );
      }
      process.stdout.write(
        `RabbitMQ: the deletion of ${vhost} gave no answer (${errorText(error)}); asking again in 30 s\n`,
      );
      await delay(30_000);
    }
  }
}

/** This process's hard limit on open files, which a broker it starts may be given at most. */
function hardFdLimit(): number {
  const line = readFileSync("/proc/self/limits", "utf8")
    .split("\n")
    .find((row) => row.startsWith("Max open files"));
  const hard = line?.trim().split(/\s+/)[4];
  if (hard === "unlimited") return Number.MAX_SAFE_INTEGER;
  const value = Number(hard);
  if (!Number.isInteger(value))
    throw new Error(`cannot read the hard limit on open files from: ${line ?? "nothing"}`);
  return value;
}

/** The broker's file descriptors, as its management API counts them (a few seconds after a start). */
async function rabbitFds(admin: URL): Promise<{ total: number; free: number }> {
  for (let attempt = 0; ; attempt++) {
    const [node] = (await managementJson(admin, "/api/nodes")) as Array<{
      fd_total?: number;
      fd_used?: number;
    }>;
    if (node?.fd_total !== undefined && node.fd_used !== undefined)
      return { total: node.fd_total, free: node.fd_total - node.fd_used };
    if (attempt === 60) throw new Error("RabbitMQ's management API gives no file-descriptor figures");
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

/**
 * Stops the machine's RabbitMQ and starts it again as its own user with `limit` file descriptors, or as the machine
 * starts it (undefined: its own limits back), then waits for its management API. A raised limit is set by root and
 * kept through setpriv, not su: su's PAM session would put the soft limit back to 1,024. Should the broker not start
 * with it, it is started the usual way before the error is thrown.
 */
async function restartRabbit(admin: URL, limit: number | undefined): Promise<void> {
  const { execFileSync } = await import("node:child_process");
  execFileSync("rabbitmqctl", ["stop"], { stdio: "ignore" });
  if (limit === undefined) execFileSync("rabbitmq-server", ["-detached"], { stdio: "ignore" });
  else {
    // The limit is raised while still root (past this shell's own hard limit, which the broker's user could not),
    // then kept across setpriv's change of user.
    const raised = `ulimit -n ${limit} && exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups --reset-env /usr/sbin/rabbitmq-server -detached`;
    try {
      execFileSync("sh", ["-c", raised], { stdio: "ignore" });
    } catch (error) {
      // The machine is not left without its broker: started its usual way, and the run fails saying why.
      execFileSync("rabbitmq-server", ["-detached"], { stdio: "ignore" });
      await rabbitUp(admin);
      throw new Error(`RabbitMQ would not start with ${limit} file descriptors; it runs again with its own`, {
        cause: error,
      });
    }
  }
  await rabbitUp(admin);
}

/** Waits until RabbitMQ's management API answers. */
async function rabbitUp(admin: URL): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    const up = await fetch(`${admin.origin}/api/overview`, { headers: { authorization: basic(admin) } }).then(
      (response) => response.ok,
      (error: unknown) => {
        // Refused until the broker and its plugin are up: asked again below.
        if (attempt === 120) throw error;
        return false;
      },
    );
    if (up) return;
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

/** A token's identity connecting as `mesh-host join` connects it, and leaving at once. */
async function connectAndLeave(token: string): Promise<void> {
  const decoded = decodeToken(token);
  const broker = decoded.broker;
  if (broker === undefined || broker === null) throw new Error("a token without a broker identity");
  const bus = await openEnrolmentSide(broker.url, decoded.node, broker.credential, decoded.secret);
  await bus.close();
}

/** The machine's RabbitMQ process (the Erlang VM), when exactly one runs. */
function beamPid(): number | undefined {
  const found = readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/comm`, "utf8").trim() === "beam.smp";
      } catch (error) {
        // A process that ended while the list was read.
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
        throw error;
      }
    });
  return found.length === 1 ? Number(found[0]) : undefined;
}

/** One answer of RabbitMQ's management API, or an error naming the call and what to check. */
async function managementJson(admin: URL, path: string): Promise<unknown> {
  const call = `${admin.origin}${path}`;
  let response;
  try {
    response = await fetch(call, { headers: { authorization: basic(admin) } });
  } catch (error) {
    // fetch says only "fetch failed"; what failed (the connection refused, say) is its cause.
    const cause = error instanceof Error && error.cause !== undefined ? `: ${errorText(error.cause)}` : "";
    throw new Error(
      `RabbitMQ's management API did not answer ${call} (${errorText(error)}${cause}): is its plugin enabled? ` +
        "`bash scripts/services.sh` enables it",
      { cause: error },
    );
  }
  if (!response.ok) throw new Error(`RabbitMQ's management API answered ${call} with ${response.status}`);
  return response.json();
}

function basic(url: URL): string {
  return `Basic ${Buffer.from(`${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`).toString("base64")}`;
}
