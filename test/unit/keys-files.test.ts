import assert from "node:assert/strict";
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { KeyError } from "../../src/errors.js";
import {
  decodeSigningPrivateKey,
  encodeSigningPublicKey,
  fingerprint,
  generateSigningKeyPair,
  loadOrCreateSigningKey,
  readPrivateFile,
  sign,
  signingKeyFile,
  signingPublicKeyFile,
  verify,
  writePrivateFile,
} from "../../src/keys/index.js";

const scratch = mkdtempSync(join(tmpdir(), "mesh-keys-files-"));
let counter = 0;
after(() => rmSync(scratch, { recursive: true, force: true }));

function freshDir(): string {
  counter += 1;
  const dir = join(scratch, `case-${counter}`);
  mkdirSync(dir);
  return dir;
}

function modeOf(path: string): number {
  return statSync(path).mode & 0o777;
}

function withUmask<T>(mask: number, action: () => T): T {
  const previous = process.umask(mask);
  try {
    return action();
  } finally {
    process.umask(previous);
  }
}

function refusedWith(pattern: RegExp) {
  return (error: unknown) => error instanceof KeyError && pattern.test(error.message);
}

void describe("private key files", () => {
  void test("files — a private file is written with mode 0600 and reads back", () => {
    const path = join(freshDir(), "overlay.key");
    writePrivateFile(path, "secret\n");
    assert.equal(modeOf(path), 0o600);
    assert.equal(readPrivateFile(path), "secret\n");
  });

  void test("files — the mode is 0600 even when the umask would allow more", () => {
    const path = join(freshDir(), "overlay.key");
    withUmask(0, () => writePrivateFile(path, "secret"));
    assert.equal(modeOf(path), 0o600);
  });

  void test("files — replacing an open 0644 file leaves a 0600 file and no temporary files", () => {
    const dir = freshDir();
    const path = join(dir, "overlay.key");
    writeFileSync(path, "old");
    chmodSync(path, 0o644);
    writePrivateFile(path, new TextEncoder().encode("new"));
    assert.equal(modeOf(path), 0o600);
    assert.equal(readPrivateFile(path), "new");
    assert.deepEqual(readdirSync(dir), ["overlay.key"]);
  });

  void test("files — a write into a missing directory fails with KeyError and its cause", () => {
    const path = join(scratch, "no-such-dir", "overlay.key");
    assert.throws(
      () => writePrivateFile(path, "secret"),
      (error: unknown) =>
        error instanceof KeyError && error.message.includes(path) && error.cause instanceof Error,
    );
  });

  void test("files — a key file readable by group or others is refused with how to fix it", () => {
    const dir = freshDir();
    for (const mode of [0o644, 0o640, 0o604, 0o620]) {
      const path = join(dir, `loose-${mode.toString(8)}.key`);
      writeFileSync(path, "secret");
      chmodSync(path, mode);
      assert.throws(
        () => readPrivateFile(path),
        refusedWith(
          new RegExp(`mode 0${mode.toString(8)}.*chmod 600 ${path.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`),
        ),
        `mode ${mode.toString(8)}`,
      );
    }
  });

  void test("files — a 0400 key file is accepted", () => {
    const path = join(freshDir(), "readonly.key");
    writeFileSync(path, "secret");
    chmodSync(path, 0o400);
    assert.equal(readPrivateFile(path), "secret");
  });

  void test("files — a missing key file or a directory is refused with KeyError", () => {
    const dir = freshDir();
    assert.throws(() => readPrivateFile(join(dir, "absent.key")), refusedWith(/could not open/));
    chmodSync(dir, 0o700);
    assert.throws(() => readPrivateFile(dir), refusedWith(/not a regular file/));
  });
});

void describe("signing key directory", () => {
  void test("files — the first load creates signing.key (0600) and signing.pub in a new 0700 directory", () => {
    const dir = join(freshDir(), "keys");
    const key = loadOrCreateSigningKey(dir);
    assert.equal(modeOf(dir), 0o700);
    assert.equal(modeOf(join(dir, signingKeyFile)), 0o600);
    assert.equal(
      readFileSync(join(dir, signingPublicKeyFile), "utf8").trim(),
      encodeSigningPublicKey(key.publicKey),
    );
    assert.equal(key.fingerprint, fingerprint(key.publicKey));
    assert.match(key.fingerprint, /^SHA256:[A-Za-z0-9+/]{43}$/);
    const stored = decodeSigningPrivateKey(readPrivateFile(join(dir, signingKeyFile)));
    assert.equal(stored.equals(key.privateKey), true);
  });

  void test("files — a second load returns the same key", () => {
    const dir = freshDir();
    const first = loadOrCreateSigningKey(dir);
    const second = loadOrCreateSigningKey(dir);
    assert.equal(second.fingerprint, first.fingerprint);
    assert.equal(second.publicKey.equals(first.publicKey), true);
    assert.equal(second.privateKey.equals(first.privateKey), true);
    const bytes = new TextEncoder().encode("declaration");
    assert.equal(verify(bytes, sign(bytes, second.privateKey), first.publicKey), true);
  });

  void test("files — a missing signing.pub is written again from the private key", () => {
    const dir = freshDir();
    const first = loadOrCreateSigningKey(dir);
    rmSync(join(dir, signingPublicKeyFile));
    const second = loadOrCreateSigningKey(dir);
    assert.equal(second.fingerprint, first.fingerprint);
    assert.equal(
      readFileSync(join(dir, signingPublicKeyFile), "utf8").trim(),
      encodeSigningPublicKey(first.publicKey),
    );
  });

  void test("files — a signing.pub naming another key is refused", () => {
    const dir = freshDir();
    loadOrCreateSigningKey(dir);
    writeFileSync(
      join(dir, signingPublicKeyFile),
      encodeSigningPublicKey(generateSigningKeyPair().publicKey),
    );
    assert.throws(() => loadOrCreateSigningKey(dir), refusedWith(/does not match the private key/));
  });

  void test("files — a 0644 signing.key is refused, not replaced", () => {
    const dir = freshDir();
    const first = loadOrCreateSigningKey(dir);
    const keyPath = join(dir, signingKeyFile);
    chmodSync(keyPath, 0o644);
    assert.throws(() => loadOrCreateSigningKey(dir), refusedWith(/chmod 600/));
    chmodSync(keyPath, 0o600);
    assert.equal(loadOrCreateSigningKey(dir).fingerprint, first.fingerprint);
  });

  void test("files — a signing.key that is not an Ed25519 key is refused", () => {
    const dir = freshDir();
    writePrivateFile(
      join(dir, signingKeyFile),
      "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    );
    assert.throws(() => loadOrCreateSigningKey(dir), refusedWith(/does not hold an Ed25519 private key/));
  });
});
