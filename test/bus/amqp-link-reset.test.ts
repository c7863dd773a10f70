/**
 * A connection reset while the link sets a new connection up, against the machine's RabbitMQ in a scratch vhost.
 * amqplib's recovery listens to a connection's errors only after the set-up; before the link listened itself, such
 * a reset was an error event nobody heard, which ends the process (seen with 9,800 nodes connecting at once). Now
 * the reset is said, the recovery connects again, and the link works.
 */
import assert from "node:assert/strict";
import { Socket } from "node:net";
import { after, before, describe, test } from "node:test";
import type { ChannelModel } from "amqplib";
import { AmqpLink, parseAmqpUrl } from "../../src/bus/amqp/link.js";
import { createLogger } from "../../src/log.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { rabbitAdminUrl, scratchVhost } from "../support/rabbit.js";

function socketOf(connection: ChannelModel): Socket {
  const socket = (connection as unknown as { connection: { stream: unknown } }).connection.stream;
  assert.ok(socket instanceof Socket, "amqplib keeps its socket as the connection's stream");
  return socket;
}

describe("AMQP link: a reset while setting up", () => {
  let scratch: ScratchVhost;
  let link: AmqpLink | undefined;
  before(async () => {
    scratch = await scratchVhost();
  });
  after(async () => {
    await link?.close();
    await scratch.drop();
  });

  test("is said, and the link connects again and works", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger({
      pretty: false,
      write: (line) => lines.push(JSON.parse(line) as Record<string, unknown>),
    });
    const admin = new URL(rabbitAdminUrl);
    link = await AmqpLink.open({
      address: parseAmqpUrl(scratch.url),
      username: decodeURIComponent(admin.username),
      password: decodeURIComponent(admin.password),
      name: "mesh-test link reset",
      reconnect: true,
      log,
    });
    let current: ChannelModel | undefined;
    let armed = false;
    let setUps = 0;
    /** Settles when a set-up after the reset has been done whole. */
    let setUpAgain: () => void = () => undefined;
    const setUpAfterReset = new Promise<void>((resolve) => (setUpAgain = resolve));
    await link.onEveryConnection(async (connection) => {
      setUps += 1;
      if (armed) {
        armed = false;
        // The broker (or the network) resets the connection while the set-up is still at work on it.
        socketOf(connection).destroy(Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }));
        await connection.createChannel();
        return;
      }
      if (current !== undefined) setUpAgain();
      current = connection;
    });
    assert.ok(current !== undefined);
    const first = current;
    armed = true;
    // The connection goes (with an error, as a broker's reset is seen: a socket closed quietly is noticed only
    // when its heartbeats stop); the next one is reset while set up, the one after is set up whole.
    socketOf(first).destroy(Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }));
    await setUpAfterReset;
    assert.notEqual(current, first, "the link connected again after the reset");
    assert.ok(setUps >= 3, `set up ${setUps} times`);
    assert.ok(
      lines.some(
        (line) =>
          line.event === "broker.connection_error" &&
          line.while === "setting up the connection" &&
          String(line.error).includes("ECONNRESET"),
      ),
      "the reset while setting up is said",
    );
    const channel = await link.channel();
    const queue = await channel.assertQueue("", { exclusive: true });
    assert.equal(queue.messageCount, 0);
    await channel.close();
  });
});
