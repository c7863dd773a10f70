/**
 * Broker-scoped identities, tested from the forbidden side: a real nats-server in operator mode, users minted from
 * the writers table, and every forbidden publish or subscribe attempted and seen refused by the server.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator, PermissionViolationError } from "@nats-io/transport-node";
import { pushAccountUpdate } from "../../src/bus/nats/account-update.js";
import {
  accountJwt,
  loadOrCreateAuthority,
  newUserKey,
  systemUserJwt,
  userJwt,
} from "../../src/bus/nats/authority.js";
import { NatsBrokerIdentities } from "../../src/bus/nats/identities.js";
import { freePort, startNatsServer } from "../../src/bus/nats/server.js";
import { join } from "node:path";
import { tempDir } from "../support/tmp.js";
import type { UserGrant } from "../../src/bus/nats/authority.js";
import { inboxPrefix } from "../../src/link/index.js";
import type { OperatorServer } from "../support/nats.js";
import { observerCredentials, startOperatorServer } from "../support/nats.js";

interface Identity {
  publicKey: string;
  seed: string;
  jwt: string;
}

describe("NATS identities from the writers table", () => {
  let broker: OperatorServer;
  let control: NatsConnection;
  /** A test-only identity that reads every subject, to see whether a refused message got anywhere. */
  let observer: NatsConnection;
  const open: NatsConnection[] = [];

  const mint = async (grant: Omit<UserGrant, "userPublicKey">): Promise<Identity> => {
    const key = newUserKey();
    return { ...key, jwt: await userJwt(broker.authority, { ...grant, userPublicKey: key.publicKey }) };
  };
  const connectAs = async (identity: Identity, node?: string): Promise<NatsConnection> => {
    const nc = await connect({
      servers: broker.url,
      authenticator: jwtAuthenticator(identity.jwt, new TextEncoder().encode(identity.seed)),
      reconnect: false,
      ...(node === undefined ? {} : { inboxPrefix: inboxPrefix(node) }),
    });
    open.push(nc);
    return nc;
  };
  /** The next permission violation the server reports on this connection. */
  const nextViolation = async (nc: NatsConnection): Promise<PermissionViolationError> => {
    for await (const status of nc.status()) {
      if (status.type === "error" && status.error instanceof PermissionViolationError) return status.error;
    }
    throw new Error("the connection closed without a permission violation");
  };
  /** Publishes and reports whether the control plane received it within a short wait. */
  const delivered = async (from: NatsConnection, subject: string): Promise<boolean> => {
    const sub = observer.subscribe(subject, { max: 1 });
    await observer.flush();
    from.publish(subject, "probe");
    await from.flush();
    const got = await Promise.race([
      (async () => {
        for await (const _ of sub) return true;
        return false;
      })(),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 300)),
    ]);
    sub.unsubscribe();
    return got;
  };

  before(async () => {
    broker = await startOperatorServer();
    control = await connectAs(await mint({ name: "control", role: "control" }));
    observer = await connectAs(await observerCredentials(broker.authority));
  });
  after(async () => {
    for (const nc of open) if (!nc.isClosed()) await nc.close();
    await broker.stop();
  });

  test("nats identity — a token may publish only its node's enrol subject", async () => {
    const token = await connectAs(
      await mint({ name: "tok", role: "token", node: "web-1", expiresAt: new Date(Date.now() + 60_000) }),
      "web-1",
    );
    assert.equal(await delivered(token, "mesh.enrol.web-1"), true);

    for (const forbidden of [
      "mesh.enrol.web-2",
      "mesh.report.web-1",
      "mesh.alive.web-1",
      "node.web-1.declaration",
    ]) {
      const violation = nextViolation(token);
      assert.equal(await delivered(token, forbidden), false, `${forbidden} reached the control plane`);
      const error = await violation;
      assert.equal(error.operation, "publish");
      assert.equal(error.subject, forbidden);
    }
  });

  test("nats identity — a token reads only its own replies, not its node's declarations", async () => {
    const token = await connectAs(
      await mint({ name: "tok", role: "token", node: "web-1", expiresAt: new Date(Date.now() + 60_000) }),
      "web-1",
    );
    const violation = nextViolation(token);
    token.subscribe("node.web-1.declaration");
    const error = await violation;
    assert.equal(error.operation, "subscription");
    // Its own reply inbox works: a request from the token is answered by the control plane.
    const responder = control.subscribe("mesh.enrol.web-1", {
      callback: (_, msg) => {
        msg.respond("welcome");
      },
    });
    await control.flush();
    const reply = await token.request("mesh.enrol.web-1", "hello", { timeout: 2000 });
    assert.equal(reply.string(), "welcome");
    responder.unsubscribe();
  });

  test("nats identity — node A cannot publish as node B nor read B's queue", async () => {
    const a = await connectAs(await mint({ name: "web-1", role: "node", node: "web-1" }), "web-1");
    assert.equal(await delivered(a, "mesh.report.web-1"), true);
    assert.equal(await delivered(a, "mesh.alive.web-1"), true);

    for (const forbidden of ["mesh.report.web-2", "mesh.alive.web-2", "mesh.enrol.web-2", "mesh.event.x"]) {
      const violation = nextViolation(a);
      assert.equal(await delivered(a, forbidden), false, `${forbidden} reached the control plane`);
      assert.equal((await violation).subject, forbidden);
    }

    const violation = nextViolation(a);
    const spy = a.subscribe("node.web-2.>");
    const error = await violation;
    assert.equal(error.operation, "subscription");
    assert.equal(error.subject, "node.web-2.>");
    assert.equal(spy.isClosed(), true);

    // Its own queue is readable: a declaration sent to web-1 arrives.
    const own = a.subscribe("node.web-1.>", { max: 1 });
    await a.flush();
    control.publish("node.web-1.declaration", "for web-1");
    const received: string[] = [];
    for await (const msg of own) received.push(msg.string());
    assert.deepEqual(received, ["for web-1"]);
  });

  test("nats identity — the broker itself refuses a token whose JWT has expired", async () => {
    const expired = await mint({
      name: "old",
      role: "token",
      node: "web-1",
      expiresAt: new Date(Date.now() - 1000),
    });
    await assert.rejects(connectAs(expired, "web-1"), (error: unknown) => {
      assert.match(String((error as Error).message), /authorization|expired/i);
      return true;
    });
  });

  test("nats identity — a token expiring this very moment is refused at connect, not let in for the rest of its second", async () => {
    // The broker counts expiry in whole seconds: a JWT naming the current second would be let in until it ends.
    const ending = await mint({ name: "ending", role: "token", node: "web-1", expiresAt: new Date() });
    // Refused by the broker's check of the credentials; one let in would be dropped as expired, a moment too late.
    await assert.rejects(connectAs(ending, "web-1"), (error: unknown) => {
      assert.match(String((error as Error).message), /authorization violation/i);
      return true;
    });
  });

  test("nats identity — a revoked user is disconnected at once and cannot come back, without a restart", async () => {
    const node = await mint({ name: "web-9", role: "node", node: "web-9" });
    const victim = await connectAs(node, "web-9");
    const systemKey = newUserKey();
    const system = await connect({
      servers: broker.url,
      authenticator: jwtAuthenticator(
        await systemUserJwt(broker.authority, systemKey.publicKey),
        new TextEncoder().encode(systemKey.seed),
      ),
    });
    open.push(system);
    const closed = victim.closed();
    const revokedAt = Math.floor(Date.now() / 1000) + 1;
    await pushAccountUpdate(
      system,
      broker.authority.account.getPublicKey(),
      await accountJwt(broker.authority, { [node.publicKey]: revokedAt }),
    );
    const outcome = await Promise.race([
      closed.then(() => "closed"),
      new Promise((resolve) => setTimeout(() => resolve("still connected"), 3000)),
    ]);
    assert.equal(outcome, "closed");
    await assert.rejects(connectAs(node, "web-9"), /authorization|revoked/i);
  });
});

describe("NATS revocations survive a server restart", () => {
  test("nats identity — a revoked user stays refused after the mesh's own server restarts from its config", async () => {
    const dir = tempDir("mesh-revoke-restart-");
    const authority = loadOrCreateAuthority(join(dir.path, "keys"));
    const port = await freePort();
    const embedded = { dir: join(dir.path, "server"), host: "127.0.0.1", port };
    const identities = new NatsBrokerIdentities(authority, `nats://127.0.0.1:${port}`, embedded);
    const config = await identities.writeServerConfig(new Map());
    let server = await startNatsServer(config, embedded, join(dir.path, "nats.log"));
    const user = newUserKey();
    const jwt = await userJwt(authority, {
      name: "gone-1",
      userPublicKey: user.publicKey,
      role: "node",
      node: "gone-1",
    });
    const connectUser = () =>
      connect({
        servers: server.url,
        reconnect: false,
        authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(user.seed)),
      });
    try {
      await (await connectUser()).close();
      await identities.revoke(new Map([[user.publicKey, new Date()]]));
      await identities.close();
      await server.stop();
      server = await startNatsServer(config, embedded, join(dir.path, "nats.log"));
      await assert.rejects(connectUser(), /authorization|revoked/i);
    } finally {
      await server.stop();
      dir.remove();
    }
  });
});
