/**
 * A lease that nobody holds and nobody can write (its bucket sealed): the controller keeps the mesh in touch without
 * an epoch, and says so urgently in its log, in `mesh lease show` and in its metrics. Nothing can be declared.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { freePort, openNatsIdentities } from "../../src/bus/index.js";
import { leaseBucket } from "../../src/bus/nats/lease-kv.js";
import { mesh, meshHost } from "../support/cli.js";
import type { OperatorBroker } from "../support/operator-broker.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

const leaseEnv = { MESH_LEASE_RENEW_EVERY: "300ms", MESH_LEASE_TTL: "1500ms", MESH_LEASE_MARGIN: "300ms" };

describe("a lease that cannot be written", () => {
  const dir = tempDir("mesh-no-epoch-");
  const data = join(dir.path, "data");
  let server: OperatorBroker;
  let controller: Running | undefined;

  before(async () => {
    server = await startOperatorBroker(data, dir.path);
    // Seal the lease bucket as the control plane would find it: present, readable, refusing every write.
    const identities = openNatsIdentities(data, server.url);
    const control = await identities.controlIdentity();
    const nc = await connect({
      servers: server.url,
      authenticator: jwtAuthenticator(control.jwt, new TextEncoder().encode(control.seed)),
    });
    await new Kvm(nc).create(leaseBucket, { ttl: 1500, history: 1, allow_direct: false });
    const jsm = await jetstreamManager(nc);
    const stream = `KV_${leaseBucket}`;
    const info = await jsm.streams.info(stream);
    const sealed = { ...info.config, sealed: true };
    await jsm.streams.update(stream, sealed);
    await nc.close();
    await identities.close();
  });
  after(async () => {
    await controller?.stop("SIGKILL");
    await server.stop();
    dir.remove();
  });

  test("lease — without any epoch the controller serves, and says so urgently in its log, lease show and metrics", async () => {
    const port = await freePort();
    controller = startBin(
      "mesh",
      ["--data", data, "serve", "--broker", server.url, "--metrics", `127.0.0.1:${port}`],
      leaseEnv,
    );
    const running = controller;
    await eventually("the controller to serve", () =>
      /control\.serving/.test(running.stderr()) ? true : undefined,
    );
    const urgent = running
      .stderr()
      .split("\n")
      .filter((line) => line.includes('"lease.no_epoch"'))
      .map((line) => JSON.parse(line) as { level: string; urgent: boolean; reason: string });
    assert.equal(urgent.length, 1, "said once, not once per retry");
    assert.equal(urgent[0]?.level, "error");
    assert.equal(urgent[0]?.urgent, true);
    assert.match(urgent[0]?.reason ?? "", /sealed/);

    const shown = JSON.parse((await mesh(["--data", data, "lease", "show", "--json"], leaseEnv)).stdout) as {
      holder: unknown;
      epoch: unknown;
      no_epoch: { pid: number; reason: string }[];
    };
    assert.equal(shown.holder, null);
    assert.equal(shown.epoch, null);
    assert.equal(shown.no_epoch.length, 1);
    assert.equal(shown.no_epoch[0]?.pid, running.child.pid);
    const text = await mesh(["--data", data, "lease", "show"], leaseEnv);
    assert.match(text.stdout, /^URGENT: controller .* acts WITHOUT an epoch/m);

    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    assert.match(metrics, /^mesh_lease_no_epoch 1$/m);
    assert.match(metrics, /^mesh_lease_held 0$/m);
    assert.match(metrics, /^# TYPE mesh_lease_no_epoch gauge$/m);

    // The mesh stays in touch: a machine can still join…
    const token = JSON.parse((await mesh(["--data", data, "token", "issue", "edge-1", "--json"])).stdout) as {
      token: string;
    };
    const joined = await meshHost(["join", token.token, "--state", join(dir.path, "edge-1")]);
    assert.equal(joined.code, 0, joined.stderr);
    // …but nothing can be signed without an epoch.
    const file = join(dir.path, "decl.yaml");
    writeFileSync(file, "files:\n  - path: /etc/x\n    content: x\n");
    const declared = await mesh(["--data", data, "declare", "edge-1", "-f", file], leaseEnv);
    assert.equal(declared.code, 1);
    assert.match(declared.stderr, /nobody holds the lease and this command could not take one/);
    assert.match(declared.stderr, /nothing was declared/);

    // Stopped cleanly, the controller takes its condition with it.
    assert.equal(await running.stop(), 0, running.stderr());
    controller = undefined;
    const after = JSON.parse((await mesh(["--data", data, "lease", "show", "--json"], leaseEnv)).stdout) as {
      no_epoch: unknown[];
    };
    assert.deepEqual(after.no_epoch, []);
  });
});
