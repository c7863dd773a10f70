import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { after, test } from "node:test";
import { parseDuration } from "../../src/config/duration.js";
import { compileMeshOptions } from "../../src/config/options.js";
import { UsageError } from "../../src/errors.js";
import { tempDir } from "../support/tmp.js";

const dir = tempDir("mesh-config-");
after(() => dir.remove());

test("duration — units and sums", () => {
  assert.equal(parseDuration("500ms", "x"), 500);
  assert.equal(parseDuration("45s", "x"), 45_000);
  assert.equal(parseDuration("15m", "x"), 900_000);
  assert.equal(parseDuration("1h", "x"), 3_600_000);
  assert.equal(parseDuration("2d", "x"), 172_800_000);
  assert.equal(parseDuration("1h30m", "x"), 5_400_000);
});

test("duration — anything else is a usage error naming the setting", () => {
  for (const bad of ["banana", "-5m", "0s", "5", "1.5h", "h", "", "1y", "5 m", "99999999999999999999d"]) {
    assert.throws(
      () => parseDuration(bad, "--ttl"),
      (e: unknown) => e instanceof UsageError && /--ttl/.test(e.message),
      bad,
    );
  }
});

test("config — defaults when nothing is set", () => {
  const options = compileMeshOptions({ dataDir: join(dir.path, "empty"), flags: {}, env: {} });
  assert.deepEqual(options, {
    dataDir: resolve(dir.path, "empty"),
    storeUrl: `sqlite:${resolve(dir.path, "empty", "mesh.db")}`,
    outOfTouchAfterMs: 45_000,
    tokenTtlMs: 3_600_000,
    tokenGraceMs: 2000,
    tokenSweepEveryMs: 60_000,
    tokenKeepForMs: 7 * 86_400_000,
    historyLimit: 50,
    events: { keepForMs: 30 * 86_400_000, keepAtMost: 1_000_000 },
    lease: { renewEveryMs: 5000, ttlMs: 15_000, marginMs: 3000 },
    metrics: undefined,
    rabbitmqApi: undefined,
    periods: {
      flushEveryMs: 1000,
      receiptsEveryMs: 1000,
      livenessEveryMs: 5000,
      resendAfterMs: 5000,
      tokenLookEveryMs: 1000,
      pruneEveryMs: 600_000,
      noEpochLogEveryMs: 60_000,
      hearingEveryMs: 1000,
      hearingAnswerWithinMs: 3000,
      planEveryMs: 200,
      planRevisionEveryMs: 25,
    },
  });
});

test("config — metrics listen on HOST:PORT, or not at all", () => {
  const compile = (value: string) =>
    compileMeshOptions({ dataDir: join(dir.path, "metrics"), flags: { metrics: value }, env: {} }).metrics;
  assert.deepEqual(compile("127.0.0.1:9464"), { host: "127.0.0.1", port: 9464 });
  assert.deepEqual(compile("[::1]:0"), { host: "::1", port: 0 });
  assert.equal(compile("off"), undefined);
  for (const bad of ["9464", "127.0.0.1", "127.0.0.1:65536", "127.0.0.1:-1", "host:port", ":9464", "on"]) {
    assert.throws(
      () => compile(bad),
      (e: unknown) => e instanceof UsageError && /--metrics: .* is not HOST:PORT/.test(e.message),
      bad,
    );
  }
});

test("config — a lease renewed no more often than it may act is refused", () => {
  assert.throws(
    () =>
      compileMeshOptions({
        dataDir: join(dir.path, "lease"),
        flags: {},
        env: { MESH_LEASE_RENEW_EVERY: "12s" },
      }),
    /renewed .* more often than it can act/,
  );
});

test("config — flags beat MESH_* beat mesh.yaml beat defaults; MESH_HOME names the data dir", () => {
  const home = join(dir.path, "layers");
  mkdirSync(home);
  writeFileSync(
    join(home, "mesh.yaml"),
    "store: postgres://db/mesh\nout_of_touch_after: 1m\ntoken_ttl: 2h\nhistory_limit: 7\n",
  );
  const fromFile = compileMeshOptions({ flags: {}, env: { MESH_HOME: home } });
  assert.equal(fromFile.dataDir, home);
  assert.equal(fromFile.storeUrl, "postgres://db/mesh");
  assert.equal(fromFile.outOfTouchAfterMs, 60_000);
  assert.equal(fromFile.tokenTtlMs, 7_200_000);
  assert.equal(fromFile.historyLimit, 7);

  const env = { MESH_HOME: home, MESH_OUT_OF_TOUCH_AFTER: "2m", MESH_HISTORY_LIMIT: "9" };
  const fromEnv = compileMeshOptions({ flags: {}, env });
  assert.equal(fromEnv.outOfTouchAfterMs, 120_000);
  assert.equal(fromEnv.historyLimit, 9);
  assert.equal(fromEnv.tokenTtlMs, 7_200_000);

  const fromFlags = compileMeshOptions({
    flags: { out_of_touch_after: "3m", store: "sqlite:/tmp/x.db" },
    env,
  });
  assert.equal(fromFlags.outOfTouchAfterMs, 180_000);
  assert.equal(fromFlags.storeUrl, "sqlite:/tmp/x.db");
});

test("config — a bad mesh.yaml is a usage error naming the file and the key", () => {
  const home = join(dir.path, "bad-yaml");
  mkdirSync(home);
  writeFileSync(join(home, "mesh.yaml"), "token_ttl: [1, 2]\n");
  assert.throws(() => compileMeshOptions({ dataDir: home, flags: {}, env: {} }), /mesh\.yaml.*token_ttl/);
  writeFileSync(join(home, "mesh.yaml"), "a: b: c\n");
  assert.throws(() => compileMeshOptions({ dataDir: home, flags: {}, env: {} }), /not valid YAML/);
  writeFileSync(join(home, "mesh.yaml"), "history_limit: 0\n");
  assert.throws(() => compileMeshOptions({ dataDir: home, flags: {}, env: {} }), /history_limit.*at least 1/);
});
