/**
 * A killed holder's lease is taken over when it expires: the standby knows when the holding it watches ends (the
 * broker's time of the holder's last write + the life the holder wrote into it) and tries the lease then, instead
 * of at its next look a renewal period later. Short timings (1 s renewals, 2.5 s life, 500 ms margin) stand in for
 * 5 s / 15 s / 3 s; a life that is not a whole number of renewal periods keeps the standby's periodic looks away
 * from the expiry itself. The test asserts order, on the broker's own clock, and what the standby says it woke for;
 * how soon after the expiry it acts is the bench's to measure (`npm run bench -- --only failover`).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { openNatsIdentities } from "../../src/bus/index.js";
import { leaseBucket } from "../../src/bus/nats/lease-kv.js";
import { parseHolderRecord } from "../../src/link/index.js";
import type { OperatorBroker } from "../support/operator-broker.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { storeBackends } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";

const leaseEnv = { MESH_LEASE_RENEW_EVERY: "1s", MESH_LEASE_TTL: "2500ms", MESH_LEASE_MARGIN: "500ms" };

/** One write of the lease's key, as the broker kept it. */
interface Written {
  revision: number;
  created: number;
  operation: string;
  pid: number | undefined;
  ttlMs: number | undefined;
}

const serving = (controller: Running) => /control\.serving/.test(controller.stderr());
const standingBy = (controller: Running) => /lease\.standby/.test(controller.stderr());

test("lease — kill -9 of the holder: the standby takes the lease once it expired by the broker's clock, never before, and woken by that expiry rather than a later look", async (t) => {
  const dir = tempDir("mesh-lease-expiry-");
  const data = join(dir.path, "data");
  const store = await storeBackends[0]!.fresh();
  const controllers: Running[] = [];
  const made: { server?: OperatorBroker; stopWatching?: () => Promise<void> } = {};
  t.after(async () => {
    for (const controller of controllers) await controller.stop("SIGKILL");
    await made.stopWatching?.();
    await made.server?.stop();
    await store.cleanup();
    dir.remove();
  });
  made.server = await startOperatorBroker(data, dir.path);
  const url = made.server.url;
  const serve = () => {
    const controller = startBin(
      "mesh",
      ["--data", data, "--store", store.url, "serve", "--broker", url],
      leaseEnv,
    );
    controllers.push(controller);
    return controller;
  };

  const a = serve();
  await eventually("a to serve", () => (serving(a) ? true : undefined));
  // Every write of the lease's key from here, with the broker's time of writing, seen as the control plane sees it.
  const identities = openNatsIdentities(data, url);
  const control = await identities.controlIdentity();
  await identities.close();
  const nc = await connect({
    servers: url,
    authenticator: jwtAuthenticator(control.jwt, new TextEncoder().encode(control.seed)),
  });
  const watcher = await (await new Kvm(nc).open(leaseBucket)).watch({ key: "holder" });
  made.stopWatching = async () => {
    watcher.stop();
    await nc.close();
  };
  const written: Written[] = [];
  void (async () => {
    for await (const entry of watcher) {
      const holder = entry.operation === "PUT" ? parseHolderRecord(entry.string(), leaseBucket) : undefined;
      written.push({
        revision: entry.revision,
        created: entry.created.getTime(),
        operation: entry.operation,
        pid: holder?.pid,
        ttlMs: holder?.ttl_ms,
      });
    }
  })();

  const b = serve();
  await eventually("b to stand by", () => (standingBy(b) ? true : undefined));
  // b has seen a renew at least once while it waited.
  const seenBefore = written.length;
  await eventually("a renewal by a", () => (written.length > seenBefore ? true : undefined));
  a.child.kill("SIGKILL");
  assert.equal(await a.exited, null, "a was killed");
  await eventually("b to take over", () => (serving(b) ? true : undefined));

  const byA = written.filter((entry) => entry.pid === a.child.pid);
  const last = byA.at(-1);
  assert.ok(last?.ttlMs !== undefined, "a wrote its life into the lease");
  const expiry = last.created + last.ttlMs;
  const take = written.find((entry) => entry.operation === "PUT" && entry.pid === b.child.pid);
  assert.ok(take !== undefined, "b's take was written");
  // The safety property, on the broker's clock: b's take was written only once a's last renewal had expired.
  assert.ok(take.created >= expiry, `b took the lease at ${take.created}, a's lease expired at ${expiry}`);
  assert.ok(take.revision > last.revision);

  // b tried the lease because the holding it waited on ended — the very one a last wrote — not at a periodic look.
  const line = b
    .stderr()
    .split("\n")
    .find((text) => text.includes('"event":"lease.taken_over"'));
  assert.ok(line !== undefined, b.stderr());
  const said = JSON.parse(line) as { woken_by: string; previous_expiry: string | null };
  assert.equal(said.woken_by, "expiry", line);
  assert.equal(said.previous_expiry, new Date(expiry).toISOString(), line);
  t.diagnostic(`b's take was written ${take.created - expiry} ms after a's lease expired (bench: failover)`);
});
