/**
 * RabbitMQ accounts against the machine's broker, in a scratch vhost: the sweep deletes the accounts of tokens
 * that ended and never one issued while it runs; enrolments arriving together each get an account and a queue,
 * usable by their node alone; a bulk delete passes over an account already gone and closes the
 * connections of those it deletes.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import amqp from "amqplib";
import type { ControlIdentities } from "../../src/bus/index.js";
import { openIdentities } from "../../src/bus/index.js";
import { AmqpBrokerIdentities } from "../../src/bus/amqp/identities.js";
import { RabbitManagement } from "../../src/bus/amqp/management.js";
import { parseAmqpUrl } from "../../src/bus/amqp/link.js";
import { nodeQueue } from "../../src/link/index.js";
import { tokensToKeep } from "../../src/control/revocations.js";
import { issueToken } from "../../src/control/tokens.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { managementGet, rabbitApiUrl, scratchVhost } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

describe("RabbitMQ token accounts", () => {
  const dir = tempDir("mesh-amqp-identities-");
  let scratch: ScratchVhost;
  let store: Store;
  let identities: ControlIdentities;
  before(async () => {
    scratch = await scratchVhost();
    store = await openStore(`sqlite:${join(dir.path, "mesh.db")}`, { historyLimit: 10 });
    identities = openIdentities(join(dir.path, "data"), { url: scratch.url });
  });
  after(async () => {
    await identities.close();
    await store.close();
    await scratch.drop();
    dir.remove();
  });

  const issue = (node: string, now = new Date()) =>
    issueToken(store, {
      node,
      ttlMs: 3_600_000,
      fingerprint: `SHA256:${"A".repeat(43)}`,
      now,
      broker: identities,
    });
  const tokenAccounts = async (node: string) =>
    (await scratch.api.users()).filter((user) => user.startsWith(`${scratch.users.prefix}.token.${node}.`));

  test("amqp sweep — an ended token's account goes; one issued while the sweep runs stays", async () => {
    const valid = await issue("sweep-valid");
    const ended = await issue("sweep-ended");
    assert.equal(await store.tokens.revoke(ended.id, new Date(Date.now() - 60_000)), true);
    assert.equal((await tokenAccounts("sweep-ended")).length, 1);

    // A token issued while the sweep runs, once the tokens to keep have been read from the store.
    let late: string | undefined;
    const swept = await identities.sweepTokens(async () => {
      const keep = await tokensToKeep(store, new Date(), 5000);
      late = (await issue("sweep-late")).id;
      return keep;
    });
    assert.equal(swept, 1);
    assert.equal((await tokenAccounts("sweep-ended")).length, 0, "the revoked token's account is deleted");
    assert.equal((await tokenAccounts("sweep-valid")).length, 1, `${valid.id} keeps its account`);
    assert.equal(
      (await tokenAccounts("sweep-late")).length,
      1,
      `${late ?? "the late token"} keeps its account`,
    );

    // The next sweep knows the late token and keeps it too.
    assert.equal(await identities.sweepTokens(() => tokensToKeep(store, new Date(), 5000)), 0);
    assert.equal((await tokenAccounts("sweep-late")).length, 1);
  });

  /** An AMQP connection on the scratch vhost as one account. */
  const connectAs = (username: string, password: string) =>
    amqp.connect({
      protocol: "amqp",
      hostname: new URL(scratch.url).hostname,
      port: Number(new URL(scratch.url).port || 5672),
      vhost: scratch.vhost,
      username,
      password,
    });
  const amqpIdentities = () =>
    new AmqpBrokerIdentities(scratch.api, parseAmqpUrl(scratch.url), join(dir.path, "rabbitmq"));

  test("amqp accounts — forty enrolments at once each get an account and a queue; each account reads its own queue and not another's", async () => {
    const accounts = amqpIdentities();
    const made = await Promise.all(Array.from({ length: 40 }, (_, i) => accounts.forNode(`batch-${i}`)));
    assert.equal(new Set(made.map((one) => one.user)).size, 40, "forty accounts, none shared");
    const listed = await managementGet<{ name: string }[]>(
      `/queues/${encodeURIComponent(scratch.vhost)}?columns=name`,
    );
    const queues = new Set((listed.body ?? []).map((queue) => queue.name));
    for (let i = 0; i < 40; i++) assert.ok(queues.has(nodeQueue(`batch-${i}`)), `batch-${i}'s queue exists`);
    for (const i of [0, 17, 39]) {
      const { credential } = made[i]!;
      assert.ok(credential.type === "amqp" && credential.password !== undefined, "an AMQP account");
      const connection = await connectAs(credential.username, credential.password);
      try {
        const own = await connection.createChannel();
        await own.consume(nodeQueue(`batch-${i}`), () => undefined);
        const other = await connection.createChannel();
        other.on("error", () => undefined);
        await assert.rejects(
          other.consume(nodeQueue(`batch-${(i + 1) % 40}`), () => undefined),
          /403 \(ACCESS-REFUSED\)/,
        );
      } finally {
        await connection.close();
      }
    }
  });

  test("amqp accounts — a bulk delete passes over an account already gone, deletes the rest, and closes their connections", async () => {
    const accounts = amqpIdentities();
    const made = await Promise.all(["gone-1", "gone-2", "gone-3"].map((node) => accounts.forNode(node)));
    const [first, second, third] = made.map((one) => one.user);
    const credential = made[2]!.credential;
    assert.ok(credential.type === "amqp" && credential.password !== undefined);
    const connection = await connectAs(credential.username, credential.password);
    const closed = new Promise<string>((resolve) => {
      const timer = setTimeout(() => resolve("the connection stayed open"), 10_000);
      connection.on("close", (error?: Error) => {
        clearTimeout(timer);
        resolve(String(error));
      });
    });
    connection.on("error", () => undefined);

    assert.equal(await scratch.api.deleteUser(second!), true);
    assert.equal(await scratch.api.deleteUsers([first!, second!, third!]), 2);
    const left = await scratch.api.users();
    for (const user of [first, second, third]) assert.ok(!left.includes(user!), `${user} is gone`);
    const end = await closed;
    if (end === "the connection stayed open") await connection.close();
    assert.match(end, /CONNECTION_FORCED|320/, "the deleted account's connection is closed by the broker");
    assert.equal(await scratch.api.deleteUsers([first!]), 0, "nothing left to delete is not an error");
  });

  test("amqp accounts — a bulk delete of many users goes a few to a call, passing over those already gone in any call", async () => {
    // Three to a call: users gone at a call's start, its middle and its end, and a whole call's worth gone.
    const api = new RabbitManagement(rabbitApiUrl, 3);
    const users = Array.from({ length: 14 }, (_, i) => `${scratch.users.prefix}.bulk.${i}`);
    const gone = new Set([0, 4, 5, 8, 9, 10, 11, 13].map((i) => users[i]));
    await Promise.all(
      users.filter((user) => !gone.has(user)).map((user) => api.putUser(user, "bulk-password")),
    );
    assert.equal(await api.deleteUsers([...users, users[1]!]), users.length - gone.size);
    const left = new Set(await api.users());
    assert.deepEqual(
      users.filter((user) => left.has(user)),
      [],
      "every user listed is gone",
    );
  });

  test("amqp accounts — a node whose queue cannot be made gets no account: the enrolment fails naming why, and nothing is left behind", async () => {
    // A queue of that name already there with other arguments: the broker refuses to make it again as the mesh would.
    const admin = await amqp.connect(scratch.url);
    try {
      const channel = await admin.createChannel();
      await channel.assertQueue(nodeQueue("clash-1"), { durable: true, arguments: { "x-max-length": 1 } });
    } finally {
      await admin.close();
    }
    const accounts = amqpIdentities();
    await assert.rejects(accounts.forNode("clash-1"), (error: Error) => {
      assert.match(
        error.message,
        /^the account and queue of clash-1 could not be made; .*(inequivalent|PRECONDITION|400)/,
      );
      return true;
    });
    const left = (await scratch.api.users()).filter((user) =>
      user.startsWith(`${scratch.users.prefix}.node.clash-1.`),
    );
    assert.deepEqual(left, [], "the account made beside the refused queue is deleted");
  });
});
