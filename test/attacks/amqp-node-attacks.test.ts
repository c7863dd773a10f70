/**
 * Attacks by token holders and nodes on the machine's RabbitMQ (a scratch vhost) under `mesh up --broker amqp://…`,
 * each tried with the credentials the attacker really holds, straight on the broker: a token for an enrolled node
 * taking that node's declarations off its queue, and a node routing a message past the topic permissions with CC.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import amqp from "amqplib";
import { decodeToken } from "../../src/link/index.js";
import { askWrongEverywhere } from "../support/hostile.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { scratchVhost } from "../support/rabbit.js";
import { operatorOf } from "../support/operator.js";
import { tempDir } from "../support/tmp.js";

describe("attacks on RabbitMQ", () => {
  const dir = tempDir("mesh-attacks-amqp-");
  const data = join(dir.path, "data");
  let scratch: ScratchVhost;
  let up: Running;
  const operator = operatorOf(data, dir.path);
  const { show, issue, joinAndRun, declare, applied } = operator;
  const brokerUrl = (username: string, password: string) =>
    `amqp://${encodeURIComponent(username)}:${encodeURIComponent(password)}@127.0.0.1:5672/${encodeURIComponent(scratch.vhost)}`;

  before(async () => {
    scratch = await scratchVhost();
    up = startBin("mesh", ["--data", data, "up", "--broker", scratch.url]);
    await eventually("the control plane to serve", () =>
      /control\.serving/.test(up.stderr()) ? true : undefined,
    );
  });
  after(async () => {
    await operator.stopAgents();
    await up.stop();
    await scratch.drop();
    dir.remove();
  });

  test("attack — a token for an enrolled node cannot consume that node's queue", async () => {
    await joinAndRun("tok-a");
    // The re-join of a rebuilt machine: a valid, unused token for a node that is enrolled.
    const token = decodeToken(await issue("tok-a"));
    assert.ok(token.broker !== null && token.broker.credential.type === "amqp");
    const connection = await amqp.connect(brokerUrl(token.broker.credential.username, token.secret));
    try {
      const channel = await connection.createChannel();
      // The refusal closes the channel; it is read from the consume's rejection below.
      channel.on("error", () => undefined);
      const taken: string[] = [];
      const verdict = await channel
        .consume("node.tok-a", (message) => {
          if (message !== null) taken.push(message.content.toString("utf8"));
        })
        .then(
          () => "the token's account consumes the node's queue",
          (error: unknown) => String(error),
        );
      assert.match(verdict, /403 \(ACCESS-REFUSED\)/);
      await declare("tok-a", "for the node only");
      await applied("tok-a", 1);
      assert.deepEqual(taken, []);
    } finally {
      await connection.close();
    }
  });

  test("attack — a node's report carrying CC headers is refused, not kept", async () => {
    const state = await joinAndRun("cc-a");
    await declare("cc-a", "routed");
    const before = await applied("cc-a", 1);
    assert.ok(before.declaration !== null && before.account?.report_sequence != null);
    const identity = JSON.parse(readFileSync(join(state, "identity.json"), "utf8")) as {
      broker: { credential: { username: string; password: string } };
    };
    const { username, password } = identity.broker.credential;
    const connection = await amqp.connect(brokerUrl(username, password));
    try {
      const channel = await connection.createConfirmChannel();
      const report = {
        kind: "report",
        node: "cc-a",
        epoch: before.declaration.epoch,
        sequence: before.declaration.sequence,
        report_sequence: before.account.report_sequence + 100,
        digest: before.declaration.digest,
        outcome: "applied",
        items: [],
        sent_at: new Date().toISOString(),
      };
      // Routed by "report" (permitted) and, past the permissions, by "alive" and an event key.
      await new Promise<void>((resolve, reject) =>
        channel.publish(
          "mesh",
          "report",
          Buffer.from(JSON.stringify(report)),
          { userId: username, headers: { CC: ["alive", "event.forged"] } },
          (error: unknown) =>
            error === null || error === undefined ? resolve() : reject(new Error(JSON.stringify(error))),
        ),
      );
      await channel.close();
    } finally {
      await connection.close();
    }
    const refused = await eventually("the CC'd report to be refused", async () => {
      const shown = await show("cc-a");
      return (shown.refused.report_refused ?? 0) >= 1 ? shown : undefined;
    });
    assert.equal(
      refused.account?.report_sequence,
      before.account.report_sequence,
      "nothing was kept from it",
    );
  });

  test("attack — an enrolment whose faults outgrow a reply is still answered: refused, with a reason cut to fit", async () => {
    const logBefore = up.stderr().length;
    // Before, the reply failed its own check and the question went back to the queue, again and again.
    await askWrongEverywhere(await issue("wrong-1"), "wrong-1");
    assert.doesNotMatch(up.stderr().slice(logBefore), /control\.handler_failed|enrol\.answer_failed/);
  });
});
