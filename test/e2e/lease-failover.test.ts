/**
 * Several controllers on one broker and one store, exactly one acting: a killed holder is replaced by the standby,
 * under a higher epoch; a frozen holder that wakes up after losing the lease stops instead of acting, and no node
 * ever applies a declaration of the old epoch after one of the new; a holder that stops cleanly gives the lease back
 * to a watching standby. Run on a SQLite store and on a PostgreSQL store shared by every controller. Short lease
 * timings (300 ms renewals, 1.5 s life, 300 ms margin) stand in for 5 s / 15 s / 3 s. Each test has its own broker,
 * store and controllers, so each passes run alone. These tests assert order and outcome with generous deadlines;
 * how fast a handover is is measured by the bench (`npm run bench -- --only failover`).
 */
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { describe, test } from "node:test";
import { mesh, meshHost } from "../support/cli.js";
import type { OperatorBroker } from "../support/operator-broker.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import type { StoreBackend } from "../support/stores.js";
import { storeBackends } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";

const leaseEnv = { MESH_LEASE_RENEW_EVERY: "300ms", MESH_LEASE_TTL: "1500ms", MESH_LEASE_MARGIN: "300ms" };

/** Resolves with the process's exit code, or "still running" after a generous deadline. */
async function exitWithin(process: Running, ms = 60_000): Promise<number | null | "still running"> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      process.exited,
      new Promise<"still running">((resolve) => (timer = setTimeout(() => resolve("still running"), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * One test's own mesh: an operator's nats-server, a fresh store on `backend`, and the controllers and agent the test
 * starts, all stopped when the test ends.
 */
async function openCluster(t: TestContext, backend: StoreBackend) {
  const dir = tempDir("mesh-lease-");
  const data = join(dir.path, "data");
  const controllers: Running[] = [];
  let agent: Running | undefined;
  const made: { server?: OperatorBroker; store?: { url: string; cleanup(): Promise<void> } } = {};
  t.after(async () => {
    await agent?.stop("SIGTERM");
    for (const controller of controllers) {
      // A controller the test froze would not hear SIGKILL's parent wait otherwise.
      if (controller.child.exitCode === null) controller.child.kill("SIGCONT");
      await controller.stop("SIGKILL");
    }
    await made.server?.stop();
    await made.store?.cleanup();
    dir.remove();
  });
  made.store = await backend.fresh();
  const storeUrl = made.store.url;
  made.server = await startOperatorBroker(data, dir.path);
  const brokerUrl = made.server.url;
  const cli = (args: string[], env: NodeJS.ProcessEnv = leaseEnv) =>
    mesh(["--data", data, "--store", storeUrl, ...args], env);
  const root = join(dir.path, "root");
  return {
    dir: dir.path,
    root,
    cli,
    serve(env: NodeJS.ProcessEnv = leaseEnv): Running {
      const controller = startBin(
        "mesh",
        ["--data", data, "--store", storeUrl, "serve", "--broker", brokerUrl],
        env,
      );
      controllers.push(controller);
      return controller;
    },
    async leaseShow(env: NodeJS.ProcessEnv = leaseEnv) {
      const run = await cli(["lease", "show", "--json"], env);
      assert.equal(run.code, 0, run.stderr);
      return JSON.parse(run.stdout) as {
        holder: { pid: number } | null;
        epoch: number | null;
        floor: number;
      };
    },
    async declare(content: string) {
      const file = join(dir.path, `${content}.yaml`);
      writeFileSync(file, `files:\n  - path: /etc/motd\n    content: ${content}\n`);
      const declared = await cli(["declare", "edge-1", "-f", file, "--json"]);
      assert.equal(declared.code, 0, declared.stderr);
      return JSON.parse(declared.stdout) as { sequence: number; epoch: number };
    },
    held() {
      try {
        return readFileSync(join(root, "etc", "motd"), "utf8");
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
        throw error;
      }
    },
    startAgent(state: string): Running {
      agent = startBin("mesh-host", ["run", "--state", state, "--root", root, "--alive-every", "300ms"]);
      return agent;
    },
  };
}

const serving = (controller: Running) => /control\.serving/.test(controller.stderr());
const standingBy = (controller: Running) => /lease\.standby/.test(controller.stderr());
/** The epochs of the declarations the node applied, in the order it applied them. */
const appliedEpochs = (agent: Running) =>
  agent
    .stderr()
    .split("\n")
    .filter((line) => line.includes('"agent.applied"'))
    .map((line) => (JSON.parse(line) as { epoch: number }).epoch);

for (const backend of storeBackends) {
  describe(`several controllers, one acts (${backend.name} store)`, () => {
    test("lease — one serves, the other waits; kill -9 of the holder hands over to the standby under a higher epoch", async (t) => {
      const cluster = await openCluster(t, backend);
      const a = cluster.serve();
      await eventually("a to serve", () => (serving(a) ? true : undefined), 60_000);
      const b = cluster.serve();
      await eventually("b to stand by", () => (standingBy(b) ? true : undefined), 60_000);
      await new Promise((resolve) => setTimeout(resolve, 1000));
      assert.equal(serving(b), false, "a standby consumes nothing");
      const before = await cluster.leaseShow();
      assert.equal(before.holder?.pid, a.child.pid);

      const killedAt = Date.now();
      a.child.kill("SIGKILL");
      assert.equal(await a.exited, null, "a was killed");
      // Order, not speed: b serves only after a is gone, and then under a higher epoch. How soon (within the
      // lease's life and one renewal) is the bench's to measure.
      await eventually("b to take over", () => (serving(b) ? true : undefined), 60_000);
      t.diagnostic(`handed over ${Date.now() - killedAt} ms after kill -9 (bench: failover)`);
      const afterKill = await cluster.leaseShow();
      assert.equal(afterKill.holder?.pid, b.child.pid);
      assert.ok((afterKill.epoch ?? 0) > (before.epoch ?? 0), "the new holder acts under a higher epoch");
      assert.ok(afterKill.floor >= (afterKill.epoch ?? 0));
    });

    test("lease — a holder frozen past its lease wakes to find it gone, acts on nothing, and exits non-zero; the node never goes back an epoch", async (t) => {
      const cluster = await openCluster(t, backend);
      const holder = cluster.serve();
      await eventually("the holder to serve", () => (serving(holder) ? true : undefined), 60_000);
      const token = JSON.parse((await cluster.cli(["token", "issue", "edge-1", "--json"])).stdout) as {
        token: string;
      };
      const state = join(cluster.dir, "edge-1");
      const joined = await meshHost(["join", token.token, "--state", state]);
      assert.equal(joined.code, 0, joined.stderr);
      mkdirSync(cluster.root, { recursive: true });
      const agent = cluster.startAgent(state);
      const first = await cluster.declare("first");
      await eventually("the node to apply the first", () => (cluster.held() === "first" ? true : undefined));

      const standby = cluster.serve();
      await eventually("a standby", () => (standingBy(standby) ? true : undefined), 60_000);
      holder.child.kill("SIGSTOP");
      await eventually("the standby to take over", () => (serving(standby) ? true : undefined), 60_000);
      const second = await cluster.declare("second");
      assert.ok(second.epoch > first.epoch, `${second.epoch} > ${first.epoch}`);
      await eventually("the node to apply the second", () =>
        cluster.held() === "second" ? true : undefined,
      );

      holder.child.kill("SIGCONT");
      assert.equal(await exitWithin(holder), 1, holder.stderr());
      assert.match(holder.stderr(), /lease lost|gate closed/);
      assert.equal((await cluster.leaseShow()).holder?.pid, standby.child.pid);
      // The node has seen the old holder wake and go; what it applied never went back an epoch.
      await new Promise((resolve) => setTimeout(resolve, 1000));
      assert.equal(cluster.held(), "second");
      assert.deepEqual(appliedEpochs(agent), [first.epoch, second.epoch]);
    });

    test("lease — a holder that stops cleanly gives the lease back, and a watching standby takes it at once, not at its next look", async (t) => {
      const cluster = await openCluster(t, backend);
      // Renewals every 10 minutes: a standby that only looked again each renewal period would not take the lease
      // within the test's deadline; one that watches is woken by the give-back.
      const slow = { MESH_LEASE_RENEW_EVERY: "10m", MESH_LEASE_TTL: "30m", MESH_LEASE_MARGIN: "3m" };
      const a = cluster.serve(slow);
      await eventually("a to serve", () => (serving(a) ? true : undefined), 60_000);
      const b = cluster.serve(slow);
      await eventually("b to stand by", () => (standingBy(b) ? true : undefined), 60_000);
      await new Promise((resolve) => setTimeout(resolve, 500));
      assert.equal(serving(b), false, "a standby consumes nothing");
      const stoppedAt = Date.now();
      assert.equal(await a.stop("SIGINT"), 0, a.stderr());
      // Given back, in the holder's own words (the entry would otherwise live 30 minutes).
      await eventually("a to say it gave the lease back", () =>
        /"event":"lease\.released"[^\n]*"given_back":true/.test(a.stderr()) ? true : undefined,
      );
      await eventually("b to take over", () => (serving(b) ? true : undefined), 120_000);
      t.diagnostic(`handed over ${Date.now() - stoppedAt} ms after a clean stop (renewals every 10 min)`);
      assert.equal((await cluster.leaseShow(slow)).holder?.pid, b.child.pid);
    });
  });
}
