/**
 * The whole flow on the machine's RabbitMQ, in a scratch vhost, through `mesh up --broker amqp://…`: join → declare
 * → applied → out of touch → back → refusals → a node's own account trying what it must not → retire, run as an
 * operator and a machine would run it (the built executables), checked from the broker's side as well.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import amqp from "amqplib";
import type { Channel, ChannelModel } from "amqplib";
import { TokenRefused } from "../../src/errors.js";
import { decodeToken, encodeToken } from "../../src/link/index.js";
import { mesh, meshHost } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { managementGet, scratchVhost } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

interface Shown {
  state: string;
  liveness: string;
  last_seen: string | null;
  declaration: { sequence: number; epoch: number; digest: string } | null;
  account: {
    outcome: string;
    reason: string | null;
    sequence: number | null;
    report_sequence: number | null;
    received_at: string;
    items: Array<{ id: string; state: string }>;
  } | null;
  refused: Record<string, number>;
}

interface NodeIdentity {
  node: string;
  broker: { url: string; credential: { type: string; username: string; password: string } };
}

/** The channel's end as the broker states it: the close reason amqplib reports, or a timeout. */
function channelEnd(channel: Channel, ms = 5000): Promise<string> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve("the channel stayed open"), ms);
    channel.once("error", (error: Error) => {
      clearTimeout(timer);
      resolve(error.message);
    });
  });
}

describe("the mesh end to end over RabbitMQ", () => {
  const dir = tempDir("mesh-amqp-e2e-");
  const data = join(dir.path, "data");
  let scratch: ScratchVhost;
  let up: Running;
  /** The administrator on the scratch vhost: it reads queue depths and consumers as they are now. */
  let observer: ChannelModel;
  const agents: Running[] = [];
  const cli = (args: string[]) => mesh(["--data", data, ...args]);
  const show = async (node: string): Promise<Shown> => {
    const run = await cli(["node", "show", node, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return JSON.parse(run.stdout) as Shown;
  };
  const issue = async (node: string, ttl = "1h"): Promise<string> => {
    const run = await cli(["token", "issue", node, "--ttl", ttl, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return (JSON.parse(run.stdout) as { token: string }).token;
  };
  const runAgent = (state: string, root: string | undefined): Running => {
    const rootArgs = root === undefined ? [] : ["--root", root];
    const agent = startBin("mesh-host", ["run", "--state", state, ...rootArgs, "--alive-every", "200ms"]);
    agents.push(agent);
    return agent;
  };
  let declarations = 0;
  const declareFiles = async (
    node: string,
    files: Array<{ path: string; content: string; mode?: string }>,
  ) => {
    declarations += 1;
    const file = join(dir.path, `decl-${declarations}.json`);
    writeFileSync(file, JSON.stringify({ files }));
    const run = await cli(["declare", node, "-f", file, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return JSON.parse(run.stdout) as { node: string; sequence: number; epoch: number };
  };
  const identityOf = (state: string): NodeIdentity =>
    JSON.parse(readFileSync(join(state, "identity.json"), "utf8")) as NodeIdentity;
  /** The mesh's broker accounts that exist now, by role. */
  const accounts = async (role: "token" | "node", node: string): Promise<string[]> =>
    (await scratch.api.users()).filter((user) => user.startsWith(`${scratch.users.prefix}.${role}.${node}.`));
  /** A queue's depth and consumers now (the management API's figures lag by seconds), or undefined if absent. */
  const queueNow = async (queue: string) => {
    const channel = await observer.createChannel();
    const end = channelEnd(channel);
    const checked = await channel.checkQueue(queue).then(
      (found) => found,
      (error: unknown) => {
        if (!/404 \(NOT-FOUND\)/.test(String(error))) throw error;
        return undefined;
      },
    );
    if (checked === undefined) assert.match(await end, /404 \(NOT-FOUND\)/);
    else await channel.close();
    return checked;
  };
  const nodeUrl = () => `amqp://127.0.0.1:5672/${encodeURIComponent(scratch.vhost)}`;

  before(async () => {
    scratch = await scratchVhost();
    observer = await amqp.connect(scratch.url);
    up = startBin("mesh", ["--data", data, "--out-of-touch-after", "2s", "up", "--broker", scratch.url]);
    await eventually("mesh up to say it is up", () =>
      /The mesh is up\.\n\s+broker\s+amqp:\/\/\S+ \(RabbitMQ\)/.test(up.stdout()) ? true : undefined,
    );
    // It says so before it holds the lease; it serves once it consumes the control queue.
    await eventually("the control plane to consume the control queue", async () =>
      /control\.serving/.test(up.stderr()) && (await queueNow("control"))?.consumerCount === 1
        ? true
        : undefined,
    );
  });
  after(async () => {
    for (const agent of agents) await agent.stop("SIGTERM");
    const code = await up.stop();
    await observer.close();
    await scratch.drop();
    dir.remove();
    assert.equal(code, 0, up.stderr());
  });

  test("amqp flow — the control queue is single-active-consumer, consumed by the running control plane", async () => {
    const { body } = await managementGet<{
      durable: boolean;
      arguments: Record<string, unknown>;
      consumers: number;
      single_active_consumer_tag?: string;
    }>(`/queues/${encodeURIComponent(scratch.vhost)}/control`);
    assert.ok(body !== undefined, "the control queue exists");
    assert.equal(body.durable, true);
    assert.equal(body.arguments["x-single-active-consumer"], true);
    assert.equal((await queueNow("control"))?.consumerCount, 1);
    // The management API's figures lag by a few seconds: it names the one active consumer in time.
    await eventually("the management API to name the one active consumer", async () => {
      const q = await scratch.api.queue(scratch.vhost, "control");
      return q?.active_consumer !== undefined && q.consumers === 1 ? true : undefined;
    });
    // The mesh's own account, named for this vhost.
    assert.ok((await scratch.api.users()).includes(scratch.users.control));
  });

  test("amqp flow — join → declare → file written under the node's root → node show applied → node list here; the spent token's account is gone", async () => {
    const token = await issue("web-1");
    const tokenUser = scratch.users.token("web-1", decodeToken(token).id);
    assert.deepEqual(await accounts("token", "web-1"), [tokenUser], "the token has its own account");
    const state = join(dir.path, "web-1");
    const joined = await meshHost(["join", token, "--state", state, "--label", "tier=front"]);
    assert.equal(joined.code, 0, joined.stderr);
    assert.equal(joined.stdout, "web-1\n");

    // The spent token's account is deleted by the broker; the node has an account of its own and a queue.
    await eventually("the spent token's account to be deleted", async () =>
      (await accounts("token", "web-1")).length === 0 ? true : undefined,
    );
    const identity = identityOf(state);
    assert.equal(identity.broker.credential.type, "amqp");
    assert.equal(identity.broker.url, nodeUrl());
    assert.deepEqual(await accounts("node", "web-1"), [identity.broker.credential.username]);
    assert.ok(
      (await scratch.api.queue(scratch.vhost, "node.web-1")) !== undefined,
      "the node's queue exists",
    );

    const root = join(dir.path, "root-1");
    mkdirSync(root);
    runAgent(state, root);
    const sent = await declareFiles("web-1", [{ path: "/etc/motd", content: "hello\n", mode: "0640" }]);
    const lease = JSON.parse((await cli(["lease", "show", "--json"])).stdout) as {
      holder: { pid: number } | null;
      epoch: number;
    };
    assert.equal(lease.holder?.pid, up.child.pid);
    assert.deepEqual(sent, { node: "web-1", sequence: 1, epoch: lease.epoch });
    const motd = join(root, "etc", "motd");
    await eventually("the file to be written", () => (existsSync(motd) ? true : undefined));
    assert.equal(readFileSync(motd, "utf8"), "hello\n");

    const shown = await eventually("the report to be kept", async () => {
      const s = await show("web-1");
      return s.account?.outcome === "applied" ? s : undefined;
    });
    assert.equal(shown.state, "enrolled");
    assert.deepEqual(shown.account?.items, [{ id: "file:/etc/motd", state: "applied" }]);
    assert.equal(shown.account?.sequence, 1);
    assert.equal(shown.declaration?.sequence, 1);
    const list = JSON.parse((await cli(["node", "list", "--json"])).stdout) as Array<{
      name: string;
      liveness: string;
    }>;
    assert.equal(list.find((n) => n.name === "web-1")?.liveness, "here");
    // The node's one consumer is on its own queue; the receipt emptied the pending report.
    await eventually("the agent to drop its pending report", () =>
      existsSync(join(state, "pending-report.json")) ? undefined : true,
    );
    assert.equal((await queueNow("node.web-1"))?.consumerCount, 1);
  });

  test("amqp flow — a stopped agent goes out of touch; started again with no token it is here and gets what was declared meanwhile", async () => {
    const state = join(dir.path, "web-2");
    const root = join(dir.path, "root-2");
    mkdirSync(root);
    assert.equal((await meshHost(["join", await issue("web-2"), "--state", state, "--root", root])).code, 0);
    const agent = runAgent(state, undefined);
    await eventually("web-2 to be here", async () =>
      (await show("web-2")).liveness === "here" ? true : undefined,
    );
    assert.equal(await agent.stop("SIGTERM"), 0, agent.stderr());

    await eventually("web-2 to be out of touch", async () =>
      (await show("web-2")).liveness === "out_of_touch" ? true : undefined,
    );
    assert.match((await cli(["node", "list"])).stdout, /web-2\s+enrolled\s+out of touch \d+s/);

    // Declared while nobody consumes the node's queue: the broker keeps it there.
    await declareFiles("web-2", [{ path: "/srv/while-away", content: "declared while away\n" }]);
    assert.equal((await queueNow("node.web-2"))?.messageCount, 1);
    runAgent(state, undefined);
    const file = join(root, "srv", "while-away");
    await eventually("the declaration sent while away to arrive", () =>
      existsSync(file) ? true : undefined,
    );
    assert.equal(readFileSync(file, "utf8"), "declared while away\n");
    await eventually("web-2 to be here again, its report kept", async () => {
      const s = await show("web-2");
      return s.liveness === "here" && s.account?.outcome === "applied" && s.account.sequence === 1
        ? true
        : undefined;
    });
    await eventually("both crossings to be logged", () =>
      /node\.out_of_touch.*web-2/.test(up.stderr()) && /node\.back_in_touch.*web-2/.test(up.stderr())
        ? true
        : undefined,
    );
    assert.equal(up.stderr().match(/node\.out_of_touch[^\n]*web-2/g)?.length, 1, "logged once going out");
    assert.equal(up.stderr().match(/node\.back_in_touch[^\n]*web-2/g)?.length, 1, "logged once coming back");
  });

  test("amqp enrolment — reused, expired, unknown and wrong-secret tokens are refused with the same line, promptly", async () => {
    const refusals: Array<[string, string]> = [];
    const attempt = async (what: string, token: string) => {
      const started = Date.now();
      const run = await meshHost([
        "join",
        token,
        "--state",
        join(dir.path, `refused-${refusals.length}`),
        "--timeout",
        "10s",
      ]);
      assert.equal(run.code, 1, `${what}: ${run.stdout}${run.stderr}`);
      assert.ok(Date.now() - started < 5000, `${what} took ${Date.now() - started} ms`);
      refusals.push([what, run.stderr]);
    };

    const reused = await issue("db-1");
    assert.equal((await meshHost(["join", reused, "--state", join(dir.path, "db-1")])).code, 0);
    await attempt("reused", reused);

    const expired = await issue("db-2", "1s");
    await new Promise((resolve) => setTimeout(resolve, 1500));
    await attempt("expired", expired);

    const valid = decodeToken(await issue("db-3"));
    await attempt("unknown", encodeToken({ ...valid, id: "tok_ffffffffffff" }));
    await attempt("with a wrong secret", encodeToken({ ...valid, secret: "A".repeat(43) }));

    const lines = new Set(refusals.map(([, stderr]) => stderr));
    assert.deepEqual([...lines], [`mesh-host: ${TokenRefused.text}\n`], JSON.stringify(refusals));
    // None of them enrolled anything, and db-3's token may still be spent by its own machine.
    for (const node of ["db-2", "db-3"]) assert.equal((await show(node)).state, "invited");
    assert.equal((await accounts("node", "db-3")).length, 0);
    const tokens = JSON.parse((await cli(["token", "list", "--json"])).stdout) as Array<{
      id: string;
      status: string;
    }>;
    assert.equal(tokens.find((t) => t.id === valid.id)?.status, "valid");
  });

  test("amqp tokens — the accounts of expired and revoked tokens are swept and refused by the broker; a valid token's stays", async () => {
    const expiring = decodeToken(await issue("db-8", "2s"));
    const revoked = decodeToken(await issue("db-9"));
    const valid = decodeToken(await issue("db-10"));
    for (const node of ["db-8", "db-9", "db-10"])
      assert.equal((await accounts("token", node)).length, 1, node);
    const revoking = await cli(["token", "revoke", revoked.id]);
    assert.equal(revoking.code, 0, revoking.stderr);
    await eventually(
      "the sweep to delete the expired and the revoked token's accounts",
      async () =>
        (await accounts("token", "db-8")).length === 0 && (await accounts("token", "db-9")).length === 0
          ? true
          : undefined,
      20_000,
    );
    assert.equal((await accounts("token", "db-10")).length, 1, "a valid token keeps its account");
    // From the revoked token's side: the broker no longer knows it.
    if (revoked.broker?.credential.type !== "amqp") throw new Error("not a RabbitMQ token");
    await assert.rejects(
      amqp.connect({
        protocol: "amqp",
        hostname: "127.0.0.1",
        port: 5672,
        vhost: scratch.vhost,
        username: revoked.broker.credential.username,
        password: revoked.secret,
      }),
      /ACCESS-REFUSED|403/,
    );
    assert.equal(expiring.node, "db-8");
    assert.equal(valid.node, "db-10");
  });

  test("amqp enrolment — a token presented for another node is refused with the same line, and its node stays invited", async () => {
    const valid = decodeToken(await issue("db-5"));
    const started = Date.now();
    const run = await meshHost([
      "join",
      encodeToken({ ...valid, node: "db-6" }),
      "--state",
      join(dir.path, "refused-other-node"),
      "--timeout",
      "10s",
    ]);
    assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms`);
    assert.deepEqual(
      { code: run.code, stdout: run.stdout, stderr: run.stderr },
      { code: 1, stdout: "", stderr: `mesh-host: ${TokenRefused.text}\n` },
    );
    assert.equal((await show("db-5")).state, "invited");
  });

  test("amqp attacker — a node's own account cannot sign as another, speak for another in the body, nor read another's queue", async () => {
    const mine = identityOf(join(dir.path, "web-2")).broker.credential;
    const theirs = identityOf(join(dir.path, "web-1")).broker.credential;
    const connection = await amqp.connect({
      protocol: "amqp",
      hostname: "127.0.0.1",
      port: 5672,
      vhost: scratch.vhost,
      username: mine.username,
      password: mine.password,
    });
    try {
      const before = await show("web-2");
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
        const s = await show("web-2");
        return (s.refused.report_refused ?? 0) > (before.refused.report_refused ?? 0) ? s : undefined;
      });
      assert.equal(refused.refused.report_refused, (before.refused.report_refused ?? 0) + 1);
      assert.match(
        up.stderr(),
        /"event":"report\.refused","node":"web-2","reason":"its body names node web-1"/,
      );
      assert.deepEqual(refused.account, before.account, "web-2's recovery copy is untouched");
      const web1 = await show("web-1");
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
      assert.equal((await queueNow("node.web-1"))?.consumerCount, 1, "only web-1 reads it");
    } finally {
      await connection.close();
    }
  });

  test("amqp retire — the broker deletes the node's account and queue; its agent ends with a clear error", async () => {
    const agent = agents[0];
    assert.ok(agent !== undefined);
    const user = identityOf(join(dir.path, "web-1")).broker.credential.username;
    assert.ok((await scratch.api.users()).includes(user));
    assert.equal(await scratch.api.connectionsOf(user), 1, "the agent is connected");

    const retired = await cli(["node", "retire", "web-1"]);
    assert.equal(retired.code, 0, retired.stderr);
    assert.equal(retired.stdout, "retired web-1\n");
    assert.ok(!(await scratch.api.users()).includes(user), "the node's account is deleted");
    assert.equal(await scratch.api.queue(scratch.vhost, "node.web-1"), undefined, "its queue is deleted");
    const code = await Promise.race([
      agent.exited,
      new Promise((resolve) => setTimeout(() => resolve("running"), 10_000)),
    ]);
    assert.equal(code, 1, agent.stderr());
    assert.match(agent.stderr(), /refused this identity/);
    assert.equal(await scratch.api.connectionsOf(user), 0);
    assert.equal((await show("web-1")).state, "retired");
    const again = await cli(["node", "retire", "web-1"]);
    assert.equal(again.code, 1);
    assert.equal(again.stderr, "mesh: node web-1 is already retired\n");
    // The control plane itself carries on.
    assert.equal(up.child.exitCode, null, up.stderr());
  });

  test("amqp enrolment — eight machines joining at once each get an account and a queue of their own", async () => {
    const names = Array.from({ length: 8 }, (_, i) => `crowd-${i + 1}`);
    const tokens = await Promise.all(names.map((node) => issue(node)));
    const joins = await Promise.all(
      names.map((node, i) => meshHost(["join", tokens[i] ?? "", "--state", join(dir.path, node)])),
    );
    joins.forEach((run, i) => {
      assert.equal(run.code, 0, run.stderr);
      assert.equal(run.stdout, `${names[i]}\n`);
    });
    const users = names.map((node) => identityOf(join(dir.path, node)).broker.credential.username);
    assert.equal(new Set(users).size, names.length, "no two nodes share an account");
    for (const [i, node] of names.entries()) {
      assert.deepEqual(await accounts("node", node), [users[i]]);
      assert.ok(
        (await scratch.api.queue(scratch.vhost, `node.${node}`)) !== undefined,
        `node.${node} exists`,
      );
      assert.equal((await show(node)).state, "enrolled");
    }
    // One listing of the broker's users a look (RabbitMQ answers several at once while deleting users with 500s).
    const tokenAccount = new RegExp(`^${scratch.users.prefix.replace(/[.]/g, "\\.")}\\.token\\.crowd-`);
    await eventually("the spent tokens' accounts to be deleted", async () =>
      (await scratch.api.users()).some((user) => tokenAccount.test(user)) ? undefined : true,
    );
  });

  test("amqp enrolment — one node's two tokens presented at once leave it one account, the other revoked", async () => {
    const tokens = [await issue("twice-1"), await issue("twice-1")];
    const states = ["twice-1a", "twice-1b"].map((name) => join(dir.path, name));
    const joins = await Promise.all(
      tokens.map((token, i) => meshHost(["join", token, "--state", states[i] ?? ""])),
    );
    for (const run of joins) assert.equal(run.code, 0, run.stderr);
    const users = states.map((state) => identityOf(state).broker.credential.username);
    assert.notEqual(users[0], users[1]);
    // Whichever enrolled second replaced the first, whose account the broker no longer has.
    await eventually("one account to be left for the node", async () =>
      (await accounts("node", "twice-1")).length === 1 ? true : undefined,
    );
    const [left] = await accounts("node", "twice-1");
    assert.ok(left !== undefined && users.includes(left), `${left} is one of ${users.join(", ")}`);
  });
});
