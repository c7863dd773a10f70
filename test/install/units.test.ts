/**
 * The systemd units of `mesh install` and `mesh-host install`, checked by systemd itself: each shape of unit is
 * written with ExecStart on real files (this Node, the project's bin/ scripts) and read by `systemd-analyze verify`,
 * which must accept it and say nothing about it. Nothing here boots systemd, so the commands say why they started
 * nothing; a person on a systemd machine gets the unit enabled and started.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { hostUnit, meshUnit } from "../../src/program/service-unit.js";
import { mesh, meshHost } from "../support/cli.js";
import { verifyUnit } from "../support/systemd.js";
import { tempDir } from "../support/tmp.js";

const repository = new URL("../../", import.meta.url).pathname;
const meshScript = join(repository, "bin", "mesh.js");
const hostScript = join(repository, "bin", "mesh-host.js");

function verified(dir: string, name: string, text: string): void {
  const unit = join(dir, name);
  writeFileSync(unit, text);
  const result = verifyUnit(unit);
  assert.deepEqual(
    { status: result.status, aboutUnit: result.aboutUnit },
    { status: 0, aboutUnit: [] },
    result.stderr,
  );
}

describe("systemd units", () => {
  test("units — every shape of mesh.service and mesh-host.service passes systemd-analyze verify", (t) => {
    const dir = tempDir("mesh-units-");
    t.after(() => dir.remove());
    const node = process.execPath;
    const shapes: Array<[string, string]> = [
      ["mesh.service", meshUnit({ node, script: meshScript, dataDir: "/var/lib/mesh" })],
      [
        "mesh.service",
        meshUnit({
          node,
          script: meshScript,
          dataDir: "/srv/mesh data",
          broker: "amqp://admin:p%40ss@rabbit.example:5672/mesh",
          store: "postgres://mesh@db.example/mesh?schema=fleet",
        }),
      ],
      [
        "mesh-host.service",
        hostUnit({ node, script: hostScript, stateDir: "/var/lib/mesh-host", root: "/" }),
      ],
      [
        "mesh-host.service",
        hostUnit({ node, script: hostScript, stateDir: "/var/lib/mesh-host", root: "/srv/files" }),
      ],
      [
        "mesh-host.service",
        hostUnit({ node, script: hostScript, stateDir: "/home/ops/.mesh-host", root: "/tmp/files" }),
      ],
    ];
    for (const [name, text] of shapes) verified(dir.path, name, text);
  });

  test("units — mesh install writes mesh.service for mesh up, which systemd accepts, and says why it started nothing", async (t) => {
    const dir = tempDir("mesh-install-");
    t.after(() => dir.remove());
    const unitDir = join(dir.path, "units");
    const data = join(dir.path, "data");
    const run = await mesh(["--data", data, "install", "--unit-dir", unitDir]);
    assert.equal(run.code, 0, run.stderr);
    const unit = join(unitDir, "mesh.service");
    assert.equal(
      run.stdout,
      `wrote ${unit}\n` +
        "not started: systemd is not running here (PID 1 is another init, or this is a container). Where systemd runs, start it with:\n" +
        "  systemctl daemon-reload\n" +
        `  systemctl enable --now ${unit}\n`,
    );
    const text = readFileSync(unit, "utf8");
    assert.equal(text, meshUnit({ node: process.execPath, script: meshScript, dataDir: data }));
    assert.match(text, new RegExp(`^ExecStart=${process.execPath} ${meshScript} --data ${data} up$`, "m"));
    verified(unitDir, "mesh.service", text);
  });

  test("units — --dry-run prints the unit and writes nothing; --broker makes it mesh serve", async (t) => {
    const dir = tempDir("mesh-install-dry-");
    t.after(() => dir.remove());
    const unitDir = join(dir.path, "units");
    const run = await mesh([
      "--data",
      join(dir.path, "data"),
      "install",
      "--broker",
      "nats://127.0.0.1:4222",
      "--unit-dir",
      unitDir,
      "--dry-run",
    ]);
    assert.equal(run.code, 0, run.stderr);
    assert.equal(
      run.stdout,
      meshUnit({
        node: process.execPath,
        script: meshScript,
        dataDir: join(dir.path, "data"),
        broker: "nats://127.0.0.1:4222",
      }),
    );
    assert.match(run.stdout, / serve --broker nats:\/\/127\.0\.0\.1:4222$/m);
    assert.equal(existsSync(unitDir), false, "nothing is written");
  });

  test("units — install refuses before writing: a bad broker URL is bad usage, a machine that never joined has nothing to run", async (t) => {
    const dir = tempDir("mesh-install-refused-");
    t.after(() => dir.remove());
    const unitDir = join(dir.path, "units");
    const badBroker = await mesh([
      "--data",
      dir.path,
      "install",
      "--broker",
      "http://x",
      "--unit-dir",
      unitDir,
    ]);
    assert.equal(badBroker.code, 2, badBroker.stderr);
    const state = join(dir.path, "state");
    const notJoined = await meshHost(["install", "--state", state, "--unit-dir", unitDir]);
    assert.deepEqual(
      { code: notJoined.code, stdout: notJoined.stdout, stderr: notJoined.stderr },
      {
        code: 1,
        stdout: "",
        stderr: `mesh-host: this machine has not joined a mesh (no identity in ${state}): run mesh-host join <token> --state ${state} first\n`,
      },
    );
    assert.equal(existsSync(unitDir), false, "nothing is written");
  });
});
