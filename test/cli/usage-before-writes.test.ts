import assert from "node:assert/strict";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { mesh } from "../support/cli.js";
import { tempDir } from "../support/tmp.js";

/** Bad usage that used to be found only after the data dir was made (broker.json, keys/, mesh.db written). */
describe("bad usage exits 2 before anything is written", () => {
  const dir = tempDir("mesh-usage-writes-");
  after(() => dir.remove());

  const cases: ReadonlyArray<[string, string[], RegExp, NodeJS.ProcessEnv?]> = [
    [
      "up with a management API that is not http",
      ["up", "--rabbitmq-api", "ftp://x"],
      /--rabbitmq-api: "ftp:\/\/…"/,
    ],
    [
      "serve on RabbitMQ with a management API that is not http",
      ["serve", "--broker", "amqp://127.0.0.1:1/x", "--rabbitmq-api", "ftp://x"],
      /--rabbitmq-api: "ftp:\/\/…" is not http\(s\)/,
    ],
    [
      "serve with a management API naming no user",
      ["serve", "--broker", "amqp://127.0.0.1:1/x", "--rabbitmq-api", "http://127.0.0.1:15672"],
      /--rabbitmq-api: the URL names no user/,
    ],
    [
      "up on a broker URL of another scheme",
      ["up", "--broker", "ftp://x"],
      /broker URL "ftp:\/\/x" is neither/,
    ],
    [
      "serve on a broker URL of another scheme",
      ["serve", "--broker", "ftp://x"],
      /is neither nats:\/\/… nor amqp/,
    ],
    ["up on a broker URL that is not a URL", ["up", "--broker", "amqp://[::1"], /is not a URL/],
    [
      "serve on RabbitMQ with no way to make accounts",
      ["serve", "--broker", "amqp://127.0.0.1:1/x"],
      /give --rabbitmq-api http:\/\/user:pass@127\.0\.0\.1:15672/,
    ],
    [
      "a management API from the environment that is not http",
      ["node", "list"],
      /MESH_RABBITMQ_API: "ftp:\/\/…"/,
      { MESH_RABBITMQ_API: "ftp://x" },
    ],
  ];

  for (const [what, args, expected, env] of cases) {
    test(`cli usage — ${what}`, async () => {
      const data = join(dir.path, what.replaceAll(" ", "-"));
      const run = await mesh(["--data", data, ...args], env);
      assert.equal(run.code, 2, `${run.stdout}${run.stderr}`);
      assert.match(run.stderr, expected);
      assert.equal(run.stderr.trimEnd().split("\n").length, 1, `one line, got: ${run.stderr}`);
      assert.equal(run.stdout, "");
      assert.equal(existsSync(data), false, "nothing is written");
    });
  }

  test("cli usage — a management API that is not a URL is refused without showing its password", async () => {
    const data = join(dir.path, "api-password");
    const run = await mesh(["--data", data, "up", "--rabbitmq-api", "http//admin:s3cret@host:15672"]);
    assert.equal(run.code, 2, run.stderr);
    assert.match(run.stderr, /--rabbitmq-api is not a URL/);
    assert.doesNotMatch(run.stderr, /s3cret/);
    assert.equal(existsSync(data), false);
  });

  test("cli usage — a management API in mesh.yaml that is not http names the file and writes nothing", async () => {
    const data = join(dir.path, "yaml-api");
    mkdirSync(data);
    writeFileSync(join(data, "mesh.yaml"), "rabbitmq_api: ftp://x\n");
    const run = await mesh(["--data", data, "serve", "--broker", "amqp://127.0.0.1:1/x"]);
    assert.equal(run.code, 2, run.stderr);
    assert.match(run.stderr, /mesh\.yaml rabbitmq_api: "ftp:\/\/…"/);
    assert.equal(run.stderr.trimEnd().split("\n").length, 1);
    assert.deepEqual(readdirSync(data), ["mesh.yaml"]);
  });

  // `mesh declare` checks its file against the wire contract (parseDeclarationFile → checkDeclaredFiles) first.
  const declarationCases: ReadonlyArray<[string, string, RegExp]> = [
    [
      "a declared path with a '..' segment",
      "files:\n  - path: /etc/../root/.ssh/authorized_keys\n    content: x\n",
      /files\[0\]\.path: expected an absolute path with no '\.\.' segment/,
    ],
    [
      "two declared files at one path",
      "files:\n  - path: /etc/motd\n    content: a\n  - path: /etc/motd\n    content: b\n",
      /files\[1\]\.path: repeats an earlier file's path/,
    ],
  ];
  for (const [what, text, expected] of declarationCases) {
    test(`cli usage — ${what} is refused before a sequence is used or anything is written`, async () => {
      const data = join(dir.path, what.replaceAll(" ", "-"));
      const file = join(dir.path, `${what.replaceAll(" ", "-")}.yaml`);
      writeFileSync(file, text);
      const run = await mesh(["--data", data, "declare", "web-1", "-f", file]);
      assert.equal(run.code, 2, `${run.stdout}${run.stderr}`);
      assert.match(run.stderr, expected);
      assert.equal(run.stderr.trimEnd().split("\n").length, 1, `one line, got: ${run.stderr}`);
      assert.equal(existsSync(data), false, "nothing is written");
    });
  }
});
