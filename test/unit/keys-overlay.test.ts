import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { describe, test } from "node:test";
import { KeyError } from "../../src/errors.js";
import { generateOverlayKeyPair, overlayPublicKeyOf } from "../../src/keys/index.js";

function hexToBase64(hex: string): string {
  return Buffer.from(hex, "hex").toString("base64");
}

void describe("overlay keys", () => {
  void test("overlay — RFC 7748 §6.1 vectors: each private key gives its public key", () => {
    const vectors = [
      {
        privateKey: "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        publicKey: "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a",
      },
      {
        privateKey: "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb",
        publicKey: "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f",
      },
    ];
    for (const vector of vectors) {
      assert.equal(overlayPublicKeyOf(hexToBase64(vector.privateKey)), hexToBase64(vector.publicKey));
    }
  });

  void test("overlay — generated keys are 44-character base64 of 32 bytes", () => {
    const pair = generateOverlayKeyPair();
    for (const key of [pair.privateKey, pair.publicKey]) {
      assert.equal(key.length, 44);
      assert.match(key, /^[A-Za-z0-9+/]{43}=$/);
      assert.equal(Buffer.from(key, "base64").length, 32);
    }
  });

  void test("overlay — the generated public key derives from the generated private key", () => {
    for (let round = 0; round < 5; round += 1) {
      const pair = generateOverlayKeyPair();
      assert.equal(overlayPublicKeyOf(pair.privateKey), pair.publicKey);
    }
  });

  void test("overlay — WireGuard's own `wg pubkey` gives each generated private key the public key generated with it", () => {
    for (let round = 0; round < 20; round++) {
      const pair = generateOverlayKeyPair();
      const fromWg = execFileSync("wg", ["pubkey"], {
        input: `${pair.privateKey}\n`,
        encoding: "utf8",
      }).trim();
      assert.equal(fromWg, pair.publicKey);
    }
  });

  void test("overlay — generated private keys are stored clamped, as WireGuard writes them", () => {
    for (let round = 0; round < 5; round += 1) {
      const raw = Buffer.from(generateOverlayKeyPair().privateKey, "base64");
      assert.equal((raw[0] ?? 0xff) & 0b111, 0);
      assert.equal((raw[31] ?? 0) & 0b1100_0000, 0b0100_0000);
    }
  });

  void test("overlay — an unclamped private key gives the same public key as its clamped form", () => {
    const raw = randomBytes(32);
    const clamped = Buffer.from(raw);
    clamped[0] = (clamped[0] ?? 0) & 248;
    clamped[31] = ((clamped[31] ?? 0) & 127) | 64;
    assert.equal(overlayPublicKeyOf(raw.toString("base64")), overlayPublicKeyOf(clamped.toString("base64")));
  });

  void test("overlay — two generated pairs differ", () => {
    const a = generateOverlayKeyPair();
    const b = generateOverlayKeyPair();
    assert.notEqual(a.privateKey, b.privateKey);
    assert.notEqual(a.publicKey, b.publicKey);
  });

  void test("overlay — a private key of the wrong length or not base64 is refused with KeyError", () => {
    assert.throws(
      () => overlayPublicKeyOf(randomBytes(16).toString("base64")),
      (error: unknown) => error instanceof KeyError && /32 bytes/.test(error.message),
    );
    assert.throws(
      () => overlayPublicKeyOf("not a key at all"),
      (error: unknown) => error instanceof KeyError && /base64/.test(error.message),
    );
  });

  void test("overlay — a refusal never echoes the private key", () => {
    const secret = randomBytes(31).toString("base64");
    assert.throws(
      () => overlayPublicKeyOf(secret),
      (error: unknown) => error instanceof KeyError && !error.message.includes(secret),
    );
  });
});
