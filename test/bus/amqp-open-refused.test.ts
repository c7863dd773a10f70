/**
 * An account the broker knows but lets into no vhost, against the machine's RabbitMQ in a scratch vhost: RabbitMQ
 * takes its password, then answers connection.open by closing the connection, and amqplib's error for that carries no
 * reply code. A join meets it when its token's account loses its permissions a moment before the account itself is
 * deleted (a token spent or swept while it is used again): it is the same refusal as an unknown account, not a broker
 * failure.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { parseAmqpUrl } from "../../src/bus/amqp/link.js";
import { AmqpEnrolmentBus } from "../../src/bus/amqp/node-bus.js";
import { BrokerRefusedIdentity } from "../../src/bus/errors.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { scratchVhost } from "../support/rabbit.js";

describe("AMQP: an account the vhost refuses at open", () => {
  let scratch: ScratchVhost;
  before(async () => {
    scratch = await scratchVhost();
  });
  after(async () => {
    await scratch.drop();
  });

  test("a join's connection is refused as its identity, not failed as the broker", async () => {
    // Named under the scratch vhost's prefix, so the vhost's clean-up deletes it.
    const username = `${scratch.users.prefix}.token.open-refused.${randomBytes(4).toString("hex")}`;
    const password = randomBytes(12).toString("hex");
    await scratch.api.putUser(username, password);
    await assert.rejects(
      AmqpEnrolmentBus.open(parseAmqpUrl(scratch.url), "open-refused", { username, password }),
      (error: unknown) => {
        assert.ok(error instanceof BrokerRefusedIdentity, String(error));
        assert.equal(error.code, "broker_refused_identity");
        assert.match(error.message, /refused this account the vhost/);
        return true;
      },
    );
    // Given the vhost, the same account gets through: the refusal was the vhost's, nothing else.
    await scratch.api.setPermissions(scratch.vhost, username, {
      configure: "^$",
      write: "^$",
      read: "^$",
      topic: { exchange: "mesh", write: "^$", read: "^$" },
    });
    const bus = await AmqpEnrolmentBus.open(parseAmqpUrl(scratch.url), "open-refused", {
      username,
      password,
    });
    await bus.close();
  });
});
