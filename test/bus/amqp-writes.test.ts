/**
 * What a turn of the event loop publishes on RabbitMQ goes to the socket together (`writeTogether`), against the
 * machine's broker in a scratch vhost: every message arrives, in the order published, and the socket is written a
 * few times, not once a frame. The same publishing without it is counted too, so the count can tell the two apart.
 */
import assert from "node:assert/strict";
import { Socket } from "node:net";
import { after, before, describe, test } from "node:test";
import amqp from "amqplib";
import type { ChannelModel } from "amqplib";
import { AmqpLink, parseAmqpUrl, PublishChannel, writeTogether } from "../../src/bus/amqp/link.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { rabbitAdminUrl, scratchVhost } from "../support/rabbit.js";

const published = 500;

/** Counts the calls that reach the socket's own writing (each a system call, or one for a corked run). */
function countWrites(model: ChannelModel): { count(): number } {
  const socket = (model as unknown as { connection: { stream: Socket } }).connection.stream;
  assert.ok(socket instanceof Socket, "amqplib keeps its socket as the connection's stream");
  let writes = 0;
  const write = socket._write.bind(socket);
  const writev = socket._writev?.bind(socket);
  socket._write = (...args: Parameters<Socket["_write"]>) => {
    writes += 1;
    write(...args);
  };
  if (writev !== undefined) {
    socket._writev = (...args: Parameters<NonNullable<Socket["_writev"]>>) => {
      writes += 1;
      writev(...args);
    };
  }
  return { count: () => writes };
}

/** Publishes `published` messages in one turn to a fresh queue, waits for their confirms, and reads them back. */
async function publishInOneTurn(
  model: ChannelModel,
  queue: string,
): Promise<{ writes: number; bodies: string[] }> {
  const channel = await model.createConfirmChannel();
  await channel.assertQueue(queue, { durable: false, autoDelete: false });
  const writes = countWrites(model);
  for (let i = 0; i < published; i++) channel.sendToQueue(queue, Buffer.from(`message ${i}`));
  await channel.waitForConfirms();
  const counted = writes.count();
  const bodies: string[] = [];
  for (;;) {
    const message = await channel.get(queue, { noAck: true });
    if (message === false) break;
    bodies.push(message.content.toString());
  }
  await channel.deleteQueue(queue);
  await channel.close();
  return { writes: counted, bodies };
}

describe("AMQP writes — one turn's frames together", () => {
  let scratch: ScratchVhost;
  const models: ChannelModel[] = [];
  before(async () => {
    scratch = await scratchVhost();
  });
  after(async () => {
    for (const model of models) await model.close();
    await scratch.drop();
  });

  test("what one turn publishes reaches the broker whole and in order, in a few writes", async () => {
    const together = await amqp.connect(scratch.url);
    models.push(together);
    writeTogether(together);
    const apart = await amqp.connect(scratch.url);
    models.push(apart);

    const joined = await publishInOneTurn(together, "writes.together");
    const separate = await publishInOneTurn(apart, "writes.apart");

    const expected = Array.from({ length: published }, (_, i) => `message ${i}`);
    assert.deepEqual(joined.bodies, expected);
    assert.deepEqual(separate.bodies, expected);
    // Without it, each message is a write of its own (the count shows the difference can be seen at all).
    assert.ok(separate.writes >= published, `apart: ${separate.writes} writes for ${published} messages`);
    assert.ok(joined.writes <= 20, `together: ${joined.writes} writes for ${published} messages`);
  });

  test("the mesh's link writes so: a turn's confirmed publishes in a few writes", async () => {
    const admin = new URL(rabbitAdminUrl);
    const link = await AmqpLink.open({
      address: parseAmqpUrl(scratch.url),
      username: decodeURIComponent(admin.username),
      password: decodeURIComponent(admin.password),
      name: "mesh-test writes",
      reconnect: false,
    });
    try {
      let connection: ChannelModel | undefined;
      await link.onEveryConnection((made) => {
        connection = made;
        return Promise.resolve();
      });
      assert.ok(connection !== undefined);
      const channel = await link.channel();
      await channel.assertQueue("writes.link", { durable: false });
      const publisher = new PublishChannel(link);
      // The confirm channel is opened first, so the count is the publishing's alone.
      await publisher.publish("", "writes.link", Buffer.from("first"), {});
      const writes = countWrites(connection);
      await Promise.all(
        Array.from({ length: published }, (_, i) =>
          publisher.publish("", "writes.link", Buffer.from(`message ${i}`), {}),
        ),
      );
      assert.equal((await channel.checkQueue("writes.link")).messageCount, published + 1);
      assert.ok(writes.count() <= 20, `${writes.count()} writes for ${published} messages`);
      await publisher.close();
      await channel.deleteQueue("writes.link");
      await channel.close();
    } finally {
      await link.close();
    }
  });
});
