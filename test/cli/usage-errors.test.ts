import assert from "node:assert/strict";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { mesh } from "../support/cli.js";
import { tempDir } from "../support/tmp.js";

describe("bad usage exits 2 with one clear line and writes nothing", () => {
  const dir = tempDir("mesh-usage-");
  after(() => dir.remove());

  const cases: ReadonlyArray<[string, string[], RegExp]> = [
    ["an unknown flag", ["token", "issue", "web-1", "--bogus"], /unknown option '--bogus'/],
    ["an unknown command", ["tokne", "list"], /unknown command 'tokne'/],
    [
      "a TTL that is not a duration",
      ["token", "issue", "web-1", "--ttl", "banana"],
      /--ttl: "banana" is not a duration/,
    ],
    ["a negative TTL", ["token", "issue", "web-1", "--ttl=-5m"], /--ttl: "-5m" is not a duration/],
    ["a zero TTL", ["token", "issue", "web-1", "--ttl", "0s"], /--ttl: "0s" must be longer than zero/],
    ["a node name with an underscore", ["token", "issue", "web_1"], /"web_1" is not a node name/],
    ["a node name in capitals", ["token", "issue", "Web-1"], /"Web-1" is not a node name/],
    ["a node name starting with a hyphen", ["token", "issue", "--", "-web"], /"-web" is not a node name/],
    ["a node name of 64 characters", ["token", "issue", "a".repeat(64)], /is not a node name/],
    ["a missing node name", ["token", "issue"], /missing required argument 'node'/],
    ["a malformed token id", ["token", "revoke", "12345"], /"12345" is not a token id/],
    ["a bad store URL", ["--store", "mysql://db", "node", "list"], /neither sqlite:PATH nor postgres/],
    ["a bad threshold", ["--out-of-touch-after", "soon", "node", "list"], /--out-of-touch-after: "soon"/],
    ["lab: no --nodes", ["lab"], /required option '--nodes <n>' not specified/],
    ["lab: --nodes 0", ["lab", "--nodes", "0"], /--nodes: "0" is not a whole number from 1 to 100000/],
    ["lab: --nodes negative", ["lab", "--nodes=-5"], /--nodes: "-5" is not a whole number/],
    ["lab: --nodes a fraction", ["lab", "--nodes", "1.5"], /--nodes: "1.5" is not a whole number/],
    ["lab: --nodes a word", ["lab", "--nodes", "many"], /--nodes: "many" is not a whole number/],
    ["lab: --nodes too many", ["lab", "--nodes", "100001"], /--nodes: "100001" is not a whole number/],
    [
      "lab: a bad alive interval",
      ["lab", "--nodes", "3", "--alive-every", "often"],
      /--alive-every: "often"/,
    ],
    ["lab: a bad connection mode", ["lab", "--nodes", "3", "--connections", "many"], /--connections: "many"/],
    ["lab: a prefix that makes no node names", ["lab", "--nodes", "3", "--prefix", "Lab"], /--prefix: "Lab"/],
    ["a declaration for nobody", ["declare", "-f", "x.yaml"], /name a node \(or several\), or give --all/],
    [
      "node names and --all",
      ["declare", "web-1", "--all", "-f", "x.yaml"],
      /give node names or --all, not both/,
    ],
    ["a bad name among several", ["declare", "web-1", "Web_2", "-f", "x.yaml"], /"Web_2" is not a node name/],
    [
      "metrics on no address",
      ["serve", "--broker", "nats://127.0.0.1:1", "--metrics", "9464"],
      /--metrics: "9464" is not HOST:PORT/,
    ],
  ];

  for (const [what, args, expected] of cases) {
    test(`cli usage — ${what}`, async () => {
      const data = join(dir.path, what.replaceAll(" ", "-"));
      const run = await mesh(["--data", data, ...args]);
      assert.equal(run.code, 2, `${run.stdout}${run.stderr}`);
      assert.match(run.stderr, expected);
      assert.equal(run.stderr.trimEnd().split("\n").length, 1, `one line, got: ${run.stderr}`);
      assert.equal(run.stdout, "");
      assert.equal(existsSync(data), false, "nothing is written");
    });
  }

  test("cli usage — an unknown key in mesh.yaml is refused, naming the file", async () => {
    const data = join(dir.path, "yaml");
    mkdirSync(data);
    writeFileSync(join(data, "mesh.yaml"), "out_of_touch_afterr: 10s\n");
    const run = await mesh(["--data", data, "node", "list"]);
    assert.equal(run.code, 2);
    assert.match(run.stderr, /mesh\.yaml/);
    assert.match(run.stderr, /out_of_touch_afterr/);
    assert.equal(existsSync(join(data, "mesh.db")), false);
  });

  test("cli usage — a bad MESH_* value names the variable", async () => {
    const data = join(dir.path, "env");
    const run = await mesh(["--data", data, "token", "issue", "web-1"], { MESH_TOKEN_TTL: "forever" });
    assert.equal(run.code, 2);
    assert.match(run.stderr, /MESH_TOKEN_TTL: "forever" is not a duration/);
    assert.equal(existsSync(data), false);
  });

  test("cli usage — --help exits 0", async () => {
    const run = await mesh(["token", "issue", "--help"]);
    assert.equal(run.code, 0);
    assert.match(run.stdout, /--ttl <duration>/);
  });
});
