/**
 * The control plane reads each delivery's numbers off the message's reply subject rather than through the client's
 * `info`: on a real nats-server those numbers are the client's own, a message offered again included; a subject of
 * neither layout, or with a field that is no number, is left to the client.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import type { JsMsg } from "@nats-io/jetstream";
import { AckPolicy, jetstream, jetstreamManager, StorageType } from "@nats-io/jetstream";
import { readAckSubject, replyOf } from "../../src/bus/nats/ack-subject.js";
import type { OperatorServer } from "../support/nats.js";
import { observerCredentials, startOperatorServer } from "../support/nats.js";

/** What the client itself reads of a delivery, in the reader's terms. */
function clientReading(msg: JsMsg) {
  return {
    deliveryCount: msg.info.deliveryCount,
    streamSequence: msg.info.streamSequence,
    deliverySequence: msg.info.deliverySequence,
    storedAtMs: msg.time.getTime(),
  };
}

function replyText(msg: JsMsg): string {
  const reply = replyOf(msg);
  assert.ok(reply !== undefined, "the client's message has its reply subject");
  return reply;
}

describe("NATS — a delivery read off its reply subject", () => {
  let server: OperatorServer;
  let nc: NatsConnection;

  before(async () => {
    server = await startOperatorServer();
    const { jwt, seed } = await observerCredentials(server.authority);
    nc = await connect({
      servers: server.url,
      authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
      reconnect: false,
    });
  });
  after(async () => {
    await nc.close();
    await server.stop();
  });

  test("nats ack subject — each delivery's numbers are the client's own, a message offered again included", async () => {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: "READ", subjects: ["read.>"], storage: StorageType.Memory });
    await jsm.consumers.add("READ", { durable_name: "reader", ack_policy: AckPolicy.Explicit });
    const js = jetstream(nc);
    for (let i = 1; i <= 5; i++) await js.publish(`read.${i}`, new TextEncoder().encode(`message ${i}`));
    const consumer = await js.consumers.get("READ", "reader");
    const readings: Array<{ reply: string; client: ReturnType<typeof clientReading> }> = [];
    const take = async (count: number, settle: (msg: JsMsg) => void) => {
      const messages = await consumer.fetch({ max_messages: count, expires: 10_000 });
      for await (const msg of messages) {
        readings.push({ reply: replyText(msg), client: clientReading(msg) });
        settle(msg);
      }
    };
    // The first two handed back at once: they are offered again, counted as a second delivery.
    let handedBack = 0;
    await take(5, (msg) => (handedBack++ < 2 ? msg.nak() : msg.ack()));
    await take(2, (msg) => msg.ack());
    assert.equal(readings.length, 7, "five messages, two of them offered again");
    assert.ok(
      readings.some(({ client }) => client.deliveryCount === 2),
      "a message offered again is among them",
    );
    for (const { reply, client } of readings) assert.deepEqual(readAckSubject(reply), client, reply);
  });

  test("nats ack subject — either layout is read; any other subject is left to the client", () => {
    // The older layout, and the newer with a domain, an account and a closing token.
    assert.deepEqual(readAckSubject("$JS.ACK.REPORTS.control-1.3.1042.77.1764990000123456789.12"), {
      deliveryCount: 3,
      streamSequence: 1042,
      deliverySequence: 77,
      storedAtMs: 1764990000123,
    });
    assert.deepEqual(
      readAckSubject("$JS.ACK.hub.ACCOUNTHASH.REPORTS.control-1.1.9.8.1764990000987654321.0.a1b2c3"),
      { deliveryCount: 1, streamSequence: 9, deliverySequence: 8, storedAtMs: 1764990000987 },
    );
    // Times at a millisecond's edge, where adding up nineteen digits one by one lands a millisecond away from the
    // client's reading (the nearest double, then floored).
    for (const nanos of ["1764901042532999836", "1764972124414999910", "1764967726576999823"]) {
      assert.equal(
        readAckSubject(`$JS.ACK.REPORTS.control-1.1.5.5.${nanos}.0`)?.storedAtMs,
        Math.floor(Number.parseInt(nanos, 10) / 1_000_000),
        nanos,
      );
    }
    for (const subject of [
      "",
      "_INBOX.abc.def",
      "$JS.ACK.REPORTS.control-1.3.1042.77",
      "$JS.ACK.REPORTS.control-1.3.10x2.77.1764990000123456789.12",
      "$JS.ACK.REPORTS.control-1.3..77.1764990000123456789.12",
      "$JS.ACK.REPORTS.control-1.-3.1042.77.1764990000123456789.12",
      "$JS.ACK.REPORTS.control-1.3.1042.77.123456789012345678901.12",
      "$JS.ACK.a.b.REPORTS.control-1.3.1042",
    ]) {
      assert.equal(readAckSubject(subject), undefined, `${subject} is left to the client`);
    }
  });
});
