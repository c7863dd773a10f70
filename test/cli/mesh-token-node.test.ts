import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { decodeToken } from "../../src/link/index.js";
import { openStore } from "../../src/store/index.js";
import { mesh, meshHost } from "../support/cli.js";
import { scratchDatabase } from "../support/postgres.js";
import { tempDir } from "../support/tmp.js";

describe("mesh token and node commands", () => {
  const dir = tempDir("mesh-cli-");
  const data = join(dir.path, "data");
  after(() => dir.remove());

  test("cli — issue → list → node list (table and JSON) → revoke", async () => {
    const issued = await mesh(["--data", data, "token", "issue", "web-1", "--json"]);
    assert.equal(issued.code, 0, issued.stderr);
    const body = JSON.parse(issued.stdout) as { node: string; token: string; expires_at: string };
    assert.deepEqual(Object.keys(body).sort(), ["expires_at", "node", "token"]);
    assert.equal(body.node, "web-1");
    const content = decodeToken(body.token);
    assert.equal(content.node, "web-1");
    assert.equal(content.broker, null);
    const ttl = Date.parse(body.expires_at) - Date.now();
    assert.ok(ttl > 59 * 60_000 && ttl <= 60 * 60_000, `default TTL is one hour, got ${ttl} ms`);
    // The token pins the control plane's signing key, created on first use with a private file.
    assert.equal(readFileSync(join(data, "keys", "signing.key")).length > 0, true);

    const listed = await mesh(["--data", data, "token", "list", "--json"]);
    assert.equal(listed.code, 0, listed.stderr);
    const tokens = JSON.parse(listed.stdout) as Array<Record<string, unknown>>;
    assert.deepEqual(tokens, [
      { id: content.id, node: "web-1", expires_at: body.expires_at, status: "valid" },
    ]);
    assert.doesNotMatch(listed.stdout, new RegExp(content.secret));

    const table = await mesh(["--data", data, "token", "list"]);
    assert.match(table.stdout, /^ID\s+NODE\s+EXPIRES\s+STATUS\n/);
    assert.match(table.stdout, new RegExp(`${content.id}\\s+web-1\\s+\\S+\\s+valid`));

    const nodes = await mesh(["--data", data, "node", "list", "--json"]);
    assert.equal(nodes.code, 0, nodes.stderr);
    assert.deepEqual(JSON.parse(nodes.stdout), [
      {
        name: "web-1",
        state: "invited",
        liveness: "never_spoken",
        last_seen: null,
        out_of_touch_for_s: null,
        units: [],
        holding: "none",
      },
    ]);
    const nodeTable = await mesh(["--data", data, "node", "list"]);
    assert.equal(
      nodeTable.stdout,
      "NAME   STATE    LIVENESS      LAST SEEN  HOLDING  UNITS\nweb-1  invited  never spoken  -          none     -\n" +
        "the control plane has not listened yet: liveness is judged by the clock alone\n",
    );

    const revoked = await mesh(["--data", data, "token", "revoke", content.id]);
    assert.equal(revoked.code, 0, revoked.stderr);
    assert.equal(revoked.stdout, `revoked ${content.id}\n`);
    const afterRevoke = JSON.parse(
      (await mesh(["--data", data, "token", "list", "--json"])).stdout,
    ) as Array<{
      status: string;
    }>;
    assert.equal(afterRevoke[0]?.status, "revoked");

    const twice = await mesh(["--data", data, "token", "revoke", content.id]);
    assert.equal(twice.code, 1);
    assert.equal(twice.stderr, `mesh: token ${content.id} is already spent, expired or revoked\n`);
    const unknown = await mesh(["--data", data, "token", "revoke", "tok_ffffffffffff"]);
    assert.equal(unknown.code, 1);
    assert.equal(unknown.stderr, "mesh: no token tok_ffffffffffff\n");
  });

  test("cli — node list shows here, out of touch with how long, and never spoken", async () => {
    const fleet = join(dir.path, "fleet");
    for (const node of ["alpha", "bravo", "charlie"]) {
      assert.equal((await mesh(["--data", fleet, "token", "issue", node, "--json"])).code, 0);
    }
    const store = await openStore(`sqlite:${join(fleet, "mesh.db")}`, { historyLimit: 5 });
    const now = Date.now();
    await store.nodes.touch(
      new Map([
        ["alpha", new Date(now - 5_000).toISOString()],
        ["bravo", new Date(now - 245_000).toISOString()],
      ]),
    );
    await store.close();

    const table = await mesh(["--data", fleet, "node", "list"]);
    assert.equal(table.code, 0, table.stderr);
    const lines = table.stdout.trimEnd().split("\n");
    assert.match(lines[0] ?? "", /^NAME\s+STATE\s+LIVENESS\s+LAST SEEN\s+HOLDING\s+UNITS$/);
    assert.match(lines[1] ?? "", /^alpha\s+invited\s+here\s+\d{4}-/);
    assert.match(lines[2] ?? "", /^bravo\s+invited\s+out of touch 4m\s+\d{4}-/);
    assert.match(lines[3] ?? "", /^charlie\s+invited\s+never spoken\s+-\s+none\s+-$/);

    const askedAt = Date.now();
    const json = JSON.parse((await mesh(["--data", fleet, "node", "list", "--json"])).stdout) as Array<{
      name: string;
      liveness: string;
      out_of_touch_for_s: number | null;
    }>;
    const answeredAt = Date.now();
    assert.deepEqual(
      json.map((n) => [n.name, n.liveness]),
      [
        ["alpha", "here"],
        ["bravo", "out_of_touch"],
        ["charlie", "never_spoken"],
      ],
    );
    // How long bravo had been silent when `node list` read the clock: between the readings taken around it, however
    // long the command took on a busy machine (and never less than the 245 s written).
    const bravo = json[1]?.out_of_touch_for_s ?? 0;
    const bravoSeen = now - 245_000;
    const [least, most] = [askedAt, answeredAt].map((at) => Math.floor((at - bravoSeen) / 1000));
    assert.ok(least !== undefined && least >= 245 && most !== undefined);
    assert.ok(bravo >= least && bravo <= most, `bravo out of touch for ${bravo}s, silent ${least}–${most}s`);

    // The threshold is configuration: with 10m, bravo is here; a flag beats the environment beats mesh.yaml.
    writeFileSync(join(fleet, "mesh.yaml"), "out_of_touch_after: 1s\n");
    const fromFile = JSON.parse((await mesh(["--data", fleet, "node", "list", "--json"])).stdout) as Array<{
      liveness: string;
    }>;
    assert.equal(fromFile[0]?.liveness, "out_of_touch");
    const fromEnv = JSON.parse(
      (await mesh(["--data", fleet, "node", "list", "--json"], { MESH_OUT_OF_TOUCH_AFTER: "10m" })).stdout,
    ) as Array<{ liveness: string }>;
    assert.equal(fromEnv[1]?.liveness, "here");
    const fromFlag = JSON.parse(
      (
        await mesh(["--data", fleet, "--out-of-touch-after", "1s", "node", "list", "--json"], {
          MESH_OUT_OF_TOUCH_AFTER: "10m",
        })
      ).stdout,
    ) as Array<{ liveness: string }>;
    assert.equal(fromFlag[1]?.liveness, "out_of_touch");
  });

  test("cli — MESH_HOME names the data dir when --data is absent", async () => {
    const home = join(dir.path, "home");
    const issued = await mesh(["token", "issue", "db-1", "--ttl", "15m", "--json"], { MESH_HOME: home });
    assert.equal(issued.code, 0, issued.stderr);
    assert.ok(existsSync(join(home, "mesh.db")));
    const body = JSON.parse(issued.stdout) as { expires_at: string };
    const ttl = Date.parse(body.expires_at) - Date.now();
    assert.ok(ttl > 14 * 60_000 && ttl <= 15 * 60_000);
  });

  test("cli — mesh-host reads a token without showing its secret", async () => {
    const issued = JSON.parse((await mesh(["--data", data, "token", "issue", "app-1", "--json"])).stdout) as {
      token: string;
    };
    const shown = await meshHost(["token", "show", issued.token, "--json"]);
    assert.equal(shown.code, 0, shown.stderr);
    const content = decodeToken(issued.token);
    assert.deepEqual(JSON.parse(shown.stdout), {
      id: content.id,
      node: "app-1",
      expires_at: content.expires_at,
      fingerprint: content.fingerprint,
      broker: null,
    });
    assert.doesNotMatch(shown.stdout, new RegExp(content.secret));
    const damaged = await meshHost(["token", "show", issued.token.slice(0, -5)]);
    assert.equal(damaged.code, 2);
    assert.equal(damaged.stderr.split("\n").length, 2, "one line");
  });

  test("cli — a failure is one line; MESH_DEBUG=1 adds its stack, naming the source files it came from", async () => {
    const plain = await mesh(["--data", data, "node", "show", "nobody-here"]);
    assert.equal(plain.code, 1);
    assert.equal(plain.stderr, "mesh: no node named nobody-here\n");
    const debug = await mesh(["--data", data, "node", "show", "nobody-here"], { MESH_DEBUG: "1" });
    assert.equal(debug.code, 1);
    assert.match(debug.stderr, /^mesh: no node named nobody-here\nMeshError: no node named nobody-here\n/);
    assert.match(debug.stderr, /\bsrc\/cli\/node\.ts:\d+:\d+/, "the stack names src/, not the bundle");
    const host = await meshHost(["token", "show", "not-a-token"], { MESH_DEBUG: "1" });
    assert.equal(host.code, 2);
    assert.match(host.stderr, /\bsrc\/[\w/-]+\.ts:\d+:\d+/, host.stderr);
  });
});

describe("mesh on a PostgreSQL store", () => {
  let database: { url: string; drop(): Promise<void> };
  const dir = tempDir("mesh-cli-pg-");
  before(async () => {
    database = await scratchDatabase();
  });
  after(async () => {
    await database.drop();
    dir.remove();
  });

  test("cli — --store postgres://… keeps tokens and nodes in PostgreSQL", async () => {
    const args = ["--data", dir.path, "--store", database.url];
    assert.equal((await mesh([...args, "token", "issue", "pg-1"])).code, 0);
    const nodes = JSON.parse((await mesh([...args, "node", "list", "--json"])).stdout) as Array<{
      name: string;
    }>;
    assert.deepEqual(
      nodes.map((n) => n.name),
      ["pg-1"],
    );
    assert.equal(existsSync(join(dir.path, "mesh.db")), false, "no SQLite file beside a PostgreSQL store");
  });
});
