import assert from "node:assert/strict";
import { chmodSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { MeshError } from "../../src/errors.js";
import { HostState, HostStateError, resolveStateDir, stateFiles } from "../../src/host/state.js";
import type { HostIdentity } from "../../src/host/state.js";
import {
  decodeSigningPublicKey,
  encodeSigningPublicKey,
  fingerprint,
  generateSigningKeyPair,
  sign,
  verify,
} from "../../src/keys/index.js";
import { tempDir } from "../support/tmp.js";

const scratch = tempDir("mesh-host-state-");
after(() => scratch.remove());
let cases = 0;

/** A fresh state directory that does not exist yet, as on a machine that never ran the agent. */
function freshState(): HostState {
  cases += 1;
  return new HostState(join(scratch.path, `case-${cases}`, "state"));
}

function modeOf(path: string): number {
  return statSync(path).mode & 0o777;
}

function hostStateError(pattern: RegExp) {
  return (error: unknown) =>
    error instanceof HostStateError &&
    error instanceof MeshError &&
    error.code === "host_state" &&
    pattern.test(error.message);
}

const controlKey = generateSigningKeyPair().publicKey;
const identity: HostIdentity = {
  node: "web-1",
  queue: "node.web-1",
  broker: { url: "nats://127.0.0.1:4222", credential: { type: "nats", jwt: "eyJhIjoxfQ.eyJiIjoyfQ.c2ln" } },
  signing_key: encodeSigningPublicKey(controlKey),
  fingerprint: fingerprint(controlKey),
  joined_at: "2026-11-29T14:49:00Z",
};

void describe("host state", () => {
  void test("state dir — the flag wins, then MESH_HOST_STATE, then the user's state folder", () => {
    assert.equal(resolveStateDir("/srv/mesh", { MESH_HOST_STATE: "/elsewhere" }), "/srv/mesh");
    assert.equal(resolveStateDir(undefined, { MESH_HOST_STATE: "/elsewhere" }), "/elsewhere");
    assert.equal(resolveStateDir("relative/dir", {}), join(process.cwd(), "relative/dir"));
    const fallback = resolveStateDir(undefined, { HOME: "/home/ada" });
    if (process.getuid?.() === 0) assert.equal(fallback, "/var/lib/mesh-host");
    else assert.equal(fallback, "/home/ada/.local/state/mesh-host");
  });

  void test("identity — round trip, kept with mode 0600 in a 0700 directory", () => {
    const state = freshState();
    state.saveIdentity(identity);
    assert.deepEqual(state.loadIdentity(), identity);
    assert.equal(modeOf(join(state.dir, stateFiles.identity)), 0o600);
    assert.equal(modeOf(state.dir), 0o700);

    const amqp: HostIdentity = {
      ...identity,
      broker: {
        url: "amqps://broker.example:5671",
        credential: { type: "amqp", username: "node-web-1", password: "s3cret" },
      },
    };
    state.saveIdentity(amqp);
    assert.deepEqual(new HostState(state.dir).loadIdentity(), amqp);
  });

  void test("identity — a missing file means not joined", () => {
    const state = freshState();
    assert.equal(state.loadIdentity(), undefined);
    mkdirSync(state.dir, { recursive: true });
    assert.equal(state.loadIdentity(), undefined);
  });

  void test("identity — a corrupt file throws naming the file, never reads as not joined", () => {
    const state = freshState();
    mkdirSync(state.dir, { recursive: true });
    const path = join(state.dir, stateFiles.identity);
    const file = new RegExp(path.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));

    writeFileSync(path, '{"node": "web-1", ', { mode: 0o600 });
    assert.throws(() => state.loadIdentity(), hostStateError(file));

    writeFileSync(path, JSON.stringify({ ...identity, signing_key: "not a key" }), { mode: 0o600 });
    assert.throws(() => state.loadIdentity(), hostStateError(/signing_key/));

    writeFileSync(path, "", { mode: 0o600 });
    assert.throws(() => state.loadIdentity(), hostStateError(file));
  });

  void test("identity — a file others may read is refused, since it holds a broker credential", () => {
    const state = freshState();
    state.saveIdentity(identity);
    const path = join(state.dir, stateFiles.identity);
    chmodSync(path, 0o644);
    assert.throws(() => state.loadIdentity(), hostStateError(/mode 0644/));
  });

  void test("identity — a malformed identity is refused before it is written", () => {
    const state = freshState();
    assert.throws(() => state.saveIdentity({ ...identity, node: "Web_1" }), hostStateError(/node/));
    assert.equal(state.loadIdentity(), undefined);
  });

  void test("report sequence — starts at 1, increments and survives a new HostState on the same dir", () => {
    const state = freshState();
    assert.equal(state.nextReportSequence(), 1);
    assert.equal(state.nextReportSequence(), 2);
    assert.equal(state.nextReportSequence(), 3);
    const restarted = new HostState(state.dir);
    assert.equal(restarted.nextReportSequence(), 4);
    assert.equal(readFileSync(join(state.dir, stateFiles.reportSequence), "utf8").trim(), "4");
  });

  void test("report sequence — a corrupt counter throws and is left as it was", () => {
    const state = freshState();
    mkdirSync(state.dir, { recursive: true });
    const path = join(state.dir, stateFiles.reportSequence);
    for (const corrupt of ["", "seven\n", "-3\n", "1.5\n", "99999999999999999999\n"]) {
      writeFileSync(path, corrupt);
      assert.throws(
        () => state.nextReportSequence(),
        hostStateError(/report counter .* does not hold a count/),
      );
      assert.equal(readFileSync(path, "utf8"), corrupt);
    }
  });

  void test("node keys — created once with 0600 private files and reloaded identical", () => {
    const state = freshState();
    const first = state.nodeKeys();
    assert.equal(modeOf(join(state.dir, stateFiles.signingKey)), 0o600);
    assert.equal(modeOf(join(state.dir, stateFiles.overlayKey)), 0o600);
    assert.match(readFileSync(join(state.dir, stateFiles.signingKey), "utf8"), /BEGIN PRIVATE KEY/);
    const signingFile = readFileSync(join(state.dir, stateFiles.signingKey), "utf8");
    const overlayFile = readFileSync(join(state.dir, stateFiles.overlayKey), "utf8");

    const again = new HostState(state.dir).nodeKeys();
    assert.equal(again.signingPublicKey, first.signingPublicKey);
    assert.equal(again.overlayPublicKey, first.overlayPublicKey);
    assert.equal(readFileSync(join(state.dir, stateFiles.signingKey), "utf8"), signingFile);
    assert.equal(readFileSync(join(state.dir, stateFiles.overlayKey), "utf8"), overlayFile);

    // The reloaded private key is the one whose public half was reported.
    const bytes = Buffer.from("a report");
    assert.ok(
      verify(bytes, sign(bytes, again.signingPrivateKey), decodeSigningPublicKey(first.signingPublicKey)),
    );
    assert.equal(Buffer.from(first.overlayPublicKey, "base64").length, 32);
  });

  void test("node keys — a damaged key file throws rather than being replaced", () => {
    const state = freshState();
    state.nodeKeys();
    const path = join(state.dir, stateFiles.overlayKey);
    writeFileSync(path, "not a key\n", { mode: 0o600 });
    assert.throws(() => state.nodeKeys(), hostStateError(/overlay\.key does not hold a usable key/));
    assert.equal(readFileSync(path, "utf8"), "not a key\n");
  });

  void test("secrets — kept 0600 and read back exactly; unknown ones are undefined", () => {
    const state = freshState();
    assert.equal(state.loadSecret("broker-user.seed"), undefined);
    state.saveSecret("broker-user.seed", "SUAEXAMPLESEED\n");
    assert.equal(state.loadSecret("broker-user.seed"), "SUAEXAMPLESEED\n");
    assert.equal(modeOf(join(state.dir, "broker-user.seed")), 0o600);
  });

  void test("secrets — a name that is a path or a state file is refused", () => {
    const state = freshState();
    for (const name of ["../escape", "a/b", ".hidden", "", stateFiles.identity, stateFiles.reportSequence]) {
      assert.throws(() => state.saveSecret(name, "x"), hostStateError(/cannot name a secret/), name);
    }
  });

  void test("last applied — undefined at first, then what was recorded, across a restart", () => {
    const state = freshState();
    assert.equal(state.lastApplied(), undefined);
    const applied = { epoch: 7, sequence: 3, digest: `sha256:${"ab".repeat(32)}` };
    state.recordApplied(applied);
    assert.deepEqual(new HostState(state.dir).lastApplied(), applied);
    state.recordApplied({ ...applied, sequence: 4 });
    assert.equal(state.lastApplied()?.sequence, 4);
  });

  void test("last applied — read from the file each time: a record changed or broken behind the agent's back is seen", () => {
    const state = freshState();
    const applied = { epoch: 7, sequence: 3, digest: `sha256:${"ab".repeat(32)}` };
    state.recordApplied(applied);
    assert.deepEqual(state.lastApplied(), applied);
    // The same answer again, and not one a caller could change for the next.
    assert.ok(Object.isFrozen(state.lastApplied()));
    const file = join(state.dir, stateFiles.applied);
    writeFileSync(file, `${JSON.stringify({ ...applied, sequence: 9 })}\n`);
    assert.equal(state.lastApplied()?.sequence, 9);
    writeFileSync(file, '{"epoch": 7, "sequence": 0, "digest": "x"}');
    assert.throws(() => state.lastApplied(), hostStateError(/applied\.json is not what it should hold/));
    writeFileSync(file, `${JSON.stringify(applied)}\n`);
    assert.deepEqual(state.lastApplied(), applied);
  });

  void test("last applied — a corrupt record throws naming the file", () => {
    const state = freshState();
    mkdirSync(state.dir, { recursive: true });
    writeFileSync(join(state.dir, stateFiles.applied), '{"epoch": 7, "sequence": 0, "digest": "x"}');
    assert.throws(() => state.lastApplied(), hostStateError(/applied\.json is not what it should hold/));
  });
});
