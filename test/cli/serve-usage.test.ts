import assert from "node:assert/strict";
import { createServer } from "node:net";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { mesh, meshHost } from "../support/cli.js";
import { eventually, startBin } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

describe("mesh up, declare and mesh-host: bad usage and clear failures", () => {
  const dir = tempDir("mesh-serve-usage-");
  after(() => dir.remove());

  test("cli usage — mesh up with a port that is not a number exits 2 and writes nothing", async () => {
    const data = join(dir.path, "bad-port");
    const run = await mesh(["--data", data, "up", "--nats-port", "banana"]);
    assert.equal(run.code, 2);
    assert.equal(run.stderr, 'mesh: --nats-port: "banana" is not a port number (0 to 65535)\n');
    assert.equal(existsSync(data), false);
  });

  test("cli — mesh up on a port that is taken fails with one line naming the flag and who holds it", async () => {
    const blocker = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, "127.0.0.1", resolve));
    const address = blocker.address();
    const port = typeof address === "object" && address !== null ? address.port : 0;
    // This very process holds it, and /proc says so.
    const command = readFileSync(`/proc/${process.pid}/cmdline`, "utf8")
      .split("\0")
      .filter(Boolean)
      .join(" ");
    const heldBy = `${process.pid} ${command}`.slice(0, 200);
    try {
      const run = await mesh(["--data", join(dir.path, "taken"), "up", "--nats-port", String(port)]);
      assert.equal(run.code, 1);
      assert.equal(run.stderr, `mesh: --nats-port ${port}: the port is taken (held by ${heldBy})\n`);
    } finally {
      blocker.close();
    }
  });

  test("cli usage — declare with a file that is not a declaration exits 2 naming the problem", async () => {
    const data = join(dir.path, "declare");
    const file = join(dir.path, "bad.yaml");
    writeFileSync(file, "files:\n  - path: etc/motd\n    content: x\n");
    const relative = await mesh(["--data", data, "declare", "web-1", "-f", file]);
    assert.equal(relative.code, 2);
    assert.match(relative.stderr, /files\[0\]\.path: expected an absolute path/);
    writeFileSync(file, "files: [ {path: /x, content: 1, mode: '999'} ]\n");
    const mode = await mesh(["--data", data, "declare", "web-1", "-f", file]);
    assert.equal(mode.code, 2);
    const missing = await mesh(["--data", data, "declare", "web-1", "-f", join(dir.path, "nope.yaml")]);
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /cannot read .*nope\.yaml/);
    assert.equal(existsSync(data), false);
  });

  test("cli usage — mesh-host join without a token, or with a damaged one, exits 2", async () => {
    const none = await meshHost(["join", "--state", join(dir.path, "host")], { MESH_TOKEN: "" });
    assert.equal(none.code, 2);
    assert.equal(
      none.stderr,
      "mesh-host: no token: give it as an argument, with --token-file, or in MESH_TOKEN\n",
    );
    const damaged = await meshHost(["join", "mesh1_AAAA", "--state", join(dir.path, "host")]);
    assert.equal(damaged.code, 2);
    assert.match(damaged.stderr, /^mesh-host: the token is damaged/);
    const label = await meshHost([
      "join",
      "x",
      "--label",
      "no-equals-sign",
      "--state",
      join(dir.path, "host"),
    ]);
    assert.equal(label.code, 2);
    assert.equal(existsSync(join(dir.path, "host")), false);
  });

  test("cli — mesh-host status before joining says so", async () => {
    const run = await meshHost(["status", "--state", join(dir.path, "never"), "--json"]);
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(JSON.parse(run.stdout), {
      joined: false,
      node: null,
      broker: null,
      fingerprint: null,
      applied: null,
    });
  });
});

describe("mesh up keeps its broker's address", () => {
  const dir = tempDir("mesh-up-port-");
  after(() => dir.remove());

  test("cli — the port chosen on the first run is reused on the next, because nodes hold that address", async () => {
    const data = join(dir.path, "data");
    const urlOf = (text: string) => /broker\s+(nats:\/\/\S+)/.exec(text)?.[1];
    const first = startBin("mesh", ["--data", data, "up"]);
    const firstUrl = await eventually("the first start", () => urlOf(first.stdout()));
    assert.equal(await first.stop("SIGTERM"), 0, first.stderr());
    const second = startBin("mesh", ["--data", data, "up"]);
    const secondUrl = await eventually("the second start", () => urlOf(second.stdout()));
    assert.equal(await second.stop("SIGINT"), 0, second.stderr());
    assert.equal(secondUrl, firstUrl);
    const recorded = JSON.parse(readFileSync(join(data, "broker.json"), "utf8")) as { url: string };
    assert.equal(recorded.url, firstUrl);
  });
});
