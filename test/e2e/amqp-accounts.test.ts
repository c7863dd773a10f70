/**
 * What only RabbitMQ shows of the end-to-end flow (the flow itself runs on both brokers: flow-scenario.ts): the control
 * queue is single-active-consumer, token accounts are swept, a node's own account is held to its own name by the
 * broker (user_id) and by the control plane (the body), and one node's two enrolments leave it one account. Checked
 * from the broker's side, through the management API and an administrator's channel. The suite's `mesh up --broker
 * amqp://…` on a scratch vhost is a fixture; each test joins nodes of its own and runs their agents, stopped when it
 * ends, so each passes run alone.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import amqp from "amqplib";
import { decodeToken } from "../../src/link/index.js";
import { meshHost } from "../support/cli.js";
import type { Fleet, RabbitView } from "../support/fleets.js";
import { channelEnd, openFleet } from "../support/fleets.js";
import { eventually } from "../support/processes.js";
import { managementGet } from "../support/rabbit.js";

/** The node's own RabbitMQ account, from its state dir. */
function accountOf(fleet: Fleet, state: string): { username: string; password: string } {
  const credential = fleet.identityOf(state).broker.credential;
  if (credential.type !== "amqp") throw new Error(`${state} holds no RabbitMQ account`);
  return credential;
}

describe("the mesh end to end, RabbitMQ's side", () => {
  let fleet: Fleet;
  let rabbit: RabbitView;
  before(async () => {
    fleet = await openFleet("amqp");
    if (fleet.rabbit === undefined) throw new Error("a RabbitMQ fleet has RabbitMQ's side");
    rabbit = fleet.rabbit;
  });
  after(async () => {
    await fleet?.close();
  });

  test("amqp flow — the control queue is single-active-consumer, consumed by the running control plane", async () => {
    const { scratch } = rabbit;
    const { body } = await managementGet<{
      durable: boolean;
      arguments: Record<string, unknown>;
      consumers: number;
      single_active_consumer_tag?: string;
    }>(`/queues/${encodeURIComponent(scratch.vhost)}/control`);
    assert.ok(body !== undefined, "the control queue exists");
    assert.equal(body.durable, true);
    assert.equal(body.arguments["x-single-active-consumer"], true);
    assert.equal((await rabbit.queueNow("control"))?.consumerCount, 1);
    // The management API's figures lag by a few seconds: it names the one active consumer in time.
    await eventually("the management API to name the one active consumer", async () => {
      const q = await scratch.api.queue(scratch.vhost, "control");
      return q?.active_consumer !== undefined && q.consumers === 1 ? true : undefined;
    });
    // The mesh's own account, named for this vhost.
    assert.ok((await scratch.api.users()).includes(scratch.users.control));
  });

  test("amqp tokens — the accounts of expired and revoked tokens are swept and refused by the broker; a valid token's stays", async () => {
    // The expiring token lives long enough to see its account made, however busy the machine; then it is swept.
    const expiring = decodeToken(await fleet.issue("db-8", "20s"));
    assert.equal((await rabbit.accounts("token", "db-8")).length, 1, "db-8");
    const revoked = decodeToken(await fleet.issue("db-9"));
    const valid = decodeToken(await fleet.issue("db-10"));
    for (const node of ["db-9", "db-10"])
      assert.equal((await rabbit.accounts("token", node)).length, 1, node);
    const revoking = await fleet.cli(["token", "revoke", revoked.id]);
    assert.equal(revoking.code, 0, revoking.stderr);
    await eventually(
      "the sweep to delete the expired and the revoked token's accounts",
      async () =>
        (await rabbit.accounts("token", "db-8")).length === 0 &&
        (await rabbit.accounts("token", "db-9")).length === 0
          ? true
          : undefined,
      120_000,
    );
    assert.equal((await rabbit.accounts("token", "db-10")).length, 1, "a valid token keeps its account");
    // From the revoked token's side: the broker no longer knows it.
    if (revoked.broker?.credential.type !== "amqp") throw new Error("not a RabbitMQ token");
    await assert.rejects(
      amqp.connect({
        protocol: "amqp",
        hostname: "127.0.0.1",
        port: 5672,
        vhost: rabbit.scratch.vhost,
        username: revoked.broker.credential.username,
        password: revoked.secret,
      }),
      /ACCESS-REFUSED|403/,
    );
    assert.equal(expiring.node, "db-8");
    assert.equal(valid.node, "db-10");
  });

  test("amqp attacker — a node's own account cannot sign as another, speak for another in the body, nor read another's queue", async (t) => {
    // Two nodes, each running, each with a kept report (report_sequence 1).
    const states: string[] = [];
    for (const node of ["web-1", "web-2"]) {
      const state = join(fleet.dir, node);
      const run = await meshHost(["join", await fleet.issue(node), "--state", state]);
      assert.equal(run.code, 0, run.stderr);
      const root = join(fleet.dir, `root-${node}`);
      mkdirSync(root);
      fleet.runAgent(state, root, t);
      await fleet.declareFiles(node, [{ path: "/etc/motd", content: `${node}\n` }]);
      states.push(state);
    }
    for (const node of ["web-1", "web-2"])
      await eventually(`${node}'s report to be kept`, async () =>
        (await fleet.show(node)).account?.outcome === "applied" ? true : undefined,
      );
    // web-1's agent consumes its queue.
    await eventually("web-1's agent to consume its queue", async () =>
      (await rabbit.queueNow("node.web-1"))?.consumerCount === 1 ? true : undefined,
    );
    const mine = accountOf(fleet, states[1] ?? "");
    const theirs = accountOf(fleet, states[0] ?? "");
    const connection = await amqp.connect({
      protocol: "amqp",
      hostname: "127.0.0.1",
      port: 5672,
      vhost: rabbit.scratch.vhost,
      username: mine.username,
      password: mine.password,
    });
    try {
      const before = await fleet.show("web-2");
      const report = {
        kind: "report",
        node: "web-1",
        epoch: before.declaration?.epoch ?? 0,
        sequence: 99,
        report_sequence: 99,
        digest: "sha256:" + "0".repeat(64),
        outcome: "applied",
        items: [],
        sent_at: new Date().toISOString(),
      };
      const body = Buffer.from(JSON.stringify(report));

      // (a) user_id naming another node's account: the broker closes the channel.
      const forged = await connection.createChannel();
      const forgedEnd = channelEnd(forged);
      forged.publish("mesh", "report", body, { userId: theirs.username, persistent: true });
      assert.match(await forgedEnd, /406 \(PRECONDITION-FAILED\).*user_id property set to/);

      // (b) its own user_id, a body naming another node: the control plane refuses it and counts it.
      const own = await connection.createConfirmChannel();
      own.publish("mesh", "report", body, { userId: mine.username, persistent: true });
      await own.waitForConfirms();
      const refused = await eventually("the refusal to be counted", async () => {
        const s = await fleet.show("web-2");
        return (s.refused.report_refused ?? 0) > (before.refused.report_refused ?? 0) ? s : undefined;
      });
      assert.equal(refused.refused.report_refused, (before.refused.report_refused ?? 0) + 1);
      // Through `mesh up`'s own stderr, a step behind the store: waited for, not read at once.
      await eventually("the refusal to be logged", () =>
        /"event":"report\.refused","node":"web-2","reason":"its body names node web-1"/.test(
          fleet.up.stderr(),
        )
          ? true
          : undefined,
      );
      assert.deepEqual(refused.account, before.account, "web-2's recovery copy is untouched");
      const web1 = await fleet.show("web-1");
      assert.equal(web1.account?.report_sequence, 1, "web-1's recovery copy is untouched");
      assert.deepEqual(web1.refused, {}, "nothing was counted against web-1");
      await own.close();

      // (c) reading another node's queue: 403.
      const reader = await connection.createChannel();
      const readerEnd = channelEnd(reader);
      await assert.rejects(
        reader.consume("node.web-1", () => undefined),
        /403 \(ACCESS-REFUSED\)/,
      );
      assert.match(await readerEnd, /403 \(ACCESS-REFUSED\).*node\.web-1/);
      assert.equal((await rabbit.queueNow("node.web-1"))?.consumerCount, 1, "only web-1 reads it");
    } finally {
      await connection.close();
    }
  });

  test("amqp enrolment — one node's two tokens presented at once leave it one account, the other revoked", async () => {
    const tokens = [await fleet.issue("twice-1"), await fleet.issue("twice-1")];
    const states = ["twice-1a", "twice-1b"].map((name) => join(fleet.dir, name));
    const joins = await Promise.all(
      tokens.map((token, i) => meshHost(["join", token, "--state", states[i] ?? ""])),
    );
    for (const run of joins) assert.equal(run.code, 0, run.stderr);
    const users = states.map((state) => accountOf(fleet, state).username);
    assert.notEqual(users[0], users[1]);
    // Whichever enrolled second replaced the first, whose account the broker no longer has.
    await eventually("one account to be left for the node", async () =>
      (await rabbit.accounts("node", "twice-1")).length === 1 ? true : undefined,
    );
    const [left] = await rabbit.accounts("node", "twice-1");
    assert.ok(left !== undefined && users.includes(left), `${left} is one of ${users.join(", ")}`);
  });
});
