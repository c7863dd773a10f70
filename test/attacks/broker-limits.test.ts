/**
 * Limits the brokers hold one identity and one node to, tried from the attacker's side on real servers: thousands
 * of subscriptions, a message larger than the contract's largest, a flood of a node's own report subject, and on
 * RabbitMQ an oversized message from a node. The numbers are src/link/limits.ts's.
 */
import assert from "node:assert/strict";
import { connect as connectTcp } from "node:net";
import { after, before, describe, test } from "node:test";
import amqp from "amqplib";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import type { JetStreamManager } from "@nats-io/jetstream";
import { AckPolicy, DeliverPolicy, jetstreamManager, RetentionPolicy, StorageType } from "@nats-io/jetstream";
import { Algorithms, encodeAccount, encodeUser } from "@nats-io/jwt";
import { fromPublic, fromSeed } from "@nats-io/nkeys";
import type { ControlSide } from "../../src/bus/index.js";
import type { AmqpBrokerIdentities } from "../../src/bus/index.js";
import { boundControlQueue, controlQueuePolicy, RabbitManagement } from "../../src/bus/amqp/management.js";
import type { NatsAuthority, UserGrant } from "../../src/bus/nats/authority.js";
import { accountJwt, fastSigner, newUserKey, systemUserJwt, userJwt } from "../../src/bus/nats/authority.js";
import { aliveStream, controlStream, NatsControlBus } from "../../src/bus/nats/control-bus.js";
import {
  controlQueue,
  controlSubject,
  maxMessageBytes,
  meshExchange,
  natsPermissions,
  nodeSubjects,
} from "../../src/link/index.js";
import {
  controlQueueBacklogBytes,
  largestBrokerMessage,
  reportBacklogBytes,
  reportDuplicateWindowMs,
  reportsKeptPerNode,
  subscriptionLimit,
} from "../../src/link/limits.js";
import { createLogger } from "../../src/log.js";
import { rabbitApiUrl, managementGet } from "../support/rabbit.js";
import type { Transport } from "../support/transports.js";
import { amqpTransport } from "../support/transports.js";
import { startOperatorServer } from "../support/nats.js";

const quiet = createLogger({ level: "error" });
/** How nats-server records a connection it closed for a message over its payload limit. */
const maxPayloadExceeded = "Maximum Message Payload Exceeded";
const nanos = (ms: number) => ms * 1_000_000;
const MiB = 1024 * 1024;

/** Polls `check` until it gives a value. The deadline is only there so a broken broker fails the test. */
async function eventually<T>(what: string, check: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// NATS

interface Identity {
  jwt: string;
  seed: string;
}

/** An operator-mode nats-server of the mesh, with the mesh's streams asserted by the control plane's own code. */
interface Broker {
  url: string;
  authority: NatsAuthority;
  control: NatsConnection;
  jsm: JetStreamManager;
  connectAs(identity: Identity, name: string): Promise<NatsConnection>;
  /** How many subscriptions the server says the connection named `name` holds. */
  subscriptionsOf(name: string): Promise<number>;
  /**
   * Publishes one message of `size` bytes as `identity` over a bare socket and says what the server made of it:
   * `accepted`, or why it closed the connection.
   */
  publishBare(identity: Identity, subject: string, size: number): Promise<string>;
  /** How many messages the report stream holds from `node`. */
  reportsFrom(node: string): Promise<number>;
  /** The newest report the stream holds from `node`, as text. */
  newestReportFrom(node: string): Promise<string | undefined>;
  stop(): Promise<void>;
}

/**
 * `account`: the account JWT as the control plane mints it now, or as it was minted before it carried limits (an
 * operator's server still preloading the old one). `maxPayload`: an operator's server-wide `max_payload`, larger
 * than nats-server's default 1 MiB, so that the mesh's own limits are what is tried.
 */
async function startBroker(options: {
  account: "current" | "before limits";
  maxPayload?: number;
  assertStreams?: boolean;
}): Promise<Broker> {
  const operator = await startOperatorServer({
    account: options.account === "current" ? accountJwt : accountJwtBeforeLimits,
    ...(options.maxPayload === undefined ? {} : { maxPayload: options.maxPayload }),
  });
  const { authority, server } = operator;
  const open: NatsConnection[] = [];
  const connectAs = async (identity: Identity, name: string) => {
    const nc = await connect({
      servers: server.url,
      name,
      authenticator: jwtAuthenticator(identity.jwt, new TextEncoder().encode(identity.seed)),
      reconnect: false,
    });
    open.push(nc);
    return nc;
  };
  const controlKey = newUserKey();
  const control = await connectAs(
    {
      seed: controlKey.seed,
      jwt: await userJwt(authority, {
        name: "control",
        userPublicKey: controlKey.publicKey,
        role: "control",
      }),
    },
    "control",
  );
  if (options.assertStreams !== false) await new NatsControlBus(control, quiet).assert();
  const systemKey = newUserKey();
  const system = await connectAs(
    { seed: systemKey.seed, jwt: await systemUserJwt(authority, systemKey.publicKey) },
    "system",
  );
  const jsm = await jetstreamManager(control);
  const account = fastSigner(authority.account).getPublicKey();
  type Listed = { name?: string; subscriptions: number; reason?: string };
  const connections = async (state: "open" | "closed"): Promise<Listed[]> => {
    const reply = await system.request(
      `$SYS.REQ.ACCOUNT.${account}.CONNZ`,
      // The server's ConnState: 0 open, 1 closed.
      JSON.stringify({ state: state === "open" ? 0 : 1, limit: 1024 }),
    );
    return reply.json<{ data: { connections: Listed[] } }>().data.connections;
  };
  let attempts = 0;
  return {
    url: server.url,
    authority,
    control,
    jsm,
    connectAs,
    async subscriptionsOf(name) {
      const connection = (await connections("open")).find((c) => c.name === name);
      if (connection === undefined) throw new Error(`the server lists no connection named ${name}`);
      return connection.subscriptions;
    },
    async publishBare(identity, subject, size) {
      const name = `attacker-${++attempts}`;
      if ((await publishBare(server.url, identity, name, subject, size)) === "accepted") return "accepted";
      // The server's -ERR line may be lost to the reset of a socket closed while the payload was still being
      // written: the server's own record of why it closed the connection is the answer.
      const closed = await eventually("the server's record of the closed connection", async () =>
        (await connections("closed")).find((c) => c.name === name),
      );
      return closed.reason ?? "closed";
    },
    async reportsFrom(node) {
      const subject = controlSubject("report", node);
      const info = await jsm.streams.info(controlStream, { subjects_filter: subject });
      return info.state.subjects?.[subject] ?? 0;
    },
    async newestReportFrom(node) {
      const message = await jsm.streams.getMessage(controlStream, {
        last_by_subj: controlSubject("report", node),
      });
      return message === null ? undefined : message.string();
    },
    stop: async () => {
      for (const nc of open) if (!nc.isClosed()) await nc.close();
      await operator.stop();
    },
  };
}

/** The account JWT as the control plane minted it before it carried limits. */
function accountJwtBeforeLimits(authority: NatsAuthority): Promise<string> {
  return encodeAccount(
    "MESH",
    fromPublic(fastSigner(authority.account).getPublicKey()),
    {
      limits: {
        mem_storage: -1,
        disk_storage: -1,
        streams: -1,
        consumer: -1,
        subs: -1,
        conn: -1,
        payload: -1,
        data: -1,
      },
    },
    { algorithm: Algorithms.v2, signer: fastSigner(authority.operator) },
  );
}

/** An identity minted as the control plane mints it now. */
async function mint(authority: NatsAuthority, grant: Omit<UserGrant, "userPublicKey">): Promise<Identity> {
  const key = newUserKey();
  return { seed: key.seed, jwt: await userJwt(authority, { ...grant, userPublicKey: key.publicKey }) };
}

/** A node's identity as the control plane minted it before user JWTs carried limits: a node enrolled back then. */
async function mintBeforeLimits(authority: NatsAuthority, node: string): Promise<Identity> {
  const key = newUserKey();
  const permissions = natsPermissions("node", node);
  const jwt = await encodeUser(
    node,
    key.publicKey,
    fastSigner(authority.account),
    { pub: permissions.pub, sub: permissions.sub },
    { algorithm: Algorithms.v2 },
  );
  return { seed: key.seed, jwt };
}

/**
 * Publishes one message of `size` bytes over a bare socket, as an attacker would (a client library would refuse a
 * size the server announced as too large before sending it). Answers `accepted` when the server answered the PING
 * after it, else the server's `-ERR` line if it arrived, or `closed`.
 */
function publishBare(
  url: string,
  identity: Identity,
  name: string,
  subject: string,
  size: number,
): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const socket = connectTcp({ host: hostname, port: Number(port) });
    let received = "";
    let sent = false;
    const finish = (answer: string) => {
      socket.destroy();
      resolve(answer);
    };
    // The server may close while the payload is still being written; its -ERR line is the answer.
    socket.on("error", () => undefined);
    socket.on("close", () => finish(/-ERR [^\r]*/.exec(received)?.[0] ?? "closed"));
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString("latin1");
      if (!sent && received.includes("\r\n")) {
        sent = true;
        const info = JSON.parse(received.slice(5, received.indexOf("\r\n"))) as { nonce: string };
        const signer = fastSigner(fromSeed(new TextEncoder().encode(identity.seed)));
        const sig = Buffer.from(signer.sign(new TextEncoder().encode(info.nonce))).toString("base64url");
        const connectLine = { verbose: false, pedantic: false, jwt: identity.jwt, sig, name };
        socket.write(`CONNECT ${JSON.stringify(connectLine)}\r\nPUB ${subject} ${size}\r\n`);
        socket.write(Buffer.alloc(size, "x"));
        socket.write("\r\nPING\r\n");
        return;
      }
      const refused = /-ERR [^\r]*/.exec(received);
      if (refused !== null) finish(refused[0]);
      else if (received.includes("PONG")) finish("accepted");
    });
  });
}

describe("broker limits on NATS — one identity", () => {
  let broker: Broker;
  before(async () => {
    broker = await startBroker({ account: "current" });
  });
  after(async () => broker?.stop());

  test("broker limits — a node opening 5,000 subscriptions is refused past its limit, and its own still works", async () => {
    const node = await broker.connectAs(
      await mint(broker.authority, { name: "web-1", role: "node", node: "web-1" }),
      "web-1",
    );
    // What the agent subscribes to, first, as the agent does.
    const own = node.subscribe(nodeSubjects("web-1"), { max: 1 });
    for (let i = 0; i < 5000; i++) node.subscribe(`node.web-1.flood.${i}`);
    await node.flush();

    assert.equal(await broker.subscriptionsOf("web-1"), subscriptionLimit("node", 1));
    assert.equal(node.isClosed(), false, "a refused subscription does not end the connection");
    // The node's own subscription, taken before the flood, still gets what is sent to it.
    broker.control.publish("node.web-1.declaration", "declared");
    for await (const message of own) assert.equal(message.string(), "declared");
  });

  test("broker limits — a lab connection holds one subscription per node of its group, and no more", async () => {
    const group = Array.from({ length: 20 }, (_, i) => `lab-${i}`);
    const lab = await broker.connectAs(
      await mint(broker.authority, { name: "lab", role: "lab", node: group }),
      "lab",
    );
    for (const node of group) lab.subscribe(nodeSubjects(node));
    for (let i = 0; i < 5000; i++) lab.subscribe(`node.lab-0.flood.${i}`);
    await lab.flush();
    const limit = subscriptionLimit("lab", group.length);
    assert.equal(await broker.subscriptionsOf("lab"), limit);
    assert.ok(limit !== undefined && limit >= group.length && limit < 5000 + group.length);
  });

  test("broker limits — a token opening 5,000 subscriptions is refused past its limit", async () => {
    const token = await broker.connectAs(
      await mint(broker.authority, {
        name: "token",
        role: "token",
        node: "web-9",
        expiresAt: new Date(Date.now() + 3_600_000),
      }),
      "token web-9",
    );
    for (let i = 0; i < 5000; i++) token.subscribe(`node.web-9.reply.flood.${i}`);
    await token.flush();
    assert.equal(await broker.subscriptionsOf("token web-9"), subscriptionLimit("token", 1));
  });

  test("broker limits — a node flooding its own report subject keeps at most the per-node limit in the stream; another node's report stays", async () => {
    const victim = await broker.connectAs(
      await mint(broker.authority, { name: "web-2", role: "node", node: "web-2" }),
      "web-2",
    );
    victim.publish(controlSubject("report", "web-2"), "web-2's report");
    await victim.flush();
    await eventually("web-2's report in the stream", () => broker.newestReportFrom("web-2"));

    const flooder = await broker.connectAs(
      await mint(broker.authority, { name: "web-3", role: "node", node: "web-3" }),
      "web-3",
    );
    for (let i = 0; i < 2000; i++) flooder.publish(controlSubject("report", "web-3"), `flood ${i}`);
    flooder.publish(controlSubject("report", "web-3"), "last");
    await flooder.flush();
    await eventually("the flood's last report in the stream", async () =>
      (await broker.newestReportFrom("web-3")) === "last" ? true : undefined,
    );

    assert.equal(await broker.reportsFrom("web-3"), reportsKeptPerNode);
    assert.equal(await broker.reportsFrom("web-2"), 1);
    assert.equal(await broker.newestReportFrom("web-2"), "web-2's report");
  });
});

describe("broker limits on NATS — message size, on a server whose own max_payload is larger (8 MiB)", () => {
  test("broker limits — a node publishing more than the largest message is refused by the server; the contract's largest passes", async () => {
    const broker = await startBroker({ account: "current", maxPayload: 8 * MiB });
    try {
      const node = await mint(broker.authority, { name: "web-4", role: "node", node: "web-4" });
      const subject = controlSubject("report", "web-4");
      assert.equal(await broker.publishBare(node, subject, 2 * MiB), maxPayloadExceeded);
      assert.equal(await broker.publishBare(node, subject, largestBrokerMessage + 1), maxPayloadExceeded);
      assert.equal(await broker.publishBare(node, subject, maxMessageBytes), "accepted");
      await eventually("the largest report in the stream", () => broker.newestReportFrom("web-4"));
      assert.equal(await broker.reportsFrom("web-4"), 1);
    } finally {
      await broker.stop();
    }
  });

  test("broker limits — a node enrolled before user JWTs carried limits is held to the largest message by the account", async () => {
    const broker = await startBroker({ account: "current", maxPayload: 8 * MiB });
    try {
      const node = await mintBeforeLimits(broker.authority, "web-5");
      assert.equal(
        await broker.publishBare(node, controlSubject("report", "web-5"), 2 * MiB),
        maxPayloadExceeded,
      );
    } finally {
      await broker.stop();
    }
  });

  test("broker limits — the report stream refuses a message larger than the largest even from a connection nothing else limits", async () => {
    // An operator's server still preloading the account JWT from before the limits, and a node enrolled back then.
    const broker = await startBroker({ account: "before limits", maxPayload: 8 * MiB });
    try {
      const node = await mintBeforeLimits(broker.authority, "web-6");
      const subject = controlSubject("report", "web-6");
      // The connection takes it (nothing limits it there); the stream must not keep it.
      assert.equal(await broker.publishBare(node, subject, 2 * MiB), "accepted");
      assert.equal(await broker.publishBare(node, subject, maxMessageBytes), "accepted");
      const newest = await eventually("the later, allowed report in the stream", () =>
        broker.newestReportFrom("web-6"),
      );
      assert.equal(newest.length, maxMessageBytes);
      assert.equal(await broker.reportsFrom("web-6"), 1, "the 2 MiB report was kept");

      const alive = controlSubject("alive", "web-6");
      assert.equal(await broker.publishBare(node, alive, 2 * MiB), "accepted");
      assert.equal(await broker.publishBare(node, alive, 100), "accepted");
      const kept = await eventually("the later, allowed alive in the stream", () =>
        broker.jsm.streams
          .getMessage(aliveStream, { last_by_subj: alive })
          .then((found) => found ?? undefined),
      );
      assert.equal(kept?.data.length, 100);
      // The stream keeps one alive per node, so the count says nothing; a sequence is used only by what was stored.
      const info = await broker.jsm.streams.info(aliveStream);
      assert.equal(info.config.max_msg_size, largestBrokerMessage);
      assert.equal(info.state.last_seq, 1, "the 2 MiB alive was stored");
    } finally {
      await broker.stop();
    }
  });
});

describe("broker limits on NATS — an existing deployment's streams", () => {
  test("broker limits — asserting the bus moves a report stream made by the old code to the limits, trimming a flood's backlog and keeping others' reports", async () => {
    const broker = await startBroker({ account: "current", assertStreams: false });
    try {
      // The streams as the control plane made them before the limits.
      const old = {
        no_ack: true,
        retention: RetentionPolicy.Workqueue,
        storage: StorageType.File,
        max_age: nanos(7 * 86_400_000),
      };
      await broker.jsm.streams.add({
        ...old,
        name: controlStream,
        subjects: ["mesh.report.*"],
        duplicate_window: nanos(120_000),
      });
      await broker.jsm.streams.add({
        ...old,
        name: aliveStream,
        subjects: ["mesh.alive.*"],
        max_msgs_per_subject: 1,
      });
      for (const stream of [controlStream, aliveStream]) {
        await broker.jsm.consumers.add(stream, {
          durable_name: "control",
          ack_policy: AckPolicy.Explicit,
          deliver_policy: DeliverPolicy.All,
          ack_wait: nanos(30_000),
          max_ack_pending: 1024,
        });
      }
      const victim = await broker.connectAs(
        await mint(broker.authority, { name: "web-7", role: "node", node: "web-7" }),
        "web-7",
      );
      victim.publish(controlSubject("report", "web-7"), "web-7's report");
      const flooder = await broker.connectAs(
        await mint(broker.authority, { name: "web-8", role: "node", node: "web-8" }),
        "web-8",
      );
      for (let i = 0; i < 200; i++) flooder.publish(controlSubject("report", "web-8"), `flood ${i}`);
      await Promise.all([victim.flush(), flooder.flush()]);
      await eventually("the flood in the old stream", async () =>
        (await broker.newestReportFrom("web-8")) === "flood 199" ? true : undefined,
      );
      assert.equal(await broker.reportsFrom("web-8"), 200);

      await new NatsControlBus(broker.control, quiet).assert();

      const reports = await broker.jsm.streams.info(controlStream);
      assert.equal(reports.config.max_msgs_per_subject, reportsKeptPerNode);
      assert.equal(reports.config.max_msg_size, largestBrokerMessage);
      assert.equal(reports.config.max_bytes, reportBacklogBytes);
      assert.equal(reports.config.duplicate_window, nanos(reportDuplicateWindowMs));
      assert.equal(reports.config.retention, RetentionPolicy.Workqueue);
      assert.equal((await broker.jsm.streams.info(aliveStream)).config.max_msg_size, largestBrokerMessage);
      // The backlog is trimmed to the node's newest; the other node's report is untouched.
      assert.equal(await broker.reportsFrom("web-8"), reportsKeptPerNode);
      assert.equal(await broker.newestReportFrom("web-8"), "flood 199");
      assert.equal(await broker.newestReportFrom("web-7"), "web-7's report");
      // Asserting again changes nothing.
      await new NatsControlBus(broker.control, quiet).assert();
      assert.equal(await broker.reportsFrom("web-8"), reportsKeptPerNode);
      assert.equal(await broker.reportsFrom("web-7"), 1);
    } finally {
      await broker.stop();
    }
  });
});

// ---------------------------------------------------------------------------------------------------------------
// RabbitMQ

describe("broker limits on RabbitMQ", () => {
  let transport: Transport;
  let control: ControlSide;
  before(async () => {
    transport = await amqpTransport();
    control = await transport.openControl();
    await control.bus.assert();
  });
  after(async () => {
    await control?.close();
    await transport?.stop();
  });

  test("broker limits — RabbitMQ: a node's oversized message is refused by the control queue's bound; what other nodes sent stays", async () => {
    const identities = transport.identities() as AmqpBrokerIdentities;
    const queuePath = `/queues/${encodeURIComponent(identities.vhost)}/${encodeURIComponent(controlQueue)}`;
    const policyOfQueue = async () => {
      const { body } = await managementGet<{ policy?: string | null; effective_policy_definition?: unknown }>(
        queuePath,
      );
      return body?.policy === controlQueuePolicy ? body.effective_policy_definition : undefined;
    };
    // The control plane bounded its queue when it set up the vhost.
    assert.deepEqual(await eventually("the control queue's policy", policyOfQueue), {
      "max-length-bytes": controlQueueBacklogBytes,
      overflow: "reject-publish",
    });

    // Filling gigabytes to reach the production bound is not the point: the same policy, with a bound below the
    // attacker's message.
    await boundControlQueue(new RabbitManagement(rabbitApiUrl), identities.vhost, 16 * MiB);
    await eventually("the test's bound", async () => {
      const definition = (await policyOfQueue()) as { "max-length-bytes"?: number } | undefined;
      return definition?.["max-length-bytes"] === 16 * MiB ? true : undefined;
    });

    const publishAs = async (node: string) => {
      const { credential } = await transport.nodeFor(node);
      if (credential.type !== "amqp") throw new Error("not a RabbitMQ node");
      const url = new URL(identities.url);
      url.username = encodeURIComponent(credential.username);
      url.password = encodeURIComponent(credential.password);
      const connection = await amqp.connect(url.toString());
      connection.on("error", () => undefined);
      const channel = await connection.createConfirmChannel();
      channel.on("error", () => undefined);
      return {
        publish: (body: Buffer) =>
          new Promise<"acknowledged" | "refused">((resolve) =>
            channel.publish(
              meshExchange,
              "report",
              body,
              { userId: credential.username, persistent: true },
              (error) => resolve(error === null || error === undefined ? "acknowledged" : "refused"),
            ),
          ),
        close: () => connection.close(),
      };
    };
    const victim = await publishAs("web-2");
    const attacker = await publishAs("web-1");
    try {
      assert.equal(await victim.publish(Buffer.from("web-2's report")), "acknowledged");
      assert.equal(await attacker.publish(Buffer.alloc(50 * MiB, "x")), "refused");
      // The attacker's ordinary report still goes through, and nothing the victim sent was pushed out.
      assert.equal(await attacker.publish(Buffer.from("web-1's report")), "acknowledged");
      assert.equal(
        new TextDecoder().decode(await transport.peekControl("report", "web-2")),
        "web-2's report",
      );
      assert.equal(
        new TextDecoder().decode(await transport.peekControl("report", "web-1")),
        "web-1's report",
      );
    } finally {
      await victim.close();
      await attacker.close();
    }
  });
});
