/**
 * The mesh's JetStream questions while the account's claims are updated, as the control plane updates them at every
 * join (each token identity is revoked once its node has joined). nats-server leaves the account's JetStream API
 * without a responder for a moment while it applies an update, and the client reports a request that reached nobody
 * as "jetstream is not enabled": `mesh declare` run during a wave of joins failed with exactly that, on opening the
 * lease. The lease, the control plane's backlog question and its consumers' setting up ask again then, within their
 * timeouts. Without that, about one question in a hundred failed here.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import type { DeliveryOutcome } from "../../src/bus/index.js";
import { pushAccountUpdate } from "../../src/bus/nats/account-update.js";
import type { UserGrant } from "../../src/bus/nats/authority.js";
import { accountJwt, newUserKey, systemUserJwt, userJwt } from "../../src/bus/nats/authority.js";
import { NatsControlBus } from "../../src/bus/nats/control-bus.js";
import { NatsKvLease } from "../../src/bus/nats/lease-kv.js";
import { controlSubject } from "../../src/link/index.js";
import { createLogger, errorText } from "../../src/log.js";
import type { OperatorServer } from "../support/nats.js";
import { startOperatorServer } from "../support/nats.js";
import { eventually } from "../support/processes.js";

let broker: OperatorServer;
const open: NatsConnection[] = [];
const quiet = createLogger({ level: "error" });

async function connectWith(jwt: string, seed: string): Promise<NatsConnection> {
  const nc = await connect({
    servers: broker.url,
    authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
  });
  open.push(nc);
  return nc;
}

async function connectAs(grant: Omit<UserGrant, "userPublicKey">): Promise<NatsConnection> {
  const key = newUserKey();
  return connectWith(await userJwt(broker.authority, { ...grant, userPublicKey: key.publicKey }), key.seed);
}

/**
 * Pushes account updates one after another, each revoking one more identity as a join does, until `stop`; returns
 * how many it pushed.
 */
async function updatingAccount(): Promise<{ stop: () => Promise<number> }> {
  const key = newUserKey();
  const system = await connectWith(await systemUserJwt(broker.authority, key.publicKey), key.seed);
  const account = broker.authority.account.getPublicKey();
  let updating = true;
  let updates = 0;
  const revoked: Record<string, number> = {};
  const pushing = (async () => {
    while (updating) {
      revoked[newUserKey().publicKey] = Math.floor(Date.now() / 1000);
      await pushAccountUpdate(system, account, await accountJwt(broker.authority, revoked));
      updates++;
    }
  })();
  return {
    stop: async () => {
      updating = false;
      await pushing;
      return updates;
    },
  };
}

/** Runs `operation`, keeping what it failed with (a round carries on without it). */
function recorder(failures: string[]) {
  let operations = 0;
  return {
    step: async <T>(what: string, operation: () => Promise<T>): Promise<T | undefined> => {
      operations++;
      try {
        return await operation();
      } catch (error) {
        failures.push(`${what}: ${errorText(error)}`);
        return undefined;
      }
    },
    count: () => operations,
  };
}

before(async () => {
  broker = await startOperatorServer();
});
after(async () => {
  for (const nc of open) if (!nc.isClosed()) await nc.close();
  await broker.stop();
});

test("nats account updates — the lease is opened, taken, read, renewed and given back throughout them, no operation failing", async () => {
  const control = await connectAs({ name: "control", role: "control" });
  const updates = await updatingAccount();
  // 400 rounds of five operations: with one failing in a hundred, a pass by chance is all but impossible.
  const rounds = 400;
  const failures: string[] = [];
  const { step, count } = recorder(failures);
  try {
    for (let round = 1; round <= rounds; round++) {
      const lease = await step(`round ${round}, open`, () =>
        NatsKvLease.open(control, 15_000, undefined, 5_000),
      );
      if (lease === undefined) continue;
      const holder = {
        id: `round-${round}`,
        host: "test",
        pid: process.pid,
        taken_at: new Date().toISOString(),
      };
      const taken = await step(`round ${round}, take`, () => lease.take(holder));
      if (taken !== undefined) {
        const read = await step(`round ${round}, read`, () => lease.read());
        if (read !== undefined)
          assert.equal(read.holder.id, holder.id, `round ${round}: the holder read back`);
        const renewed = await step(`round ${round}, renew`, () => lease.renew(holder, taken));
        if (renewed !== undefined)
          assert.ok(renewed > taken, `round ${round}: the renewal moves the revision`);
        const given = await step(`round ${round}, release`, () => lease.release(renewed ?? taken));
        if (given !== undefined) assert.equal(given, true, `round ${round}: the lease is given back`);
      }
      await lease.close();
    }
  } finally {
    const pushed = await updates.stop();
    // The updates ran beside the operations throughout: many of them, not a few at the start.
    assert.ok(pushed >= rounds / 4, `only ${pushed} account updates were pushed during ${rounds} rounds`);
  }
  assert.deepEqual(failures, [], `${failures.length} of ${count()} operations failed`);
  assert.equal(count(), rounds * 5);
});

test("nats account updates — the control plane's streams are asserted, its backlog answered and its consumers set up throughout them", async () => {
  const node = await connectAs({ name: "acct-1", role: "node", node: "acct-1" });
  const buses: NatsControlBus[] = [];
  const updates = await updatingAccount();
  const failures: string[] = [];
  const { step, count } = recorder(failures);
  try {
    const first = new NatsControlBus(await connectAs({ name: "control", role: "control" }), quiet);
    buses.push(first);
    await step("assert", () => first.assert());
    // The hearing's question, asked about every second by a control plane: here one after another.
    for (let question = 1; question <= 400; question++) {
      const waiting = await step(`backlog ${question}`, () => first.backlog());
      if (waiting !== undefined) assert.ok(waiting >= 0);
    }
    // Control planes starting one after another, as a standby takes over: each asserts the streams, sets up its
    // consumers (removing the one before), and takes a report published after it began.
    for (let start = 1; start <= 25; start++) {
      const bus = new NatsControlBus(await connectAs({ name: "control", role: "control" }), quiet);
      buses.push(bus);
      await step(`start ${start}, assert`, () => bus.assert());
      const taken: string[] = [];
      let ended: string | undefined;
      bus
        .consumeControl((batch) => {
          taken.push(...batch.map((delivery) => Buffer.from(delivery.body).toString()));
          return Promise.resolve(batch.map((): DeliveryOutcome => "done"));
        })
        .catch((error: unknown) => (ended = errorText(error)));
      const body = `report ${start}`;
      await eventually(`control plane ${start} taking "${body}"`, async () => {
        if (ended !== undefined) return "ended";
        node.publish(controlSubject("report", "acct-1"), body);
        await node.flush();
        return taken.includes(body) ? "taken" : undefined;
      });
      if (ended !== undefined) failures.push(`start ${start}: consuming ended: ${ended}`);
    }
  } finally {
    await updates.stop();
    for (const bus of buses) await bus.close();
  }
  assert.deepEqual(failures, [], `${failures.length} of ${count()} questions and starts failed`);
});
