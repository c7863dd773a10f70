/**
 * The package a person copies to a machine (`npm run package`), made once for this file from the current build and
 * extracted outside the repository: the control plane runs from it, a node runs `mesh-host` from a copy holding no
 * node_modules at all, and a node that reboots comes back with no person and no token. Each test has a fleet of
 * its own on the one package.
 */
import assert from "node:assert/strict";
import { copyFileSync, cpSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { after, before, describe, test } from "node:test";
import { runScript } from "../support/cli.js";
import type { Fleet } from "../support/fleets.js";
import { fleetForTest } from "../support/fleets.js";
import type { ExtractedPackage } from "../support/package.js";
import { packageAndExtract } from "../support/package.js";
import { eventually } from "../support/processes.js";
import { scratchDatabase } from "../support/postgres.js";
import { verifyUnit } from "../support/systemd.js";
import { tempDir } from "../support/tmp.js";

const repository = new URL("../../", import.meta.url).pathname;

/** `mesh node show --json`, as far as these tests read it. */
interface Shown {
  state: string;
  liveness: string;
  last_seen: string | null;
  keys: { signing: string | null };
  account: { outcome: string; sequence: number | null } | null;
}

async function shown(fleet: Fleet, node: string): Promise<Shown> {
  const run = await fleet.cli(["node", "show", node, "--json"]);
  assert.equal(run.code, 0, run.stderr);
  return JSON.parse(run.stdout) as Shown;
}

/** Joins `node` from the fleet's `mesh-host` with a token of its own; returns its state dir and root. */
async function joined(fleet: Fleet, node: string): Promise<{ state: string; root: string }> {
  const state = join(fleet.dir, node);
  const root = join(fleet.dir, `${node}-root`);
  const run = await fleet.host(["join", await fleet.issue(node), "--state", state, "--root", root]);
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stdout, `${node}\n`);
  return { state, root };
}

async function appliedFile(fleet: Fleet, node: string, root: string, content: string): Promise<void> {
  const { sequence } = await fleet.declareFiles(node, [{ path: "/etc/motd", content }]);
  await eventually(`${node} to report sequence ${sequence} applied`, async () => {
    const account = (await shown(fleet, node)).account;
    return account?.outcome === "applied" && account.sequence === sequence ? true : undefined;
  });
  assert.equal(readFileSync(join(root, "etc", "motd"), "utf8"), content);
}

describe("the package (npm run package)", () => {
  let made: ExtractedPackage;
  before(() => {
    made = packageAndExtract();
  });
  after(() => made?.remove());

  test("package — the tarball holds both executables, their bundles, and the runtime dependencies mesh loads outside its bundle", () => {
    for (const part of [
      "bin/mesh.js",
      "bin/mesh-host.js",
      "bin/run-bundle.js",
      "dist/bundle/mesh.cjs",
      "dist/bundle/mesh.cache",
      "dist/bundle/mesh-host.cjs",
      "dist/bundle/mesh-host.cache",
      "node_modules/better-sqlite3/build/Release/better_sqlite3.node",
      "node_modules/bindings/package.json",
      "node_modules/pg/package.json",
      "node_modules/pg-pool/package.json",
    ]) {
      assert.ok(existsSync(join(made.dir, part)), `${part} is in the package`);
    }
    const manifest = JSON.parse(readFileSync(join(made.dir, "package.json"), "utf8")) as {
      version: string;
      type: string;
    };
    assert.deepEqual(
      { version: manifest.version, type: manifest.type },
      { version: made.version, type: "module" },
    );
    // Each bundle in ASCII only (scripts/bundle.mjs): read at every start, it is then a string of one byte a character.
    for (const bundle of ["dist/bundle/mesh.cjs", "dist/bundle/mesh-host.cjs"]) {
      const bytes = readFileSync(join(made.dir, bundle));
      const outside = bytes.findIndex((byte) => byte > 0x7f);
      assert.equal(outside, -1, `${bundle} holds a byte outside ASCII at ${outside}`);
    }
    // Only what is loaded: no C++ sources, no build leftovers, no install-time tools.
    assert.ok(!existsSync(join(made.dir, "node_modules/better-sqlite3/src")));
    assert.ok(!existsSync(join(made.dir, "node_modules/better-sqlite3/build/Release/obj")));
    assert.ok(!existsSync(join(made.dir, "node_modules/prebuild-install")));
  });

  test("package — mesh --version and mesh-host --version run outside the repository; mesh-host with no node_modules, and its bundle alone", async () => {
    assert.ok(relative(repository, made.dir).startsWith(".."), "the package is outside the repository");
    assert.ok(!existsSync(join(made.hostOnly, "node_modules")), "the node's copy has no node_modules");
    for (const [script, cwd] of [
      [made.bins.mesh, made.dir],
      [join(made.dir, "bin", "mesh-host.js"), made.dir],
      [made.bins.meshHost, made.hostOnly],
    ] as const) {
      const run = await runScript(script, ["--version"], { cwd });
      assert.deepEqual(
        { code: run.code, stdout: run.stdout, stderr: run.stderr },
        {
          code: 0,
          stdout: `${made.version}\n`,
          stderr: "",
        },
      );
    }
    // The bundle copied alone (it once read ../../package.json at run time and died of ENOENT).
    const alone = tempDir("mesh-bundle-alone-");
    try {
      const file = join(alone.path, "mesh-host.cjs");
      copyFileSync(join(made.dir, "dist", "bundle", "mesh-host.cjs"), file);
      const run = await runScript(file, ["--version"], { cwd: alone.path });
      assert.equal(run.stdout, `${made.version}\n`, run.stderr);
    } finally {
      alone.remove();
    }
  });

  test("package — a bundle changed after its code cache was made runs as changed: the cache is not used for it", async () => {
    // V8 checks a cache against its source's length only: the same length with other contents would run the old code.
    const copy = tempDir("mesh-stale-cache-");
    try {
      for (const part of ["bin", "dist", "package.json"])
        cpSync(join(made.hostOnly, part), join(copy.path, part), { recursive: true });
      const script = join(copy.path, "bin", "mesh-host.js");
      const before = await runScript(script, ["--version"], { cwd: copy.path });
      assert.equal(before.stdout, `${made.version}\n`, before.stderr);
      const other = made.version.replace(/\d/g, (digit) => (digit === "9" ? "8" : "9"));
      const bundle = join(copy.path, "dist", "bundle", "mesh-host.cjs");
      const text = readFileSync(bundle, "utf8");
      assert.ok(text.includes(JSON.stringify(made.version)), "the version is baked into the bundle");
      writeFileSync(bundle, text.replaceAll(JSON.stringify(made.version), JSON.stringify(other)));
      assert.equal(readFileSync(bundle).length, Buffer.byteLength(text), "the same length");
      const after = await runScript(script, ["--version"], { cwd: copy.path });
      assert.deepEqual({ code: after.code, stdout: after.stdout }, { code: 0, stdout: `${other}\n` });
    } finally {
      copy.remove();
    }
  });

  test("package — mesh reaches PostgreSQL with the pg the package carries", async () => {
    const database = await scratchDatabase();
    const data = tempDir("mesh-package-pg-");
    try {
      const run = await runScript(
        made.bins.mesh,
        ["--data", data.path, "--store", database.url, "token", "list", "--json"],
        { cwd: made.dir },
      );
      assert.deepEqual(
        { code: run.code, stdout: run.stdout, stderr: run.stderr },
        { code: 0, stdout: "[]\n", stderr: "" },
      );
    } finally {
      data.remove();
      await database.drop();
    }
  });

  test("package — mesh up from the package, a node with mesh-host alone joins and runs and is here; its unit passes systemd-analyze verify", async (t) => {
    const fleet = await fleetForTest(t, "nats", { bins: made.bins });
    const { state, root } = await joined(fleet, "pkg-1");
    fleet.runAgent(state, undefined, t);
    await eventually("pkg-1 to be here in node list", async () =>
      (await fleet.list()).find((node) => node.name === "pkg-1")?.liveness === "here" ? true : undefined,
    );
    await appliedFile(fleet, "pkg-1", root, "from the package\n");

    // The node installs its service as a person would after joining (systemd does not run here: it says so).
    const unitDir = join(fleet.dir, "units");
    const installed = await fleet.host(["install", "--state", state, "--unit-dir", unitDir]);
    assert.equal(installed.code, 0, installed.stderr);
    assert.match(installed.stdout, /^wrote .*mesh-host\.service\n/);
    const unit = join(unitDir, "mesh-host.service");
    const execStart = /^ExecStart=(.*)$/m.exec(readFileSync(unit, "utf8"))?.[1];
    assert.equal(
      execStart,
      `${process.execPath} ${made.bins.meshHost} run --state ${state} --root ${root}`,
      "absolute paths: this Node and the node's own mesh-host",
    );
    const verified = verifyUnit(unit);
    assert.deepEqual(
      { status: verified.status, aboutUnit: verified.aboutUnit },
      { status: 0, aboutUnit: [] },
      verified.stderr,
    );
  });

  test("package — a node reboot: mesh-host run stopped and started again with only --state keeps its name and keys, is here again and applies what is declared next", async (t) => {
    const fleet = await fleetForTest(t, "nats", { bins: made.bins });
    const { state, root } = await joined(fleet, "boot-1");
    const before = {
      identity: readFileSync(join(state, "identity.json"), "utf8"),
      status: (await fleet.host(["status", "--state", state, "--json"])).stdout,
    };
    const first = fleet.runAgent(state, undefined, t);
    await appliedFile(fleet, "boot-1", root, "before the reboot\n");
    const signing = (await shown(fleet, "boot-1")).keys.signing;
    assert.match(signing ?? "", /^SHA256:/);
    assert.equal(await first.stop("SIGTERM"), 0, first.stderr());

    const restartedAt = new Date();
    // Only the state dir: no token, no root (kept from join), nobody at the keyboard.
    const again = fleet.runAgent(state, undefined, t);
    await eventually("boot-1 to be heard again after its restart", async () => {
      const now = await shown(fleet, "boot-1");
      return now.last_seen !== null && new Date(now.last_seen) >= restartedAt ? now : undefined;
    });
    const after = await shown(fleet, "boot-1");
    assert.deepEqual(
      { state: after.state, liveness: after.liveness, signing: after.keys.signing },
      { state: "enrolled", liveness: "here", signing },
      "the same node, with the same key",
    );
    assert.equal(readFileSync(join(state, "identity.json"), "utf8"), before.identity);
    // The same name, broker and pinned control-plane key, as `mesh-host status` reads them from the state dir.
    const status = (await fleet.host(["status", "--state", state, "--json"])).stdout;
    const picked = (text: string) => {
      const { node, broker, fingerprint } = JSON.parse(text) as Record<string, unknown>;
      return { node, broker, fingerprint };
    };
    assert.deepEqual(picked(status), picked(before.status));
    assert.equal((await fleet.list()).find((node) => node.name === "boot-1")?.liveness, "here");
    await appliedFile(fleet, "boot-1", root, "after the reboot\n");
    assert.equal(again.child.exitCode, null, again.stderr());
  });
});
