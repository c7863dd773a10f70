import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { exitCodes, UsageError } from "../../src/errors.js";
import { execWord, hostUnit, meshUnit, unitWord } from "../../src/program/service-unit.js";

const executable = { node: "/usr/bin/node", script: "/opt/mesh/bin/mesh-host.js" };

/** The values of one setting in a unit, in order. */
function values(unit: string, key: string): string[] {
  return unit
    .split("\n")
    .filter((line) => line.startsWith(`${key}=`))
    .map((line) => line.slice(key.length + 1));
}

describe("service units", () => {
  test("units — ExecStart has absolute paths; mesh-host runs from its state dir and root", () => {
    const unit = hostUnit({ ...executable, stateDir: "/var/lib/mesh-host", root: "/srv/files/" });
    assert.deepEqual(values(unit, "ExecStart"), [
      "/usr/bin/node /opt/mesh/bin/mesh-host.js run --state /var/lib/mesh-host --root /srv/files",
    ]);
    assert.throws(() => hostUnit({ ...executable, stateDir: "state", root: "/" }), UsageError);
    assert.throws(() => hostUnit({ ...executable, node: "node", stateDir: "/s", root: "/" }), UsageError);
  });

  test("units — mesh runs mesh up, or mesh serve --broker URL, with its data dir (and store when given)", () => {
    const up = meshUnit({ ...executable, script: "/opt/mesh/bin/mesh.js", dataDir: "/var/lib/mesh" });
    assert.deepEqual(values(up, "ExecStart"), [
      "/usr/bin/node /opt/mesh/bin/mesh.js --data /var/lib/mesh up",
    ]);
    const serve = meshUnit({
      ...executable,
      script: "/opt/mesh/bin/mesh.js",
      dataDir: "/var/lib/mesh",
      broker: "nats://10.0.0.1:4222",
      store: "postgres://db/mesh",
    });
    assert.deepEqual(values(serve, "ExecStart"), [
      "/usr/bin/node /opt/mesh/bin/mesh.js --data /var/lib/mesh --store postgres://db/mesh serve --broker nats://10.0.0.1:4222",
    ]);
    // mesh up stops its children itself, the control plane before the broker: the stop signal is its alone.
    assert.deepEqual(values(up, "KillMode"), ["mixed"]);
    assert.deepEqual(values(serve, "KillMode"), []);
  });

  test("units — both restart on failure, but not on bad usage or a refused identity", () => {
    for (const unit of [
      hostUnit({ ...executable, stateDir: "/var/lib/mesh-host", root: "/" }),
      meshUnit({ ...executable, dataDir: "/var/lib/mesh" }),
    ]) {
      assert.deepEqual(values(unit, "Restart"), ["on-failure"]);
      assert.deepEqual(values(unit, "RestartPreventExitStatus"), [
        `${exitCodes.usage} ${exitCodes.identityRefused}`,
      ]);
      assert.deepEqual(values(unit, "NoNewPrivileges"), ["yes"]);
    }
  });

  test("units — mesh-host with root / leaves the file system writable; with a root of its own, only that root", () => {
    const whole = hostUnit({ ...executable, stateDir: "/var/lib/mesh-host", root: "/" });
    assert.deepEqual(values(whole, "ProtectSystem"), []);
    assert.deepEqual(values(whole, "ProtectHome"), []);
    assert.deepEqual(values(whole, "PrivateTmp"), []);
    assert.deepEqual(values(whole, "StateDirectory"), ["mesh-host"]);
    assert.deepEqual(values(whole, "StateDirectoryMode"), ["0700"]);

    const confined = hostUnit({ ...executable, stateDir: "/var/lib/mesh-host", root: "/srv/files" });
    assert.deepEqual(values(confined, "ProtectSystem"), ["strict"]);
    assert.deepEqual(values(confined, "ReadWritePaths"), ["/srv/files"]);
    assert.deepEqual(values(confined, "ProtectHome"), ["yes"]);
    assert.deepEqual(values(confined, "PrivateTmp"), ["yes"]);

    // A path under home makes home read-only rather than hidden; one under /tmp keeps the machine's own /tmp.
    const elsewhere = hostUnit({ ...executable, stateDir: "/home/ops/state", root: "/tmp/files" });
    assert.deepEqual(values(elsewhere, "ReadWritePaths"), ["/tmp/files", "/home/ops/state"]);
    assert.deepEqual(values(elsewhere, "StateDirectory"), []);
    assert.deepEqual(values(elsewhere, "ProtectHome"), ["read-only"]);
    assert.deepEqual(values(elsewhere, "PrivateTmp"), []);
  });

  test("units — mesh writes only its data dir: its StateDirectory under /var/lib, else that dir", () => {
    const own = meshUnit({ ...executable, dataDir: "/var/lib/mesh" });
    assert.deepEqual(values(own, "ProtectSystem"), ["strict"]);
    assert.deepEqual(values(own, "StateDirectory"), ["mesh"]);
    assert.deepEqual(values(own, "ReadWritePaths"), []);
    const other = meshUnit({ ...executable, dataDir: "/srv/mesh" });
    assert.deepEqual(values(other, "StateDirectory"), []);
    assert.deepEqual(values(other, "ReadWritePaths"), ["/srv/mesh"]);
  });

  test("units — words: % and $ doubled, spaces quoted, control characters, quotes and backslashes refused", () => {
    assert.equal(unitWord("/srv/a%b"), "/srv/a%%b");
    assert.equal(unitWord("/srv/my files"), '"/srv/my files"');
    assert.equal(execWord("amqp://u:p$x@h/v%2F"), "amqp://u:p$$x@h/v%%2F");
    for (const bad of ["/srv/a\nExecStartPre=/bin/evil", '/srv/"x"', "/srv/a\\b", ""]) {
      assert.throws(() => unitWord(bad), UsageError, JSON.stringify(bad));
    }
  });
});
