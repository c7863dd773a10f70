/**
 * The two brokers the mesh ships, as fixtures for one conformance suite: an operator-mode nats-server of its own
 * and a scratch vhost on the machine's RabbitMQ. Each fixture opens the mesh's own bus sides, reads what the broker
 * holds with a privileged observer (not with the code that wrote it), drops connections, and probes the broker as
 * one role of the writers table, to see what it lets through and what it refuses.
 */
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import amqp from "amqplib";
import type { ChannelModel, ConfirmChannel, GetMessage } from "amqplib";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator, PermissionViolationError } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import type {
  BrokerAccess,
  ControlIdentities,
  ControlSide,
  NodeBus,
  NodeCredential,
  TokenCredential,
} from "../../src/bus/index.js";
import { openControlSide, openIdentities, openNatsIdentities, openNodeSide } from "../../src/bus/index.js";
import type { AmqpBrokerIdentities } from "../../src/bus/index.js";
import { loadOrCreateAuthority, newUserKey, userJwt } from "../../src/bus/nats/authority.js";
import { aliveStream, controlStream } from "../../src/bus/nats/control-bus.js";
import type { Place, PublishedKind, Role } from "../../src/link/index.js";
import { controlQueue, inboxPrefix, meshExchange, nodeQueue } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import type { Logger } from "../../src/log.js";
import type { OperatorBroker } from "./operator-broker.js";
import { startOperatorBroker } from "./operator-broker.js";
import { observerCredentials } from "./nats.js";
import type { ScratchVhost } from "./rabbit.js";
import { scratchVhost } from "./rabbit.js";
import { tempDir } from "./tmp.js";

export type Verdict = "allowed" | "refused";

/** One identity of the writers table, connected straight to the broker. */
export interface Probe {
  publish(kind: PublishedKind, target: string): Promise<Verdict>;
  read(place: Place, target: string): Promise<Verdict>;
  close(): Promise<void>;
}

export interface Transport {
  readonly name: "nats" | "amqp";
  readonly dataDir: string;
  readonly access: BrokerAccess;
  /** The URL nodes are given (no one's credentials in it). */
  readonly nodeUrl: string;
  openControl(options?: { ackWaitMs?: number; log?: Logger }): Promise<ControlSide>;
  identities(): ControlIdentities;
  tokenFor(node: string): Promise<{ user: string; credential: TokenCredential; secret: string }>;
  /** Ends a token's broker identity as the control plane does once the token is spent and its grace is over. */
  endToken(user: string): Promise<void>;
  nodeFor(node: string): Promise<{ credential: NodeCredential; seed?: string }>;
  openNode(node: string, identity: { credential: NodeCredential; seed?: string }): Promise<NodeBus>;
  /** The bytes of the newest `kind` message from `node` waiting for the control plane, read from the broker. */
  peekControl(kind: "report" | "alive", node: string): Promise<Uint8Array>;
  /** Starts listening to the control plane's events as a privileged observer. */
  observeEvents(): Promise<{
    next(timeoutMs: number): Promise<Uint8Array | undefined>;
    close(): Promise<void>;
  }>;
  /** Cuts every connection, as a broker restart or a network failure would. */
  dropConnections(): Promise<void>;
  /** Connects as `role` (for node `own` when the role is scoped to one node). */
  probe(role: Role, own: string): Promise<Probe>;
  stop(): Promise<void>;
}

const quiet = createLogger({ level: "error" });
const probeWaitMs = 400;

/** Resolves with the first value `wait` yields within `ms`, or undefined. */
async function within<T>(ms: number, wait: Promise<T>): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)));
  try {
    return await Promise.race([wait, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A token's broker identity for `node`, as `issueToken` makes one: its secret is the password where there is one. */
async function mintToken(
  identities: ControlIdentities,
  node: string,
): Promise<{ user: string; credential: TokenCredential; secret: string }> {
  const secret = randomBytes(16).toString("base64url");
  const minted = await identities.forToken({
    id: `tok_${randomBytes(6).toString("hex")}`,
    node,
    secret,
    expiresAt: new Date(Date.now() + 3_600_000),
  });
  return { user: minted.user, credential: minted.credential, secret };
}

// ---------------------------------------------------------------------------------------------------------------
// NATS

export async function natsTransport(): Promise<Transport> {
  const dir = tempDir("mesh-conformance-nats-");
  const dataDir = join(dir.path, "data");
  const server: OperatorBroker = await startOperatorBroker(dataDir, dir.path);
  const access: BrokerAccess = { url: server.url };
  const authority = loadOrCreateAuthority(join(dataDir, "nats"));
  const identities = openNatsIdentities(dataDir, server.url);
  const open: NatsConnection[] = [];
  const connectWith = async (jwt: string, seed: string, node?: string) => {
    const nc = await connect({
      servers: server.url,
      authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
      reconnect: false,
      ...(node === undefined ? {} : { inboxPrefix: inboxPrefix(node) }),
    });
    open.push(nc);
    return nc;
  };
  /** A test-only identity that may do anything in the account: it sees what reached the broker. */
  const observer = async () => {
    const { jwt, seed } = await observerCredentials(authority);
    return connectWith(jwt, seed);
  };
  let watcher = await observer();

  const natsSubject = (kind: PublishedKind, target: string): string => {
    switch (kind) {
      case "enrol":
      case "report":
      case "alive":
        return `mesh.${kind}.${target}`;
      case "enrol_reply":
        return `node.${target}.reply.probe`;
      case "declaration_envelope":
        return `node.${target}.declaration`;
      case "receipt":
        return `node.${target}.receipt`;
      case "event":
        return "mesh.event.probe";
    }
  };
  const placeSubject = (place: Place, target: string): string =>
    place === "control_queue"
      ? `mesh.report.${target}`
      : place === "node_queue"
        ? `node.${target}.declaration`
        : `node.${target}.reply.probe`;
  const violation = async (nc: NatsConnection): Promise<boolean> => {
    const seen = (async () => {
      for await (const status of nc.status()) {
        if (status.type === "error" && status.error instanceof PermissionViolationError) return true;
      }
      return false;
    })();
    return (await within(probeWaitMs, seen)) === true;
  };

  const transport: Transport = {
    name: "nats",
    dataDir,
    access,
    nodeUrl: server.url,
    // A short ack wait, so a message whose consumer died comes again within the test.
    openControl: (options = {}) =>
      openControlSide(dataDir, access, options.log ?? quiet, {
        longLived: true,
        ackWaitMs: options.ackWaitMs ?? 1000,
      }),
    identities: () => identities,
    tokenFor: (node) => mintToken(identities, node),
    // On NATS a token's identity ends by its user key in the account's revocations.
    endToken: (user) => identities.revoke(new Map([[user, new Date()]])),
    async nodeFor(node) {
      const key = newUserKey();
      const minted = await identities.forNode(node, key.publicKey);
      return { credential: minted.credential, seed: key.seed };
    },
    openNode: (node, identity) => openNodeSide(server.url, node, identity.credential, identity.seed),
    async peekControl(kind, node) {
      const jsm = await jetstreamManager(watcher);
      const stream = kind === "report" ? controlStream : aliveStream;
      const message = await jsm.streams.getMessage(stream, { last_by_subj: `mesh.${kind}.${node}` });
      if (message === null) throw new Error(`no ${kind} from ${node} in ${stream}`);
      return message.data;
    },
    async observeEvents() {
      const sub = watcher.subscribe("mesh.event.>");
      await watcher.flush();
      const iterator = sub[Symbol.asyncIterator]();
      return {
        next: async (timeoutMs) => {
          const next = await within(timeoutMs, iterator.next());
          return next === undefined || next.done === true ? undefined : next.value.data;
        },
        close: async () => {
          sub.unsubscribe();
          await Promise.resolve();
        },
      };
    },
    async dropConnections() {
      await server.restart();
      watcher = await observer();
    },
    async probe(role, own) {
      let nc: NatsConnection;
      if (role === "control") {
        const identity = await identities.controlIdentity();
        nc = await connectWith(identity.jwt, identity.seed);
      } else if (role === "token") {
        const token = await transport.tokenFor(own);
        if (token.credential.type !== "nats") throw new Error("not a NATS token");
        nc = await connectWith(token.credential.jwt, token.credential.seed, own);
      } else if (role === "lab") {
        // A lab connection's identity, for a group of one: the lab's own minting, from the writers table.
        const key = newUserKey();
        const jwt = await userJwt(authority, {
          name: "lab",
          userPublicKey: key.publicKey,
          role,
          node: [own],
        });
        nc = await connectWith(jwt, key.seed);
      } else {
        const node = await transport.nodeFor(own);
        if (node.credential.type !== "nats" || node.seed === undefined) throw new Error("not a NATS node");
        nc = await connectWith(node.credential.jwt, node.seed, own);
      }
      const probeConnection = nc;
      return {
        async publish(kind, target) {
          const subject = natsSubject(kind, target);
          const seen = watcher.subscribe(subject, { max: 1 });
          await watcher.flush();
          const refused = violation(probeConnection);
          probeConnection.publish(subject, "probe");
          await probeConnection.flush();
          const arrived = await within(
            probeWaitMs,
            (async () => {
              for await (const _ of seen) return true;
              return false;
            })(),
          );
          seen.unsubscribe();
          const wasRefused = await refused;
          if (wasRefused && arrived !== true) return "refused";
          if (!wasRefused && arrived === true) return "allowed";
          throw new Error(`publish ${kind} to ${subject}: refused=${wasRefused} arrived=${String(arrived)}`);
        },
        async read(place, target) {
          const subject = placeSubject(place, target);
          const refused = violation(probeConnection);
          const sub = probeConnection.subscribe(subject, { max: 1 });
          await probeConnection.flush();
          const wasRefused = await refused;
          if (wasRefused) return "refused";
          watcher.publish(subject, "probe");
          await watcher.flush();
          const got = await within(
            probeWaitMs,
            (async () => {
              for await (const _ of sub) return true;
              return false;
            })(),
          );
          if (got === true) return "allowed";
          throw new Error(`read ${place} on ${subject}: not refused, yet nothing arrived`);
        },
        async close() {
          if (!probeConnection.isClosed()) await probeConnection.close();
        },
      };
    },
    async stop() {
      for (const nc of open) if (!nc.isClosed()) await nc.close();
      await identities.close();
      await server.stop();
      dir.remove();
    },
  };
  return transport;
}

// ---------------------------------------------------------------------------------------------------------------
// RabbitMQ

export async function amqpTransport(): Promise<Transport> {
  const dir = tempDir("mesh-conformance-amqp-");
  const dataDir = join(dir.path, "data");
  const scratch: ScratchVhost = await scratchVhost();
  const access: BrokerAccess = { url: scratch.url };
  const identities = openIdentities(dataDir, access) as AmqpBrokerIdentities;
  const connections: ChannelModel[] = [];
  const adminConnection = async () => {
    const connection = await amqp.connect(scratch.url);
    connection.on("error", () => undefined);
    connections.push(connection);
    return connection;
  };
  let admin = await adminConnection();
  const base = new URL(identities.url);
  const connectAs = async (username: string, password: string) => {
    const url = new URL(base);
    url.username = encodeURIComponent(username);
    url.password = encodeURIComponent(password);
    const connection = await amqp.connect(url.toString());
    // A refused operation closes a channel, not the connection; the probe reads the channel's reason.
    connection.on("error", () => undefined);
    connections.push(connection);
    return connection;
  };
  /** Drains a queue with `get` (unacknowledged), returns the messages, and puts them back by closing the channel. */
  const peekQueue = async (queue: string): Promise<GetMessage[]> => {
    const channel = await admin.createChannel();
    const got: GetMessage[] = [];
    for (;;) {
      const message = await channel.get(queue, { noAck: false });
      if (message === false) break;
      got.push(message);
    }
    await channel.close();
    return got;
  };
  const routeOf = (kind: PublishedKind, target: string): { exchange: string; key: string } => {
    switch (kind) {
      case "enrol":
      case "report":
      case "alive":
        return { exchange: meshExchange, key: kind };
      case "event":
        return { exchange: meshExchange, key: "event.probe" };
      case "enrol_reply":
      case "declaration_envelope":
      case "receipt":
        return { exchange: "", key: nodeQueue(target) };
    }
  };
  const queueOf = (place: Place, target: string) =>
    place === "control_queue" ? controlQueue : nodeQueue(target);
  /** The accounts probes impersonate (one per node), made once. */
  const nodeUsers = new Map<string, string>();

  const transport: Transport = {
    name: "amqp",
    dataDir,
    access,
    nodeUrl: identities.url,
    openControl: (options = {}) =>
      openControlSide(dataDir, access, options.log ?? quiet, { longLived: true }),
    identities: () => identities,
    tokenFor: (node) => mintToken(identities, node),
    endToken: (user) => identities.endToken(user),
    async nodeFor(node) {
      const minted = await identities.forNode(node);
      if (minted.credential.type === "amqp") nodeUsers.set(node, minted.credential.username);
      return { credential: minted.credential };
    },
    openNode: (node, identity) => openNodeSide(identities.url, node, identity.credential, undefined),
    async peekControl(kind, node) {
      const found = (await peekQueue(controlQueue))
        .filter(
          (message) =>
            message.fields.routingKey === kind &&
            scratch.users.read(message.properties.userId as string | undefined)?.node === node,
        )
        .at(-1);
      if (found === undefined) throw new Error(`no ${kind} from ${node} in the control queue`);
      return found.content;
    },
    async observeEvents() {
      const channel = await admin.createChannel();
      const { queue } = await channel.assertQueue("", { exclusive: true });
      await channel.bindQueue(queue, meshExchange, "event.#");
      const waiting: Uint8Array[] = [];
      let wake: (() => void) | undefined;
      await channel.consume(
        queue,
        (message) => {
          if (message === null) return;
          waiting.push(message.content);
          wake?.();
        },
        { noAck: true },
      );
      return {
        next: async (timeoutMs) => {
          if (waiting.length === 0) await within(timeoutMs, new Promise<void>((resolve) => (wake = resolve)));
          return waiting.shift();
        },
        close: () => channel.close(),
      };
    },
    async dropConnections() {
      // The broker lists connections some seconds late: wait until the control plane's and a node's are listed.
      const deadline = Date.now() + 20_000;
      const listed = async () => {
        for (;;) {
          const connections = await scratch.api.connectionsIn(scratch.vhost);
          const users = connections.map((connection) => connection.user);
          const node = users.some((user) => scratch.users.read(user)?.role === "node");
          if (users.includes(scratch.users.control) && node) return connections;
          if (Date.now() > deadline) throw new Error(`the broker lists only ${users.join(", ")}`);
          await new Promise((resolve) => setTimeout(resolve, 250));
        }
      };
      const before = await listed();
      for (const { name } of before) await scratch.api.closeConnection(name);
      const names = new Set(before.map((connection) => connection.name));
      while (
        (await scratch.api.connectionsIn(scratch.vhost)).some((connection) => names.has(connection.name))
      ) {
        if (Date.now() > deadline) throw new Error("the broker did not close the connections");
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      admin = await adminConnection();
    },
    async probe(role, own) {
      let connection: ChannelModel;
      let user: string;
      if (role === "lab") throw new Error("the lab role shares connections on NATS only");
      if (role === "control") {
        const credential = await identities.controlCredential();
        connection = await connectAs(credential.username, credential.password);
        user = credential.username;
      } else if (role === "token") {
        const token = await transport.tokenFor(own);
        if (token.credential.type !== "amqp") throw new Error("not a RabbitMQ token");
        connection = await connectAs(token.credential.username, token.secret);
        user = token.credential.username;
      } else {
        const node = await transport.nodeFor(own);
        if (node.credential.type !== "amqp") throw new Error("not a RabbitMQ node");
        connection = await connectAs(node.credential.username, node.credential.password);
        user = node.credential.username;
      }
      /** What a publish with a confirm says: acknowledged, or the broker's reason for closing the channel. */
      const confirmed = async (
        channel: ConfirmChannel,
        route: { exchange: string; key: string },
        userId: string,
      ): Promise<Error | undefined> => {
        let closedWith: Error | undefined;
        channel.on("error", (error: Error) => (closedWith = error));
        try {
          await new Promise<void>((resolve, reject) =>
            channel.publish(route.exchange, route.key, Buffer.from("probe"), { userId }, (error: unknown) =>
              error === null || error === undefined ? resolve() : reject(new Error(JSON.stringify(error))),
            ),
          );
          return undefined;
        } catch (error) {
          return closedWith ?? (error as Error);
        }
      };
      return {
        async publish(kind, target) {
          const route = routeOf(kind, target);
          // A node-scoped message for another node is one sent in that node's name: its account as user_id.
          const impersonates = role !== "control" && target !== own && route.exchange === meshExchange;
          const userId = impersonates
            ? (nodeUsers.get(target) ?? `${scratch.users.prefix}.node.${target}.x`)
            : user;
          const events = kind === "event" ? await transport.observeEvents() : undefined;
          const destination = route.exchange === "" ? route.key : controlQueue;
          const before = kind === "event" ? 0 : (await peekQueue(destination)).length;
          const channel = await connection.createConfirmChannel();
          const refusal = await confirmed(channel, route, userId);
          await channel.close().catch((error: unknown) => {
            if (refusal === undefined) throw error;
          });
          const arrived =
            kind === "event"
              ? (await events?.next(probeWaitMs)) !== undefined
              : (await peekQueue(destination)).length > before;
          await events?.close();
          // What arrived is taken away again, so the next probe counts from a clean queue.
          if (arrived && kind !== "event") {
            const channel = await admin.createChannel();
            await channel.purgeQueue(destination);
            await channel.close();
          }
          if (
            refusal !== undefined &&
            /ACCESS_REFUSED|PRECONDITION_FAILED/.test(refusal.message) &&
            !arrived
          ) {
            return "refused";
          }
          if (refusal === undefined && arrived) return "allowed";
          throw new Error(
            `publish ${kind} for ${target}: refusal=${refusal?.message ?? "none"} arrived=${arrived}`,
          );
        },
        async read(place, target) {
          const channel = await connection.createChannel();
          let closedWith: Error | undefined;
          channel.on("error", (error: Error) => (closedWith = error));
          try {
            const { consumerTag } = await channel.consume(queueOf(place, target), () => undefined, {
              noAck: false,
            });
            await channel.cancel(consumerTag);
            await channel.close();
            return "allowed";
          } catch (error) {
            const reason = closedWith ?? (error as Error);
            if (/ACCESS_REFUSED/.test(reason.message)) return "refused";
            throw reason;
          }
        },
        close: () => connection.close(),
      };
    },
    async stop() {
      for (const connection of connections) {
        await connection.close().catch((error: unknown) => {
          if (!/closed/i.test(String(error))) throw error;
        });
      }
      await scratch.drop();
      dir.remove();
    },
  };
  return transport;
}

export const transports: readonly { name: "nats" | "amqp"; open: () => Promise<Transport> }[] = [
  { name: "nats", open: natsTransport },
  { name: "amqp", open: amqpTransport },
];
