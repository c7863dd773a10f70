/**
 * One conformance suite, two brokers: the same tests run against an operator-mode nats-server and a scratch vhost
 * on RabbitMQ, through the mesh's own Bus. Every message kind travels with its bytes unchanged (checked against
 * what the broker itself holds); a consumer that dies before acknowledging gets its message again; the mesh carries
 * on when every connection drops; one control plane consumes at a time; and the permission matrix — every role ×
 * every kind × publish/read — is tried from the forbidden side.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { after, afterEach, before, describe, test } from "node:test";
import amqp from "amqplib";
import type { ControlDelivery, ControlSide, NodeDelivery } from "../../src/bus/index.js";
import { BrokerRefusedIdentity, BusError, freePort, openEnrolmentSide } from "../../src/bus/index.js";
import { compileMeshOptions } from "../../src/config/options.js";
import type { RunningControlPlane } from "../../src/control/serve.js";
import { serve } from "../../src/control/serve.js";
import type { Place, Role } from "../../src/link/index.js";
import {
  controlQueue,
  mayPublish,
  natsPermissions,
  places,
  publishedKinds,
  rabbitPermissions,
  roles,
  nodeQueue,
} from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import { eventually } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";
import type { Transport } from "../support/transports.js";
import { transports } from "../support/transports.js";

const root = new URL("../../", import.meta.url).pathname;
const payload = (what: string) => Buffer.concat([Buffer.from(`${what} ✓ é\n`), randomBytes(48)]);

/** Consumes the control queue and keeps every delivery, until the side is closed. */
function collect(side: ControlSide): ControlDelivery[] {
  const got: ControlDelivery[] = [];
  void side.bus.consumeControl((batch) => {
    got.push(...batch);
    return Promise.resolve(batch.map(() => "done"));
  });
  return got;
}

const sameBytes = (a: Uint8Array, b: Uint8Array) => Buffer.from(a).equals(Buffer.from(b));

/** Whether a NATS subject pattern list allows `subject` (`*` one token, `>` the rest). */
function natsAllows(patterns: readonly string[], subject: string): boolean {
  const given = subject.split(".");
  return patterns.some((pattern) => {
    const wanted = pattern.split(".");
    for (let index = 0; index < wanted.length; index += 1) {
      if (wanted[index] === ">") return given.length > index;
      if (index >= given.length || (wanted[index] !== "*" && wanted[index] !== given[index])) return false;
    }
    return given.length === wanted.length;
  });
}

for (const { name, open: openTransport } of transports) {
  describe(`bus conformance on ${name}`, () => {
    let transport: Transport;
    /** Control sides and node buses a test opened: closed after it, passed or failed, so none lingers as a consumer. */
    const opened: { close(): Promise<void> }[] = [];
    const openControl = async (options?: { ackWaitMs?: number }) => {
      const side = await transport.openControl(options);
      let closed: Promise<void> | undefined;
      const once = { ...side, close: () => (closed ??= side.close()) };
      opened.push(once);
      return once;
    };
    const openNode = async (node: string) => {
      const identity = await transport.nodeFor(node);
      const bus = await transport.openNode(node, identity);
      let closed: Promise<void> | undefined;
      const close = () => (closed ??= bus.close());
      opened.push({ close });
      return { bus, close, credential: identity.credential };
    };
    afterEach(async () => {
      for (const thing of opened.splice(0)) await thing.close();
    });

    before(async () => {
      transport = await openTransport();
      // The broker's topology, as the control plane makes it.
      const side = await openControl();
      await side.bus.assert();
      await side.close();
    });
    after(async () => {
      await transport.stop();
    });

    test(`conformance (${name}) — report and alive reach the control plane byte for byte, as the broker holds them`, async () => {
      const { bus: node, credential } = await openNode("edge-1");
      const report = payload("report");
      const alive = payload("alive");
      await node.publishReport(report);
      await node.publishAlive(alive);
      await eventually("the broker to hold both", async () => {
        const [heldReport, heldAlive] = await Promise.all([
          transport.peekControl("report", "edge-1"),
          transport.peekControl("alive", "edge-1"),
        ]).catch((error: unknown) => {
          if (/^no (report|alive)/.test((error as Error).message)) return [undefined, undefined];
          throw error;
        });
        return heldReport !== undefined && heldAlive !== undefined ? true : undefined;
      });
      assert.ok(sameBytes(await transport.peekControl("report", "edge-1"), report), "held report bytes");
      assert.ok(sameBytes(await transport.peekControl("alive", "edge-1"), alive), "held alive bytes");

      const side = await openControl();
      const got = collect(side);
      const gotReport = await eventually("the report", () => got.find((d) => sameBytes(d.body, report)));
      const gotAlive = await eventually("the alive", () => got.find((d) => sameBytes(d.body, alive)));
      assert.equal(gotReport.kind, "report");
      assert.equal(gotReport.node, "edge-1");
      assert.equal(gotAlive.kind, "alive");
      assert.equal(gotAlive.node, "edge-1");
      assert.ok(Math.abs(gotReport.receivedAt.getTime() - Date.now()) < 60_000, "received about now");
      // RabbitMQ vouches for the account that published (its user_id is checked); NATS says only the subject's node.
      const identity = credential.type === "amqp" ? credential.username : undefined;
      assert.equal(gotReport.identity, identity);
      assert.equal(gotAlive.identity, identity);
      await side.close();
      await node.close();
    });

    test(`conformance (${name}) — enrol and its reply travel unchanged, to the requester alone`, async () => {
      const side = await openControl();
      const asked: { node: string; body: Uint8Array }[] = [];
      const reply = payload("enrol_reply");
      await side.bus.answerEnrolments((request) => {
        asked.push(request);
        return Promise.resolve({ reply });
      });
      collect(side);
      const token = await transport.tokenFor("edge-2");
      const enrolment = await openEnrolmentSide(transport.nodeUrl, "edge-2", token.credential, token.secret);
      const question = payload("enrol");
      const answer = await enrolment.ask(question, 5000);
      await enrolment.close();
      assert.ok(sameBytes(answer, reply), "the reply arrives unchanged");
      assert.equal(asked.length, 1);
      assert.equal(asked[0]?.node, "edge-2", "the node is the token's, as the broker says");
      assert.ok(sameBytes(asked[0]?.body ?? new Uint8Array(), question), "the question arrives unchanged");
      await side.close();
    });

    /**
     * A join asking `node`'s enrol question of a control plane that takes it and answers only when told: the join is
     * left waiting for its answer, its question known to have arrived.
     */
    const waitingJoin = async (node: string) => {
      const side = await openControl();
      let asked!: () => void;
      const questionArrived = new Promise<void>((resolve) => (asked = resolve));
      let answer!: () => void;
      const answered = new Promise<void>((resolve) => (answer = resolve));
      await side.bus.answerEnrolments(async () => {
        asked();
        await answered;
        return { reply: payload("too late") };
      });
      collect(side);
      const token = await transport.tokenFor(node);
      const enrolment = await openEnrolmentSide(transport.nodeUrl, node, token.credential, token.secret);
      const outcome = enrolment.ask(payload("enrol"), 60_000).then(
        () => "answered",
        (error: unknown) => error,
      );
      await questionArrived;
      /** What the join was told, once it was; the control plane's answer let go and everything closed. */
      const told = async () => {
        const error = await outcome;
        answer();
        await enrolment.close();
        await side.close();
        return error;
      };
      return { token, told };
    };

    test(`conformance (${name}) — a token whose identity ends while its enrolment waits for the answer is refused by the broker, not failed`, async () => {
      // A spent token used again within its grace: the joiner is connected, asking, when the grace ends and the
      // control plane ends the token's identity. The broker then closes the joiner's connection, and that is the
      // broker refusing the token, as it would refuse a new connection with it.
      const { token, told } = await waitingJoin("edge-6");
      await transport.endToken(token.user);
      const error = await told();
      assert.ok(error instanceof BrokerRefusedIdentity, `refused by the broker, not: ${String(error)}`);
      // Its identity is gone for good: a new connection with it is refused as well.
      await assert.rejects(
        openEnrolmentSide(transport.nodeUrl, "edge-6", token.credential, token.secret),
        BrokerRefusedIdentity,
      );
    });

    test(`conformance (${name}) — a join whose connection is lost under its question, its token still good, is told the loss at once, not a refusal`, async () => {
      // RabbitMQ's connections are cut through its listing, which waits to list a node's as well.
      await openNode("edge-7");
      const { token, told } = await waitingJoin("edge-8");
      await transport.dropConnections();
      const error = await told();
      assert.ok(error instanceof BusError, `a bus error, not: ${String(error)}`);
      assert.ok(!(error instanceof BrokerRefusedIdentity), `not a refusal: ${String(error)}`);
      // Told the loss, not a wait for the answer that ran out (the question may wait a minute).
      assert.notEqual(error.code, "timeout", String(error));
      // The token still opens a connection.
      await (await openEnrolmentSide(transport.nodeUrl, "edge-8", token.credential, token.secret)).close();
    });

    test(`conformance (${name}) — declarations and receipts reach the node's own queue unchanged`, async () => {
      const { bus: node } = await openNode("edge-3");
      const got: NodeDelivery[] = [];
      void node.consumeNode((message) => {
        got.push(message);
        return Promise.resolve();
      });
      const side = await openControl();
      const declaration = payload("declaration");
      const receipt = payload("receipt");
      // A subscription on NATS is in place once the node's first message would reach it; send until one does.
      await eventually("the node to listen", async () => {
        await side.bus.publishDeclaration("edge-3", declaration);
        return got.length > 0 ? true : undefined;
      });
      await side.bus.publishReceipt("edge-3", receipt);
      const gotReceipt = await eventually("the receipt", () => got.find((m) => m.kind === "receipt"));
      assert.ok(sameBytes(gotReceipt.body, receipt));
      const declarations = got.filter((m) => m.kind === "declaration");
      assert.ok(declarations.length >= 1);
      for (const message of declarations) assert.ok(sameBytes(message.body, declaration));
      await side.close();
      await node.close();
    });

    test(`conformance (${name}) — events reach a listener unchanged`, async () => {
      const events = await transport.observeEvents();
      const side = await openControl();
      const event = payload("event");
      await side.bus.publishEvent("node.enrolled", event);
      const got = await events.next(3000);
      assert.ok(got !== undefined && sameBytes(got, event));
      await events.close();
      await side.close();
    });

    test(`conformance (${name}) — a consumer that dies before acknowledging: the message comes again, marked redelivered`, async () => {
      const child = spawn(
        process.execPath,
        [
          "--import",
          "tsx",
          join(root, "test/support/dying-consumer.ts"),
          transport.dataDir,
          transport.access.url,
        ],
        { cwd: root, stdio: ["ignore", "pipe", "pipe"] },
      );
      let out = "";
      let err = "";
      child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
      child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString("utf8")));
      const exited = new Promise((resolve) => child.once("exit", resolve));
      try {
        await eventually("the consumer to start", () => (out.includes("consuming") ? true : undefined));
        // Whatever earlier tests left in the queue is taken first and never acknowledged either; this report is
        // the one the test follows.
        const { bus: node } = await openNode("edge-4");
        const report = payload("unacknowledged");
        await node.publishReport(report);
        await node.close();
        const taken = await eventually(
          "the dying consumer to take something",
          () => /^took (\w+) (\S+)$/m.exec(out)?.[2],
          15_000,
        );
        assert.ok(taken.length > 0, err);
      } finally {
        child.kill("SIGKILL");
        await exited;
      }
      const side = await openControl();
      const got = collect(side);
      const again = await eventually("the unacknowledged report again", () =>
        got.find((d) => d.node === "edge-4" && d.body.toString().startsWith("unacknowledged")),
      );
      assert.equal(again.redelivered, true, "marked as delivered before");
      await side.close();
    });

    test(`conformance (${name}) — a batch handed back comes again though the batches after it are acknowledged`, async () => {
      const side = await openControl();
      const got: ControlDelivery[] = [];
      let handedBack = 0;
      void side.bus.consumeControl((batch) => {
        got.push(...batch);
        // The first time the followed report comes, its batch is handed back (as when the store fails).
        const back = batch.some((d) => d.node === "edge-8" && d.body.toString().startsWith("handed back"));
        if (back && handedBack === 0) {
          handedBack += 1;
          return Promise.resolve(batch.map(() => "retry" as const));
        }
        return Promise.resolve(batch.map(() => "done" as const));
      });
      const { bus: node } = await openNode("edge-8");
      await node.publishReport(payload("handed back"));
      await eventually("the report to be handed back", () => (handedBack === 1 ? true : undefined));
      // Within the second before it is offered again, later reports come and are acknowledged, batch after batch.
      for (let k = 0; k < 20; k++) await node.publishReport(payload(`after ${k}`));
      await eventually("the later reports", () =>
        got.filter((d) => d.node === "edge-8" && d.body.toString().startsWith("after ")).length >= 20
          ? true
          : undefined,
      );
      const again = await eventually(
        "the handed-back report again",
        () => got.filter((d) => d.node === "edge-8" && d.body.toString().startsWith("handed back")).at(1),
        15_000,
      );
      assert.equal(again.redelivered, true, "marked as delivered before");
    });

    test(`conformance (${name}) — after every connection drops, the control plane and the node carry on without a person`, async () => {
      const side = await openControl();
      const got = collect(side);
      const reconnected: string[] = [];
      side.bus.onReconnect(() => reconnected.push("control"));
      const { bus: node } = await openNode("edge-5");
      const toNode: NodeDelivery[] = [];
      void node.consumeNode((message) => {
        toNode.push(message);
        return Promise.resolve();
      });
      const before = payload("before the drop");
      await node.publishReport(before);
      await eventually("the first report", () => got.find((d) => sameBytes(d.body, before)));

      await transport.dropConnections();

      const after = payload("after the drop");
      // The node's publish fails while it reconnects; a real agent sends its pending report again each interval.
      await eventually(
        "the node to publish again",
        async () =>
          node.publishReport(after).then(
            () => true,
            (error: unknown) => {
              assert.match((error as Error).message, /broker|closed|connection|reach/i);
              return undefined;
            },
          ),
        20_000,
      );
      await eventually(
        "the control plane to take it",
        () => got.find((d) => sameBytes(d.body, after)),
        20_000,
      );
      const declaration = payload("declaration after the drop");
      await eventually(
        "the node to receive a declaration",
        async () => {
          await side.bus.publishDeclaration("edge-5", declaration).catch((error: unknown) => {
            assert.match((error as Error).message, /broker|closed|connection|reach/i);
          });
          return toNode.some((m) => sameBytes(m.body, declaration)) ? true : undefined;
        },
        20_000,
      );
      await eventually("the control plane to be told it reconnected", () =>
        reconnected.includes("control") ? true : undefined,
      );
      await node.close();
      await side.close();
    });

    test(`conformance (${name}) — one consumer: a standby control plane takes nothing while the holder consumes`, async () => {
      const dir = tempDir("mesh-one-consumer-");
      const planes: RunningControlPlane[] = [];
      const metricsPorts: number[] = [];
      const start = async () => {
        const port = await freePort();
        metricsPorts.push(port);
        const options = compileMeshOptions({
          dataDir: transport.dataDir,
          flags: { store: `sqlite:${join(dir.path, "mesh.db")}`, metrics: `127.0.0.1:${port}` },
          env: { MESH_LEASE_RENEW_EVERY: "300ms", MESH_LEASE_TTL: "1500ms", MESH_LEASE_MARGIN: "300ms" },
        });
        const plane = await serve({
          options,
          broker: transport.access,
          log: createLogger({ level: "error" }),
        });
        planes.push(plane);
        return plane;
      };
      const taken = async (index: number) => {
        const text = await (await fetch(`http://127.0.0.1:${metricsPorts[index]}/metrics`)).text();
        return Number(/^mesh_control_messages_total (\d+)$/m.exec(text)?.[1]);
      };
      const held = async (index: number) => {
        const text = await (await fetch(`http://127.0.0.1:${metricsPorts[index]}/metrics`)).text();
        return /^mesh_lease_held 1$/m.test(text);
      };
      try {
        await start();
        await eventually("the first to hold the lease", async () => ((await held(0)) ? true : undefined));
        await start();
        const { bus: node } = await openNode("edge-6");
        for (let index = 0; index < 20; index += 1) await node.publishReport(payload("r"));
        await eventually("the holder to take all twenty", async () =>
          (await taken(0)) >= 20 ? true : undefined,
        );
        await new Promise((resolve) => setTimeout(resolve, 500));
        assert.equal(await taken(1), 0, "the standby took nothing");
        assert.equal(await held(1), false);

        await planes[0]?.stop();
        await eventually("the standby to hold the lease", async () => ((await held(1)) ? true : undefined));
        for (let index = 0; index < 10; index += 1) await node.publishReport(payload("s"));
        await eventually("the new holder to take all ten", async () =>
          (await taken(1)) >= 10 ? true : undefined,
        );
        await node.close();
      } finally {
        for (const plane of planes) await plane.stop();
        dir.remove();
      }
    });

    test(`conformance (${name}) — the permission matrix: every role × kind × publish and role × place × read, from the forbidden side`, async () => {
      const own = "web-1";
      const other = "web-2";
      // Both nodes exist on the broker (their queues, on RabbitMQ), so only permissions can stop a message.
      await transport.nodeFor(own);
      await transport.nodeFor(other);
      const expectedRead = (role: Role, place: Place, target: string): boolean => {
        const node = role === "control" ? undefined : own;
        if (transport.name === "nats") {
          const subject =
            place === "control_queue"
              ? `mesh.report.${target}`
              : place === "node_queue"
                ? `node.${target}.declaration`
                : `node.${target}.reply.probe`;
          return natsAllows(natsPermissions(role, node).sub.allow, subject);
        }
        const queue = place === "control_queue" ? controlQueue : nodeQueue(target);
        return new RegExp(rabbitPermissions(role, node).read).test(queue);
      };
      const mismatches: string[] = [];
      let checked = 0;
      // The lab's shared identity exists on NATS only (RabbitMQ names a sender by its one user): `mesh lab` refuses
      // shared connections on RabbitMQ, so there is no such account there to probe.
      const rolesHere = transport.name === "nats" ? roles : roles.filter((role) => role !== "lab");
      for (const role of rolesHere) {
        const probe = await transport.probe(role, own);
        try {
          for (const kind of publishedKinds) {
            for (const target of [own, other]) {
              const expected =
                mayPublish(role, kind) && (role === "control" || target === own || kind === "event");
              const verdict = await probe.publish(kind, target);
              checked += 1;
              if ((verdict === "allowed") !== expected) {
                mismatches.push(
                  `${role} publish ${kind} for ${target}: ${verdict}, expected ${expected ? "allowed" : "refused"}`,
                );
              }
            }
          }
          for (const place of places) {
            for (const target of [own, other]) {
              const expected = expectedRead(role, place, target);
              const verdict = await probe.read(place, target);
              checked += 1;
              if ((verdict === "allowed") !== expected) {
                mismatches.push(
                  `${role} read ${place} of ${target}: ${verdict}, expected ${expected ? "allowed" : "refused"}`,
                );
              }
            }
          }
        } finally {
          await probe.close();
        }
      }
      assert.deepEqual(mismatches, []);
      assert.equal(checked, rolesHere.length * (publishedKinds.length + places.length) * 2);
      // What the writers table grants a role for its own node, the broker grants too; nothing for another node.
      for (const role of ["token", "node"] as const) {
        // On RabbitMQ a token's answer comes by direct reply-to, which is no queue: a token reads none at all.
        const readsOwn = role === "node" || transport.name === "nats";
        assert.equal(
          expectedRead(role, role === "token" ? "node_replies" : "node_queue", own),
          readsOwn,
          role,
        );
        for (const place of places) assert.equal(expectedRead(role, place, other), false, `${role} ${place}`);
      }
    });

    if (name === "amqp") {
      test("conformance (amqp) — RabbitMQ holds a second consumer of the control queue as a standby, never splitting the traffic", async () => {
        const first = await openControl();
        const second = await openControl();
        const a = collect(first);
        await new Promise((resolve) => setTimeout(resolve, 300));
        const b = collect(second);
        const { bus: node } = await openNode("edge-7");
        const sent = Array.from({ length: 30 }, (_, index) => payload(`split-${index}`));
        for (const body of sent) await node.publishReport(body);
        const mine = (got: ControlDelivery[]) => got.filter((d) => d.node === "edge-7");
        await eventually("all thirty", () => (mine(a).length + mine(b).length >= 30 ? true : undefined));
        await new Promise((resolve) => setTimeout(resolve, 300));
        assert.equal(mine(b).length, 0, "the second consumer took nothing");
        assert.equal(mine(a).length, 30);
        assert.deepEqual(
          mine(a).map((d) => Buffer.from(d.body).toString("hex")),
          sent.map((body) => body.toString("hex")),
          "in order",
        );
        // The broker's own view: two consumers, one of them active.
        const admin = await amqp.connect(transport.access.url);
        const channel = await admin.createChannel();
        const queue = await channel.checkQueue(controlQueue);
        await admin.close();
        assert.equal(queue.consumerCount, 2);
        // The first goes; the broker hands the queue to the standby.
        await first.close();
        await node.publishReport(payload("after"));
        await eventually("the standby to take over", () =>
          mine(b).some((d) => d.body.toString().startsWith("after")) ? true : undefined,
        );
        await node.close();
        await second.close();
      });
    }
  });
}
