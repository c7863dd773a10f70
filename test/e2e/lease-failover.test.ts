/**
 * Several controllers on one broker and one store, exactly one acting: a killed holder is replaced within the
 * lease's life plus one renewal; a frozen holder that wakes up after losing the lease stops instead of acting.
 * Short lease timings (300 ms renewals, 1.5 s life, 300 ms margin) stand in for 5 s / 15 s / 3 s.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { mesh } from "../support/cli.js";
import type { OperatorBroker } from "../support/operator-broker.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

const leaseEnv = { MESH_LEASE_RENEW_EVERY: "300ms", MESH_LEASE_TTL: "1500ms", MESH_LEASE_MARGIN: "300ms" };

describe("several controllers, one acts", () => {
  const dir = tempDir("mesh-lease-");
  const data = join(dir.path, "data");
  let server: OperatorBroker;
  const controllers: Running[] = [];
  const serve = () => {
    const controller = startBin("mesh", ["--data", data, "serve", "--broker", server.url], leaseEnv);
    controllers.push(controller);
    return controller;
  };
  const serving = (controller: Running) => /control\.serving/.test(controller.stderr());
  const leaseShow = async () =>
    JSON.parse((await mesh(["--data", data, "lease", "show", "--json"], leaseEnv)).stdout) as {
      holder: { pid: number } | null;
      epoch: number | null;
      floor: number;
    };

  before(async () => {
    server = await startOperatorBroker(data, dir.path);
  });
  after(async () => {
    for (const controller of controllers) await controller.stop("SIGKILL");
    await server.stop();
    dir.remove();
  });

  test("lease — one serves, the other waits; kill -9 of the holder hands over within the lease's life and one renewal", async () => {
    const a = serve();
    await eventually("a to serve", () => (serving(a) ? true : undefined));
    const b = serve();
    await eventually("b to stand by", () => (/lease\.standby/.test(b.stderr()) ? true : undefined));
    await new Promise((resolve) => setTimeout(resolve, 1000));
    assert.equal(serving(b), false, "a standby consumes nothing");
    const before = await leaseShow();
    assert.equal(before.holder?.pid, a.child.pid);

    const killedAt = Date.now();
    a.child.kill("SIGKILL");
    await eventually("b to take over", () => (serving(b) ? true : undefined));
    const handover = Date.now() - killedAt;
    assert.ok(handover < 1500 + 300 + 1500, `handed over in ${handover} ms`);
    const afterKill = await leaseShow();
    assert.equal(afterKill.holder?.pid, b.child.pid);
    assert.ok((afterKill.epoch ?? 0) > (before.epoch ?? 0), "the new holder acts under a higher epoch");
    assert.ok(afterKill.floor >= (afterKill.epoch ?? 0));
  });

  test("lease — a holder frozen past its lease wakes to find it gone, acts on nothing, and exits non-zero", async () => {
    const holder = controllers.find(
      (c) => c.child.exitCode === null && c.child.signalCode === null && serving(c),
    );
    assert.ok(holder !== undefined);
    const standby = serve();
    await eventually("a standby", () => (/lease\.standby/.test(standby.stderr()) ? true : undefined));
    holder.child.kill("SIGSTOP");
    await eventually("the standby to take over", () => (serving(standby) ? true : undefined));
    holder.child.kill("SIGCONT");
    const code = await Promise.race([
      holder.exited,
      new Promise((resolve) => setTimeout(() => resolve("still running"), 5000)),
    ]);
    assert.equal(code, 1, holder.stderr());
    assert.match(holder.stderr(), /lease lost|gate closed/);
    assert.equal((await leaseShow()).holder?.pid, standby.child.pid);
  });
});
