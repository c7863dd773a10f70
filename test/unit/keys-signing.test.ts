import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { KeyError } from "../../src/errors.js";
import {
  decodeSigningPrivateKey,
  decodeSigningPublicKey,
  encodeSigningPrivateKey,
  encodeSigningPublicKey,
  fingerprint,
  fingerprintsEqual,
  generateSigningKeyPair,
  newSigningKey,
  openSshPublicKey,
  sign,
  signingPrivateKeyFromSeed,
  signingPublicKeyOf,
  verify,
} from "../../src/keys/index.js";

const message = new TextEncoder().encode('{"kind":"declaration","node":"web-1"}');

function flipBit(bytes: Uint8Array, index: number): Uint8Array {
  const copy = new Uint8Array(bytes);
  copy[index] = (copy[index] ?? 0) ^ 0x01;
  return copy;
}

void describe("signing", () => {
  void test("signing — a signature is 64 bytes and verifies with the matching public key", () => {
    const { publicKey, privateKey } = generateSigningKeyPair();
    const signature = sign(message, privateKey);
    assert.equal(signature.length, 64);
    assert.equal(verify(message, signature, publicKey), true);
  });

  void test("signing — a flipped bit in the signed bytes fails verification", () => {
    const { publicKey, privateKey } = generateSigningKeyPair();
    const signature = sign(message, privateKey);
    assert.equal(verify(flipBit(message, 0), signature, publicKey), false);
    assert.equal(verify(flipBit(message, message.length - 1), signature, publicKey), false);
  });

  void test("signing — a flipped bit in the signature fails verification", () => {
    const { publicKey, privateKey } = generateSigningKeyPair();
    const signature = sign(message, privateKey);
    for (const index of [0, 31, 32, 63]) {
      assert.equal(
        verify(message, flipBit(signature, index), publicKey),
        false,
        `bit flipped in byte ${index}`,
      );
    }
  });

  void test("signing — verification with another key fails", () => {
    const signer = generateSigningKeyPair();
    const other = generateSigningKeyPair();
    assert.equal(verify(message, sign(message, signer.privateKey), other.publicKey), false);
  });

  void test("signing — a signature of the wrong length or of random bytes is false, not an exception", () => {
    const { publicKey, privateKey } = generateSigningKeyPair();
    const signature = sign(message, privateKey);
    assert.equal(verify(message, signature.subarray(0, 63), publicKey), false);
    assert.equal(verify(message, new Uint8Array([...signature, 0]), publicKey), false);
    assert.equal(verify(message, new Uint8Array(0), publicKey), false);
    assert.equal(verify(message, new Uint8Array(64), publicKey), false);
    assert.equal(verify(message, randomBytes(64), publicKey), false);
  });

  void test("signing — a key of another algorithm is refused with KeyError", () => {
    const { publicKey, privateKey } = generateKeyPairSync("x25519");
    assert.throws(() => sign(message, privateKey), KeyError);
    assert.throws(() => verify(message, new Uint8Array(64), publicKey), KeyError);
    const ed = generateSigningKeyPair();
    assert.throws(() => sign(message, ed.publicKey), KeyError);
  });

  void test("signing — the public key encodes as base64 of its raw 32 bytes and decodes to the same key", () => {
    const { publicKey, privateKey } = generateSigningKeyPair();
    const encoded = encodeSigningPublicKey(publicKey);
    assert.match(encoded, /^[A-Za-z0-9+/]{43}=$/);
    assert.equal(Buffer.from(encoded, "base64").length, 32);
    const decoded = decodeSigningPublicKey(encoded);
    assert.equal(decoded.equals(publicKey), true);
    assert.equal(verify(message, sign(message, privateKey), decoded), true);
  });

  void test("signing — decoding a public key of the wrong length is refused with a clear KeyError", () => {
    assert.throws(
      () => decodeSigningPublicKey(randomBytes(31).toString("base64")),
      (error: unknown) =>
        error instanceof KeyError && /32 bytes/.test(error.message) && /31 bytes/.test(error.message),
    );
    assert.throws(() => decodeSigningPublicKey(randomBytes(33).toString("base64")), KeyError);
    assert.throws(() => decodeSigningPublicKey(""), KeyError);
  });

  void test("signing — decoding a public key that is not canonical base64 is refused with a clear KeyError", () => {
    const encoded = encodeSigningPublicKey(generateSigningKeyPair().publicKey);
    for (const bad of [
      `${encoded.slice(0, 20)}*${encoded.slice(21)}`,
      encoded.slice(0, -1),
      ` ${encoded}`,
      `${encoded}\n`,
      encoded.replace(/\+/g, "-").replace(/\//g, "_").replace("=", ""),
    ]) {
      assert.throws(
        () => decodeSigningPublicKey(bad),
        (error: unknown) => error instanceof KeyError && /base64/.test(error.message),
        JSON.stringify(bad),
      );
    }
  });

  void test("signing — the private key round-trips through PKCS#8 PEM", () => {
    const { publicKey, privateKey } = generateSigningKeyPair();
    const pem = encodeSigningPrivateKey(privateKey);
    assert.match(pem, /^-----BEGIN PRIVATE KEY-----\n/);
    const loaded = decodeSigningPrivateKey(pem);
    assert.equal(signingPublicKeyOf(loaded).equals(publicKey), true);
    assert.equal(verify(message, sign(message, loaded), publicKey), true);
  });

  void test("signing — a new key's PEM and public half are written as OpenSSL exports them, and read back as the key", () => {
    for (let round = 0; round < 300; round++) {
      const made = newSigningKey();
      assert.equal(made.pem, encodeSigningPrivateKey(made.privateKey));
      assert.equal(made.publicKey, encodeSigningPublicKey(signingPublicKeyOf(made.privateKey)));
      const read = decodeSigningPrivateKey(made.pem);
      const signature = sign(message, read);
      assert.ok(verify(message, signature, decodeSigningPublicKey(made.publicKey)));
    }
  });

  void test("signing — a PEM that is not an Ed25519 private key is refused with KeyError", () => {
    assert.throws(() => decodeSigningPrivateKey("not a key"), KeyError);
    const x25519 = generateKeyPairSync("x25519").privateKey.export({ type: "pkcs8", format: "pem" });
    assert.throws(() => decodeSigningPrivateKey(x25519.toString()), /Ed25519/);
  });
});

void describe("fingerprint", () => {
  const scratch = mkdtempSync(join(tmpdir(), "mesh-keys-fingerprint-"));
  after(() => rmSync(scratch, { recursive: true, force: true }));

  function sshKeygenFingerprint(file: string): string {
    const output = execFileSync("ssh-keygen", ["-lf", file], { encoding: "utf8" });
    const printed = output.split(" ")[1];
    assert.ok(printed, `unexpected ssh-keygen output: ${output}`);
    return printed;
  }

  void test("fingerprint — has the form SHA256: and 43 unpadded base64 characters", () => {
    const printed = fingerprint(generateSigningKeyPair().publicKey);
    assert.match(printed, /^SHA256:[A-Za-z0-9+/]{43}$/);
  });

  void test("fingerprint — the KeyObject and its raw base64 give the same fingerprint", () => {
    const { publicKey } = generateSigningKeyPair();
    assert.equal(fingerprint(publicKey), fingerprint(encodeSigningPublicKey(publicKey)));
  });

  void test("fingerprint — agrees with ssh-keygen -lf for our keys", () => {
    for (let round = 0; round < 5; round += 1) {
      const { publicKey } = generateSigningKeyPair();
      const file = join(scratch, `ours-${round}.pub`);
      writeFileSync(file, `${openSshPublicKey(publicKey, "web-1")}\n`);
      assert.equal(sshKeygenFingerprint(file), fingerprint(publicKey));
    }
  });

  void test("fingerprint — agrees with ssh-keygen for a key ssh-keygen generated", () => {
    const file = join(scratch, "theirs");
    execFileSync("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", "node", "-f", file]);
    const line = readFileSync(`${file}.pub`, "utf8").trim();
    const [type, blob] = line.split(" ");
    assert.equal(type, "ssh-ed25519");
    assert.ok(blob);
    // The blob ends with the raw 32-byte key, so reading it back must rebuild the same line.
    const raw = Buffer.from(blob, "base64").subarray(-32).toString("base64");
    assert.equal(openSshPublicKey(raw, "node"), line);
    assert.equal(fingerprint(raw), sshKeygenFingerprint(`${file}.pub`));
  });

  void test("fingerprint — different keys have different fingerprints", () => {
    const a = fingerprint(generateSigningKeyPair().publicKey);
    const b = fingerprint(generateSigningKeyPair().publicKey);
    assert.notEqual(a, b);
  });

  void test("fingerprint — fingerprintsEqual compares whole values, whatever their lengths", () => {
    const printed = fingerprint(generateSigningKeyPair().publicKey);
    assert.equal(fingerprintsEqual(printed, `${printed}`), true);
    assert.equal(fingerprintsEqual(printed, fingerprint(generateSigningKeyPair().publicKey)), false);
    assert.equal(fingerprintsEqual(printed, printed.slice(0, -1)), false);
    assert.equal(fingerprintsEqual(printed, ""), false);
  });

  void test("fingerprint — an invalid raw key is refused with KeyError", () => {
    assert.throws(() => fingerprint("AAAA"), KeyError);
  });
});

void describe("signing key from a seed", () => {
  void test("seed — the key made from 32 bytes is the one PKCS#8 makes from them: same public half, same signatures", () => {
    for (let round = 0; round < 20; round++) {
      const seed = randomBytes(32);
      const fromSeed = signingPrivateKeyFromSeed(seed);
      const pkcs8 = createPrivateKey({
        key: Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), seed]),
        format: "der",
        type: "pkcs8",
      });
      const publicJwk = createPublicKey(fromSeed).export({ format: "jwk" });
      assert.equal(publicJwk.x, createPublicKey(pkcs8).export({ format: "jwk" }).x);
      assert.notEqual(
        publicJwk.x,
        Buffer.alloc(32).toString("base64url"),
        "the public half is derived, not taken",
      );
      // Ed25519 is deterministic: the same key signs the same bytes the same way.
      assert.deepEqual(sign(message, fromSeed), sign(message, pkcs8));
      assert.equal(verify(message, sign(message, fromSeed), createPublicKey(pkcs8)), true);
    }
  });

  void test("seed — anything but 32 bytes is refused with KeyError", () => {
    assert.throws(() => signingPrivateKeyFromSeed(randomBytes(31)), KeyError);
    assert.throws(() => signingPrivateKeyFromSeed(randomBytes(64)), KeyError);
    assert.throws(() => signingPrivateKeyFromSeed(new Uint8Array()), KeyError);
  });
});
