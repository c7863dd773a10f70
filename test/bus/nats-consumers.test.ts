/**
 * How the control plane consumes JetStream, on an operator-mode nats-server of its own: one acknowledgement for a
 * batch, never one that covers a message handed back; a consumer of its own, so that what a control plane that died
 * had taken comes at once to the next; and a stream of the earlier layout emptied and made again.
 */
import assert from "node:assert/strict";
import type { AddressInfo, Socket } from "node:net";
import { connect as connectTcp, createServer } from "node:net";
import { after, before, describe, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import type { JetStreamManager } from "@nats-io/jetstream";
import { AckPolicy, DeliverPolicy, jetstreamManager, RetentionPolicy, StorageType } from "@nats-io/jetstream";
import type { ControlDelivery, DeliveryOutcome } from "../../src/bus/index.js";
import type { UserGrant } from "../../src/bus/nats/authority.js";
import { newUserKey, userJwt } from "../../src/bus/nats/authority.js";
import { aliveStream, controlStream, isNotFound, NatsControlBus } from "../../src/bus/nats/control-bus.js";
import { controlSubject } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import type { OperatorServer } from "../support/nats.js";
import { observerCredentials, startOperatorServer } from "../support/nats.js";
import { eventually } from "../support/processes.js";

const quiet = createLogger({ level: "error" });
const nanos = (ms: number) => ms * 1_000_000;
/** Far longer than any test here waits: what arrives in time cannot have waited for the ack wait. */
const longAckWaitMs = 600_000;

describe("NATS consumers of the control plane", () => {
  let operator: OperatorServer;
  const open: NatsConnection[] = [];
  /** Connects straight to the server as the user of this JWT and seed. */
  const connectWith = async (jwt: string, seed: string): Promise<NatsConnection> => {
    const nc = await connect({
      servers: operator.url,
      authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
      reconnect: false,
    });
    open.push(nc);
    return nc;
  };
  const connectAs = async (grant: Omit<UserGrant, "userPublicKey">): Promise<NatsConnection> => {
    const key = newUserKey();
    return connectWith(
      await userJwt(operator.authority, { ...grant, userPublicKey: key.publicKey }),
      key.seed,
    );
  };
  const asNode = (node: string) => connectAs({ name: node, role: "node", node });
  /** A test-only identity that may do anything in the account. */
  const observer = async (): Promise<NatsConnection> => {
    const { jwt, seed } = await observerCredentials(operator.authority);
    return connectWith(jwt, seed);
  };
  /** A control plane's bus on a connection of its own, with its connection (to cut it as a crash would). */
  const controlBus = async () => {
    const nc = await connectAs({ name: "control", role: "control" });
    return { nc, bus: new NatsControlBus(nc, quiet, { ackWaitMs: longAckWaitMs, keepForMs: 86_400_000 }) };
  };
  let admin: JetStreamManager;
  const consumersOf = async (stream: string): Promise<string[]> => {
    const names: string[] = [];
    for await (const info of admin.consumers.list(stream)) names.push(info.name);
    return names.sort();
  };
  /** What `question` answers, or undefined when the stream it asks about is not there; any other error is thrown. */
  const whileThere = <T>(question: Promise<T>): Promise<T | undefined> =>
    question.catch((error: unknown) => {
      if (isNotFound(error)) return undefined;
      throw error;
    });
  const held = async (stream: string) => (await admin.streams.info(stream)).state.messages;

  before(async () => {
    operator = await startOperatorServer();
    admin = await jetstreamManager(await connectAs({ name: "admin", role: "control" }));
  });
  after(async () => {
    for (const nc of open) if (!nc.isClosed()) await nc.close();
    await operator.stop();
  });

  test("NATS consumers — a backlog is acknowledged a batch at a time, and the streams are left empty", async () => {
    const { bus } = await controlBus();
    await bus.assert();
    const node = await asNode("ack-1");
    for (let i = 0; i < 500; i++) node.publish(controlSubject("report", "ack-1"), `report ${i}`);
    await node.flush();
    await eventually("the backlog in the stream", async () =>
      (await held(controlStream)) >= 3 ? true : undefined,
    );
    const backlog = await held(controlStream);
    // The acknowledgements, as a privileged observer of the account sees them go to the broker.
    const watcher = await observer();
    let acknowledgements = 0;
    watcher.subscribe(`$JS.ACK.${controlStream}.>`, {
      callback: () => {
        acknowledgements++;
      },
    });
    await watcher.flush();
    let taken = 0;
    void bus.consumeControl((batch) => {
      taken += batch.length;
      return Promise.resolve(batch.map((): DeliveryOutcome => "done"));
    });
    await eventually("the backlog taken and acknowledged", async () =>
      taken >= backlog && (await held(controlStream)) === 0 ? true : undefined,
    );
    await watcher.flush();
    assert.ok(acknowledgements > 0, "acknowledged");
    assert.ok(
      acknowledgements * 2 <= taken,
      `${acknowledgements} acknowledgements for ${taken} reports: one a batch, not one a message`,
    );
    await bus.close();
  });

  test("NATS consumers — a control plane that dies holding messages it never acknowledged: the next is offered them at once", async () => {
    const first = await controlBus();
    await first.bus.assert();
    const node = await asNode("died-1");
    const taken: string[] = [];
    void first.bus.consumeControl((batch) => {
      taken.push(...batch.map((d) => Buffer.from(d.body).toString()));
      // Never decided: the control plane dies first.
      return new Promise<DeliveryOutcome[]>(() => undefined);
    });
    node.publish(controlSubject("report", "died-1"), "taken, never acknowledged");
    await node.flush();
    await eventually("the first to take the report", () =>
      taken.includes("taken, never acknowledged") ? true : undefined,
    );
    const before = await consumersOf(controlStream);
    // Its connection cut without a word, as a crash would: nothing it took was acknowledged.
    await first.nc.close();

    const next = await controlBus();
    const got: ControlDelivery[] = [];
    void next.bus.consumeControl((batch) => {
      got.push(...batch);
      return Promise.resolve(batch.map((): DeliveryOutcome => "done"));
    });
    // Within the test's patience, which is far shorter than the ack wait: only a consumer of its own explains it.
    const again = await eventually("the report at the next control plane", () =>
      got.find((d) => Buffer.from(d.body).toString() === "taken, never acknowledged"),
    );
    assert.equal(again.redelivered, true, "marked as offered before");
    const after = await consumersOf(controlStream);
    assert.equal(after.length, 1, `one consumer: ${after.join(", ")}`);
    assert.ok(!before.includes(after[0] ?? ""), "the dead control plane's consumer is gone");
    assert.equal((await consumersOf(aliveStream)).length, 1);
    await eventually("the report acknowledged", async () =>
      (await held(controlStream)) === 0 ? true : undefined,
    );
    await next.bus.close();
  });

  test("NATS consumers — a message handed back and then pushed out by its node's newer one does not hold back the acknowledgements after it", async () => {
    const { bus } = await controlBus();
    await bus.assert();
    const pushedOut = await asNode("pushed-1");
    const other = await asNode("pushed-2");
    const taken: string[] = [];
    let handedBack = false;
    void bus.consumeControl((batch) => {
      const outcomes = batch.map((d): DeliveryOutcome => {
        const body = Buffer.from(d.body).toString();
        taken.push(body);
        if (body !== "first" || handedBack) return "done";
        handedBack = true;
        // The node's next alive takes the first one's place in the stream (one alive a node), well within the
        // second before the broker would offer the first again.
        pushedOut.publish(controlSubject("alive", "pushed-1"), "second");
        return "retry";
      });
      return Promise.resolve(outcomes);
    });
    pushedOut.publish(controlSubject("alive", "pushed-1"), "first");
    await pushedOut.flush();
    await eventually("the first alive handed back", () => (handedBack ? true : undefined));
    // Another node speaks once; its alive is taken, and in the end acknowledged with the second, which the first,
    // owed and gone, must not prevent — though nothing more arrives to set off a check.
    other.publish(controlSubject("alive", "pushed-2"), "other");
    await other.flush();
    await eventually("both taken", () =>
      taken.includes("second") && taken.includes("other") ? true : undefined,
    );
    assert.ok((await held(aliveStream)) > 0, "held back by the first, owed");
    await eventually("the alive stream emptied", async () =>
      (await held(aliveStream)) === 0 ? true : undefined,
    );
    assert.equal(
      taken.filter((body) => body === "first").length,
      1,
      "the first alive was gone, not offered again",
    );
    await bus.close();
  });

  test("NATS consumers — deliveries lost on the way when the connection drops are not acknowledged unseen: a new consumer is offered them", async () => {
    // The control plane reaches the broker through a relay that can lose what the broker sends, as a connection
    // that drops with deliveries on the way does.
    let losing = false;
    const relayed = new Set<Socket>();
    const relay = createServer((client) => {
      const broker = connectTcp(Number(new URL(operator.url).port), "127.0.0.1");
      relayed.add(client).add(broker);
      client.on("data", (chunk) => broker.write(chunk));
      broker.on("data", (chunk) => {
        if (!losing) client.write(chunk);
      });
      for (const [one, other] of [
        [client, broker],
        [broker, client],
      ] as const) {
        one.on("error", () => other.destroy());
        one.on("close", () => other.destroy());
      }
    });
    await new Promise<void>((resolve) => relay.listen(0, "127.0.0.1", resolve));
    const relayPort = (relay.address() as AddressInfo).port;
    const key = newUserKey();
    const jwt = await userJwt(operator.authority, {
      name: "control",
      role: "control",
      userPublicKey: key.publicKey,
    });
    const nc = await connect({
      servers: `127.0.0.1:${relayPort}`,
      authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(key.seed)),
      reconnectTimeWait: 100,
      maxReconnectAttempts: -1,
    });
    open.push(nc);
    const bus = new NatsControlBus(nc, quiet, { ackWaitMs: longAckWaitMs, keepForMs: 86_400_000 });
    try {
      await bus.assert();
      const taken = new Set<string>();
      bus
        .consumeControl((batch) => {
          for (const d of batch) taken.add(Buffer.from(d.body).toString());
          return Promise.resolve(batch.map((): DeliveryOutcome => "done"));
        })
        .catch((error: unknown) => assert.fail(`consuming failed: ${String(error)}`));
      // Each report from a node of its own (a node's stream keeps a few of its reports).
      const sender = await observer();
      sender.publish(controlSubject("report", "lost-0"), "before");
      await sender.flush();
      await eventually("the first report taken", () => (taken.has("before") ? true : undefined));
      // From now on, what the broker sends the control plane is lost on the way.
      losing = true;
      const sent = Array.from({ length: 600 }, (_, i) => `report ${i}`);
      sent.forEach((body, i) => sender.publish(controlSubject("report", `lost-${i + 1}`), body));
      await sender.flush();
      const consumer = async () => {
        for await (const info of admin.consumers.list(controlStream)) return info;
        return undefined;
      };
      await eventually("the broker to send deliveries into the void", async () =>
        ((await consumer())?.num_ack_pending ?? 0) > 0 ? true : undefined,
      );
      // The connection drops with them; the control plane connects again, and the broker sends on.
      for (const socket of relayed) socket.destroy();
      relayed.clear();
      losing = false;
      await eventually("every report taken", () =>
        sent.every((body) => taken.has(body)) ? true : undefined,
      );
      await eventually("the stream emptied", async () =>
        (await held(controlStream)) === 0 ? true : undefined,
      );
      assert.equal((await consumersOf(controlStream)).length, 1, "the consumer given up is gone");
    } finally {
      await bus.close();
      await new Promise((resolve) => relay.close(resolve));
    }
  });

  test("NATS consumers — a stream of the earlier layout (work-queue retention) is emptied through its consumer and made again", async () => {
    // Whatever earlier tests made goes first: the streams are made here as the earlier code made them.
    for (const stream of [controlStream, aliveStream]) {
      await whileThere(admin.streams.delete(stream));
    }
    // The streams and consumers as the control plane made them before.
    const earlier = {
      no_ack: true,
      retention: RetentionPolicy.Workqueue,
      storage: StorageType.File,
      max_age: nanos(86_400_000),
    };
    await admin.streams.add({ ...earlier, name: controlStream, subjects: ["mesh.report.*"] });
    await admin.streams.add({
      ...earlier,
      name: aliveStream,
      subjects: ["mesh.alive.*"],
      max_msgs_per_subject: 1,
    });
    for (const stream of [controlStream, aliveStream]) {
      await admin.consumers.add(stream, {
        durable_name: "control",
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: nanos(30_000),
        max_ack_pending: 1024,
      });
    }
    const node = await asNode("earlier-1");
    for (let i = 0; i < 5; i++) node.publish(controlSubject("report", "earlier-1"), `backlog ${i}`);
    node.publish(controlSubject("alive", "earlier-1"), "backlog alive");
    await node.flush();
    await eventually("the backlog in the earlier streams", async () =>
      (await held(controlStream)) === 5 && (await held(aliveStream)) === 1 ? true : undefined,
    );

    const { bus } = await controlBus();
    await bus.assert();
    assert.equal(
      (await admin.streams.info(controlStream)).config.retention,
      RetentionPolicy.Workqueue,
      "asserting keeps the backlog where it is",
    );
    const taken: string[] = [];
    void bus.consumeControl((batch) => {
      taken.push(...batch.map((d) => Buffer.from(d.body).toString()));
      return Promise.resolve(batch.map((): DeliveryOutcome => "done"));
    });
    await eventually("the backlog taken", () => (taken.length >= 6 ? true : undefined));
    assert.deepEqual(taken.filter((body) => body.startsWith("backlog ")).sort(), [
      "backlog 0",
      "backlog 1",
      "backlog 2",
      "backlog 3",
      "backlog 4",
      "backlog alive",
    ]);
    for (const stream of [controlStream, aliveStream]) {
      await eventually(`${stream} made again`, async () => {
        // The stream may be gone between the two questions while it is made again: then it is not made yet.
        const info = await whileThere(admin.streams.info(stream));
        const consumers = info === undefined ? undefined : await whileThere(consumersOf(stream));
        return info?.config.retention === RetentionPolicy.Interest &&
          consumers?.length === 1 &&
          consumers[0] !== "control"
          ? true
          : undefined;
      });
    }
    // What the node sends now is taken, and acknowledged.
    node.publish(controlSubject("report", "earlier-1"), "after");
    await node.flush();
    await eventually("the report sent after", () => (taken.includes("after") ? true : undefined));
    await eventually("the stream emptied", async () =>
      (await held(controlStream)) === 0 ? true : undefined,
    );
    await bus.close();
  });
});
