/**
 * The control plane's data dir, read as another user of the machine would: the store holds declarations' content,
 * `broker.json` on RabbitMQ an administrator's password, `keys/` and `nats/` the keys. An operator may well have
 * made the dir 0755 before the first start; every file the mesh creates in it is 0600 all the same (the SQLite
 * store's `-wal` and `-shm` too), and the mesh's own nats-server keeps its JetStream files, which it makes 0640, in
 * a 0700 directory. The built `mesh` runs here as an operator runs it, under the usual umask 022.
 */
import assert from "node:assert/strict";
import { chmodSync, existsSync, lstatSync, mkdirSync, readdirSync } from "node:fs";
import { join, relative } from "node:path";
import { after, before, describe, test } from "node:test";
import { mesh } from "../support/cli.js";
import { eventually, startBin } from "../support/processes.js";
import { rabbitApiUrl, scratchVhost } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

/** Any permission for group or others: read lets them see, write lets them replace. */
const notOwnerBits = 0o077;
const octal = (mode: number) => `0${(mode & 0o777).toString(8)}`;

interface Found {
  files: Map<string, number>;
  dirs: Map<string, number>;
}

/** Every regular file and directory below `root`, by path relative to it, with its permission bits. */
function walk(root: string, found: Found = { files: new Map(), dirs: new Map() }, dir = root): Found {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    const mode = lstatSync(path).mode & 0o777;
    if (entry.isDirectory()) {
      found.dirs.set(relative(root, path), mode);
      walk(root, found, path);
    } else if (entry.isFile()) {
      found.files.set(relative(root, path), mode);
    }
  }
  return found;
}

/** A data dir an operator made beforehand, open to everyone on the machine for reading. */
function openDataDir(): { dir: ReturnType<typeof tempDir>; data: string } {
  const dir = tempDir("mesh-data-modes-");
  const data = join(dir.path, "data");
  mkdirSync(data);
  chmodSync(data, 0o755);
  return { dir, data };
}

/** The files and directories the mesh made with any bit for group or others, as "path mode" lines. */
function tooOpen(found: Found, skip: (path: string) => boolean): string[] {
  return [...found.files, ...found.dirs]
    .filter(([path, mode]) => !skip(path) && (mode & notOwnerBits) !== 0)
    .map(([path, mode]) => `${path} ${octal(mode)}`)
    .sort();
}

describe("attack: reading the control plane's data dir as another user", () => {
  let umask: number;
  before(() => {
    // The usual umask, whatever the test runner's: with it, a file made without a mode is 0644.
    umask = process.umask(0o022);
  });
  after(() => {
    process.umask(umask);
  });

  test("data dir — `mesh up` with its own nats-server in a 0755 data dir: every file the mesh made is 0600, the nats-server's dir 0700", async () => {
    const { dir, data } = openDataDir();
    const up = startBin("mesh", ["--data", data, "up", "--nats-port", "0"]);
    try {
      await eventually("the control plane to serve", () =>
        /control\.serving/.test(up.stderr()) ? true : undefined,
      );
      const issued = await mesh(["--data", data, "token", "issue", "web-1"]);
      assert.equal(issued.code, 0, issued.stderr);
      // Looked at while it runs: SQLite's -wal and -shm exist only while the store is open.
      for (const file of ["mesh.db", "mesh.db-wal", "mesh.db-shm", "broker.json", "running.json"]) {
        assert.ok(existsSync(join(data, file)), `${file} exists`);
      }
      const jetstream = join("nats", "server", "jetstream");
      const found = walk(data);
      assert.ok(
        [...found.files.keys()].some((path) => path.startsWith(`${jetstream}/`)),
        "the nats-server keeps JetStream files in the data dir",
      );
      // What nats-server itself makes inside its JetStream dir is closed off by the directories above it.
      assert.deepEqual(
        tooOpen(found, (path) => path.startsWith(`${jetstream}/`)),
        [],
        "files and directories others can reach",
      );
      assert.equal(octal(found.dirs.get(join("nats", "server")) ?? 0), "0700", "the nats-server's own dir");
      assert.equal(octal(found.dirs.get("nats") ?? 0), "0700");
      assert.equal(octal(lstatSync(data).mode), "0755", "the operator's own choice for the dir is left");
    } finally {
      const code = await up.stop();
      dir.remove();
      assert.equal(code, 0, up.stderr());
    }
  });

  test("data dir — `mesh up` on RabbitMQ in a 0755 data dir: the store, broker.json (an administrator's password) and every other file are 0600", async () => {
    const { dir, data } = openDataDir();
    const scratch = await scratchVhost();
    const up = startBin("mesh", [
      "--data",
      data,
      "up",
      "--broker",
      scratch.url,
      "--rabbitmq-api",
      rabbitApiUrl,
    ]);
    try {
      await eventually("the control plane to serve", () =>
        /control\.serving/.test(up.stderr()) ? true : undefined,
      );
      const issued = await mesh(["--data", data, "token", "issue", "web-1"]);
      assert.equal(issued.code, 0, issued.stderr);
      for (const file of ["mesh.db", "mesh.db-wal", "mesh.db-shm", "broker.json", "running.json"]) {
        assert.ok(existsSync(join(data, file)), `${file} exists`);
      }
      assert.ok(existsSync(join(data, "rabbitmq", "control.password")));
      assert.deepEqual(
        tooOpen(walk(data), () => false),
        [],
        "files and directories others can reach",
      );
    } finally {
      const code = await up.stop();
      await scratch.drop();
      dir.remove();
      assert.equal(code, 0, up.stderr());
    }
  });
});
