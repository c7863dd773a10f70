/**
 * Several controllers on one broker and one store, exactly one acting: a killed holder is replaced within the
 * lease's life plus one renewal; a frozen holder that wakes up after losing the lease stops instead of acting, and
 * no node ever applies a declaration of the old epoch after one of the new. Run on a SQLite store and on a
 * PostgreSQL store shared by every controller. Short lease timings (300 ms renewals, 1.5 s life, 300 ms margin)
 * stand in for 5 s / 15 s / 3 s.
 */
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { mesh, meshHost } from "../support/cli.js";
import type { OperatorBroker } from "../support/operator-broker.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { storeBackends } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";

const leaseEnv = { MESH_LEASE_RENEW_EVERY: "300ms", MESH_LEASE_TTL: "1500ms", MESH_LEASE_MARGIN: "300ms" };

for (const backend of storeBackends) {
  describe(`several controllers, one acts (${backend.name} store)`, () => {
    const dir = tempDir("mesh-lease-");
    const data = join(dir.path, "data");
    let server: OperatorBroker;
    let store: { url: string; cleanup(): Promise<void> };
    const controllers: Running[] = [];
    let agent: Running | undefined;
    const cli = (args: string[], env: NodeJS.ProcessEnv = leaseEnv) =>
      mesh(["--data", data, "--store", store.url, ...args], env);
    const serve = (env: NodeJS.ProcessEnv = leaseEnv) => {
      const controller = startBin(
        "mesh",
        ["--data", data, "--store", store.url, "serve", "--broker", server.url],
        env,
      );
      controllers.push(controller);
      return controller;
    };
    const serving = (controller: Running) => /control\.serving/.test(controller.stderr());
    const standingBy = (controller: Running) => /lease\.standby/.test(controller.stderr());
    const alive = (controller: Running) =>
      controller.child.exitCode === null && controller.child.signalCode === null;
    const leaseShow = async () =>
      JSON.parse((await cli(["lease", "show", "--json"])).stdout) as {
        holder: { pid: number } | null;
        epoch: number | null;
        floor: number;
      };
    const declare = async (content: string) => {
      const file = join(dir.path, `${content}.yaml`);
      writeFileSync(file, `files:\n  - path: /etc/motd\n    content: ${content}\n`);
      const declared = await cli(["declare", "edge-1", "-f", file, "--json"]);
      assert.equal(declared.code, 0, declared.stderr);
      return JSON.parse(declared.stdout) as { sequence: number; epoch: number };
    };
    const root = join(dir.path, "root");
    const held = () => {
      try {
        return readFileSync(join(root, "etc", "motd"), "utf8");
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
        throw error;
      }
    };
    /** The epochs of the declarations the node applied, in the order it applied them. */
    const appliedEpochs = () =>
      (agent?.stderr() ?? "")
        .split("\n")
        .filter((line) => line.includes('"agent.applied"'))
        .map((line) => (JSON.parse(line) as { epoch: number }).epoch);

    before(async () => {
      store = await backend.fresh();
      server = await startOperatorBroker(data, dir.path);
    });
    after(async () => {
      await agent?.stop("SIGTERM");
      for (const controller of controllers) await controller.stop("SIGKILL");
      await server.stop();
      await store.cleanup();
      dir.remove();
    });

    test("lease — one serves, the other waits; kill -9 of the holder hands over within the lease's life and one renewal", async () => {
      const a = serve();
      await eventually("a to serve", () => (serving(a) ? true : undefined));
      const b = serve();
      await eventually("b to stand by", () => (standingBy(b) ? true : undefined));
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

    test("lease — a holder frozen past its lease wakes to find it gone, acts on nothing, and exits non-zero; the node never goes back an epoch", async () => {
      const holder = controllers.find((c) => alive(c) && serving(c));
      assert.ok(holder !== undefined);
      const token = JSON.parse((await cli(["token", "issue", "edge-1", "--json"])).stdout) as {
        token: string;
      };
      const state = join(dir.path, "edge-1");
      const joined = await meshHost(["join", token.token, "--state", state]);
      assert.equal(joined.code, 0, joined.stderr);
      mkdirSync(root, { recursive: true });
      agent = startBin("mesh-host", ["run", "--state", state, "--root", root, "--alive-every", "300ms"]);
      const first = await declare("first");
      await eventually("the node to apply the first", () => (held() === "first" ? true : undefined));

      const standby = serve();
      await eventually("a standby", () => (standingBy(standby) ? true : undefined));
      holder.child.kill("SIGSTOP");
      await eventually("the standby to take over", () => (serving(standby) ? true : undefined));
      const second = await declare("second");
      assert.ok(second.epoch > first.epoch, `${second.epoch} > ${first.epoch}`);
      await eventually("the node to apply the second", () => (held() === "second" ? true : undefined));

      holder.child.kill("SIGCONT");
      const code = await Promise.race([
        holder.exited,
        new Promise((resolve) => setTimeout(() => resolve("still running"), 5000)),
      ]);
      assert.equal(code, 1, holder.stderr());
      assert.match(holder.stderr(), /lease lost|gate closed/);
      assert.equal((await leaseShow()).holder?.pid, standby.child.pid);
      // The node has seen the old holder wake and go; what it applied never went back an epoch.
      await new Promise((resolve) => setTimeout(resolve, 1000));
      assert.equal(held(), "second");
      const epochs = appliedEpochs();
      assert.deepEqual(epochs, [first.epoch, second.epoch]);
    });

    test("lease — a holder that stops cleanly gives the lease back, and a watching standby takes it at once", async () => {
      // Renewals every 10 s: a standby that only looked again each renewal period would take seconds.
      const slow = { MESH_LEASE_RENEW_EVERY: "10s", MESH_LEASE_TTL: "30s", MESH_LEASE_MARGIN: "3s" };
      for (const controller of controllers) await controller.stop("SIGINT");
      const a = serve(slow);
      await eventually("a to serve", () => (serving(a) ? true : undefined));
      const b = serve(slow);
      await eventually("b to stand by", () => (standingBy(b) ? true : undefined));
      await new Promise((resolve) => setTimeout(resolve, 500));
      const stoppedAt = Date.now();
      assert.equal(await a.stop("SIGINT"), 0, a.stderr());
      await eventually("b to take over", () => (serving(b) ? true : undefined));
      const handover = Date.now() - stoppedAt;
      assert.ok(handover < 3000, `handed over ${handover} ms after a clean stop (renewals every 10 s)`);
    });
  });
}
