/**
 * A token's broker identity, tried from the attacker's side after the token ended, on both real brokers through
 * the built `mesh` and `mesh-host`: the attacker holds a copy of the token string (its secret, its broker
 * credential) and tries to connect with it
 * - after `mesh token revoke` has exited: refused at once, and a connection it opened before is closed;
 * - after the rightful machine joined with it: refused once the grace for the joiner's answer has passed;
 * - after the token expired: refused from the moment of expiry, a connection opened before is closed then.
 * On RabbitMQ (no account expiry) the control plane deletes the account at each of these moments, not on a fixed
 * tick: the safety-net sweep is set to ten minutes here, so only those deletions can pass.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import amqp from "amqplib";
import type { ChannelModel } from "amqplib";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import { decodeToken } from "../../src/link/index.js";
import { mesh, meshHost } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { scratchVhost } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

/** The grace the control planes here run with: how long a spent token's identity outlives the joiner's answer. */
const graceMs = 500;
/**
 * A generous deadline for what must happen (a hang guard, not a measurement: the machine may be busy). The sweep runs
 * every 10 minutes here, so anything that happens within it was not the sweep's doing. How soon after the grace or
 * the expiry it happens is a figure for the bench (the tests print it as a diagnostic).
 */
const deadlineMs = 120_000;
const env = { MESH_TOKEN_GRACE: `${graceMs}ms`, MESH_TOKEN_SWEEP_EVERY: "10m" };

interface Issued {
  id: string;
  token: string;
  expiresAt: number;
}

/** What one attempt to connect with a token's credentials came to. */
type Attempt = { accepted: true } | { accepted: false; error: string };

function operatorOf() {
  const dir = tempDir("mesh-token-accounts-");
  const data = join(dir.path, "data");
  const cli = (args: string[]) => mesh(["--data", data, ...args], env);
  const issue = async (node: string, ttl = "1h"): Promise<Issued> => {
    const run = await cli(["token", "issue", node, "--ttl", ttl, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    const { token, expires_at } = JSON.parse(run.stdout) as { token: string; expires_at: string };
    return { id: decodeToken(token).id, token, expiresAt: Date.parse(expires_at) };
  };
  const join_ = async (issued: Issued, node: string) => {
    const run = await meshHost(["join", issued.token, "--state", join(dir.path, node), "--timeout", "30s"]);
    assert.equal(run.code, 0, run.stderr);
    assert.equal(run.stdout, `${node}\n`);
  };
  return { dir, data, cli, issue, join: join_ };
}

/**
 * Tries the token's credentials until the broker refuses them, and returns when that happened. Fails once
 * `deadline` passes with the credentials still accepted.
 */
async function refusedBy(
  what: string,
  attempt: () => Promise<Attempt>,
  deadline: number,
): Promise<{ at: number; error: string }> {
  for (;;) {
    const result = await attempt();
    const at = Date.now();
    if (!result.accepted) return { at, error: result.error };
    if (at > deadline)
      assert.fail(`${what}: the token's credentials still work ${at - deadline} ms past the bound`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Waits for a connection's end, failing after a generous time (the event is what is awaited). */
function ended(end: Promise<string>, what: string): Promise<{ at: number; reason: string }> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    end.then((reason) => ({ at: Date.now(), reason })),
    new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: the connection stayed open`)), deadlineMs);
    }),
  ]).finally(() => clearTimeout(timer));
}

describe("attack: a RabbitMQ token account after its token ended", () => {
  const operator = operatorOf();
  let scratch: ScratchVhost;
  let up: Running;
  const opened: ChannelModel[] = [];

  const credentials = (issued: Issued) => {
    const content = decodeToken(issued.token);
    if (content.broker?.credential.type !== "amqp") throw new Error("not a RabbitMQ token");
    return { username: content.broker.credential.username, password: content.secret };
  };
  const connectAs = (issued: Issued) => {
    const url = new URL(scratch.url);
    return amqp.connect({
      protocol: "amqp",
      hostname: url.hostname,
      port: Number(url.port || 5672),
      vhost: scratch.vhost,
      ...credentials(issued),
    });
  };
  const attempt = (issued: Issued) => async (): Promise<Attempt> =>
    connectAs(issued).then(
      async (connection) => {
        connection.on("error", () => undefined);
        // Let in: the broker may close it in the same moment (the account deleted), which changes nothing here.
        await connection.close().catch(() => "closed by the broker meanwhile");
        return { accepted: true };
      },
      (error: unknown) => ({ accepted: false, error: String(error) }),
    );
  /** A connection the attacker holds open with the token's credentials, and the broker's reason when it ends. */
  const holdOpen = async (issued: Issued) => {
    const connection = await connectAs(issued);
    opened.push(connection);
    connection.on("error", () => undefined);
    const end = new Promise<string>((resolve) =>
      connection.once("close", (error?: Error) => resolve(String(error))),
    );
    return { connection, end };
  };

  before(async () => {
    scratch = await scratchVhost();
    up = startBin("mesh", ["--data", operator.data, "up", "--broker", scratch.url], env);
    const observer = await amqp.connect(scratch.url);
    try {
      await eventually(
        "the control plane to consume the control queue",
        async () => {
          if (!/control\.serving/.test(up.stderr())) return undefined;
          const channel = await observer.createChannel();
          const { consumerCount } = await channel.checkQueue("control");
          await channel.close();
          return consumerCount === 1 ? true : undefined;
        },
        60_000,
      );
    } finally {
      await observer.close();
    }
  });
  after(async () => {
    for (const connection of opened) await connection.close().catch(() => "closed already");
    const code = await up.stop();
    await scratch.drop();
    operator.dir.remove();
    assert.equal(code, 0, up.stderr());
  });

  test("amqp attack — once `mesh token revoke` has exited, the token's account is gone: refused, and a connection opened before is closed", async () => {
    const issued = await operator.issue("revoked-1");
    const held = await holdOpen(issued);
    const revoked = await operator.cli(["token", "revoke", issued.id]);
    assert.equal(revoked.code, 0, revoked.stderr);
    assert.equal(revoked.stderr, "", "the broker was told");

    // The command has exited: nothing is left to wait for.
    const now = await attempt(issued)();
    assert.ok(
      !now.accepted,
      "the revoked token's credentials still connect after `mesh token revoke` exited",
    );
    assert.match(now.error, /ACCESS-REFUSED|403/);
    assert.ok(!(await scratch.api.users()).includes(credentials(issued).username), "the account is deleted");
    const end = await ended(held.end, "the connection opened before the revoke");
    assert.match(end.reason, /CONNECTION_FORCED|320/);
  });

  test("amqp attack — after the rightful machine joined, the token's account is refused once the grace is over, not at a sweep", async (t) => {
    const issued = await operator.issue("spent-1");
    await operator.join(issued, "spent-1");
    // The joiner has its answer: from here the account lasts the grace, then it is deleted.
    const joinedAt = Date.now();
    const refused = await refusedBy("after the join", attempt(issued), joinedAt + deadlineMs);
    // Caught while the account was being deleted, a connection is closed in its handshake; after, it is refused.
    assert.match(refused.error, /ACCESS-REFUSED|403|ConnectionClose/);
    t.diagnostic(`refused ${refused.at - joinedAt} ms after the join ended (grace ${graceMs} ms)`);
    const again = await attempt(issued)();
    assert.ok(!again.accepted && /ACCESS-REFUSED|403/.test(again.error), JSON.stringify(again));
    assert.ok(!(await scratch.api.users()).includes(credentials(issued).username), "the account is deleted");
  });

  test("amqp attack — a token that expires unused is refused from its expiry on, and connections opened before are closed then", async (t) => {
    // Three tokens 12 s apart: each account must end at its own token's expiry, not at the next tick of a sweep:
    // from its expiry on, and before the next token's.
    const ttls = ["8s", "20s", "32s"];
    const issued = await Promise.all(ttls.map((ttl, i) => operator.issue(`expiring-${i + 1}`, ttl)));
    const held = await Promise.all(issued.map((one) => holdOpen(one)));
    const ends = await Promise.all(held.map((one, i) => ended(one.end, `expiring-${i + 1}`)));
    for (const [i, end] of ends.entries()) {
      const late = end.at - (issued[i]?.expiresAt ?? Number.NaN);
      t.diagnostic(`expiring-${i + 1}: its connection closed ${late} ms after the token's expiry`);
      assert.match(end.reason, /CONNECTION_FORCED|320/, `expiring-${i + 1}`);
      // Never before its expiry (the clocks are one machine's), and before the next token's expiry.
      assert.ok(late >= -100, `expiring-${i + 1}'s account was deleted ${-late} ms before the token expired`);
      const next = issued[i + 1];
      if (next !== undefined)
        assert.ok(
          end.at < next.expiresAt,
          `expiring-${i + 1}'s account was deleted ${late} ms after its token expired, after the next one's expiry`,
        );
      const again = await attempt(issued[i] as Issued)();
      assert.ok(!again.accepted, `expiring-${i + 1}: the expired token's credentials still connect`);
      assert.match(again.error, /ACCESS-REFUSED|403/);
    }
  });
});

describe("attack: a NATS token identity after its token ended", () => {
  const operator = operatorOf();
  let up: Running;
  let brokerUrl: string;
  const opened: NatsConnection[] = [];

  const connectAs = (issued: Issued) => {
    const content = decodeToken(issued.token);
    if (content.broker?.credential.type !== "nats") throw new Error("not a NATS token");
    const { jwt, seed } = content.broker.credential;
    return connect({
      servers: brokerUrl,
      reconnect: false,
      timeout: 10_000,
      authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
    });
  };
  /**
   * One attempt: accepted only if the connection also survives a round trip to the server. A connection let in at
   * the very moment of expiry is dropped by the server at once, and a flush pending then never settles: the
   * connection's end decides.
   */
  const attempt = (issued: Issued) => async (): Promise<Attempt> => {
    let nc: NatsConnection;
    try {
      nc = await connectAs(issued);
    } catch (error) {
      return { accepted: false, error: String(error) };
    }
    const outcome = await Promise.race([
      nc.flush().then(
        (): Attempt => ({ accepted: true }),
        (error: unknown): Attempt => ({ accepted: false, error: String(error) }),
      ),
      nc.closed().then((reason): Attempt => ({ accepted: false, error: String(reason) })),
    ]);
    if (!nc.isClosed()) await nc.close();
    return outcome;
  };
  const holdOpen = async (issued: Issued) => {
    const nc = await connectAs(issued);
    opened.push(nc);
    return { nc, end: nc.closed().then((reason) => String(reason)) };
  };

  before(async () => {
    up = startBin("mesh", ["--data", operator.data, "up", "--nats-port", "0"], env);
    brokerUrl = await eventually(
      "mesh up to print its broker",
      () => /broker\s+(nats:\/\/\S+)/.exec(up.stdout())?.[1],
      60_000,
    );
    await eventually("the control plane to serve", () =>
      /control\.serving/.test(up.stderr()) ? true : undefined,
    );
  });
  after(async () => {
    for (const nc of opened) if (!nc.isClosed()) await nc.close();
    const code = await up.stop();
    operator.dir.remove();
    assert.equal(code, 0, up.stderr());
  });

  test("nats attack — once `mesh token revoke` has exited, the token's identity is refused, and a connection opened before is closed", async () => {
    const issued = await operator.issue("revoked-1");
    const held = await holdOpen(issued);
    const revoked = await operator.cli(["token", "revoke", issued.id]);
    assert.equal(revoked.code, 0, revoked.stderr);
    assert.equal(revoked.stderr, "", "the broker was told");

    const now = await attempt(issued)();
    assert.ok(!now.accepted, "the revoked token's identity still connects after `mesh token revoke` exited");
    assert.match(now.error, /authorization|revoked/i);
    await ended(held.end, "the connection opened before the revoke");
  });

  test("nats attack — after the rightful machine joined, the token's identity is refused once the grace is over, not at a sweep", async (t) => {
    const issued = await operator.issue("spent-1");
    await operator.join(issued, "spent-1");
    const joinedAt = Date.now();
    const refused = await refusedBy("after the join", attempt(issued), joinedAt + deadlineMs);
    // Refused at connect, or (in the moment of revocation) let in and dropped at once; after, refused at connect.
    assert.match(refused.error, /authorization|revoked|ECONNRESET|EPIPE/i);
    t.diagnostic(`refused ${refused.at - joinedAt} ms after the join ended (grace ${graceMs} ms)`);
    const again = await attempt(issued)();
    assert.ok(!again.accepted && /authorization|revoked/i.test(again.error), JSON.stringify(again));
  });

  test("nats attack — a token that expires unused is refused by the broker from its expiry on", async (t) => {
    const issued = await operator.issue("expiring-1", "6s");
    const held = await holdOpen(issued);
    const end = await ended(held.end, "the connection opened before the expiry");
    // The broker counts the identity's expiry in whole seconds and lets it in through the second its JWT names: the
    // JWT names the second before the token's expiry falls in, so the connection is closed at most two seconds before
    // the token's expiry, not earlier.
    t.diagnostic(`closed ${issued.expiresAt - end.at} ms before the token's expiry`);
    assert.ok(
      end.at >= issued.expiresAt - 2100,
      `closed ${issued.expiresAt - end.at} ms before the token's expiry`,
    );
    // From the token's expiry on, the broker refuses the identity at connect: not let in, not even for a moment.
    const untilExpiry = issued.expiresAt - Date.now();
    if (untilExpiry > 0) await new Promise((resolve) => setTimeout(resolve, untilExpiry));
    const again = await attempt(issued)();
    assert.ok(!again.accepted, "the expired token's identity still connects");
    // Refused by the broker's check of the credentials, not let in and dropped as expired.
    assert.match(again.error, /authorization violation/i);
  });
});
