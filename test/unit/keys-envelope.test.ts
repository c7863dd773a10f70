import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { KeyError } from "../../src/errors.js";
import {
  fingerprint,
  generateSigningKeyPair,
  openDeclaration,
  openDeclarationOffThread,
  sealDeclaration,
  sealDeclarationTextsOffThread,
  sign,
} from "../../src/keys/index.js";
import { envelopeWrapping, parseDeclarationEnvelope } from "../../src/link/index.js";

const declaration = {
  kind: "declaration",
  node: "web-1",
  epoch: 0,
  sequence: 1,
  items: [
    { kind: "service", name: "nginx", state: "running" },
    { kind: "file", path: "/etc/motd", content: "hello" },
  ],
};

const controlPlane = generateSigningKeyPair();
const controlPlaneFingerprint = fingerprint(controlPlane.publicKey);
const encoder = new TextEncoder();
const decoder = new TextDecoder();

function sealed(bytes: Uint8Array) {
  return sealDeclaration(bytes, controlPlane.privateKey, controlPlaneFingerprint);
}

function base64(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString("base64");
}

function refusedWith(pattern: RegExp) {
  return (error: unknown) => error instanceof KeyError && pattern.test(error.message);
}

function reversedKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reversedKeys);
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value)
        .reverse()
        .map(([key, inner]) => [key, reversedKeys(inner)]),
    );
  }
  return value;
}

void describe("declaration envelope", () => {
  void test("envelope — sealing carries the exact bytes, a 64-byte signature and the signer's fingerprint", () => {
    const bytes = encoder.encode(JSON.stringify(declaration));
    const envelope = sealed(bytes);
    assert.equal(envelope.kind, "declaration_envelope");
    assert.deepEqual(new Uint8Array(Buffer.from(envelope.payload, "base64")), bytes);
    assert.equal(Buffer.from(envelope.signature, "base64").length, 64);
    assert.equal(envelope.signer, controlPlaneFingerprint);
  });

  void test("envelope — the original bytes open and come back byte-identical", () => {
    const bytes = encoder.encode(JSON.stringify(declaration));
    const opened = openDeclaration(sealed(bytes), controlPlane.publicKey);
    assert.ok(opened instanceof Uint8Array);
    assert.deepEqual(opened, bytes);
    assert.deepEqual(JSON.parse(decoder.decode(opened)), declaration);
  });

  void test("envelope — bytes of any shape, including spacing and non-ASCII text, come back byte-identical", () => {
    const bytes = encoder.encode(`{ "node" : "wéb-1",\n\t"items":[] }  `);
    assert.deepEqual(openDeclaration(sealed(bytes), controlPlane.publicKey), bytes);
  });

  void test("envelope — the same declaration re-encoded with a different key order is refused", () => {
    const original = encoder.encode(JSON.stringify(declaration));
    const envelope = sealed(original);
    const reordered = encoder.encode(JSON.stringify(reversedKeys(declaration)));
    assert.notDeepEqual(reordered, original);
    assert.deepEqual(JSON.parse(decoder.decode(reordered)), declaration, "same meaning");
    assert.throws(
      () => openDeclaration({ ...envelope, payload: base64(reordered) }, controlPlane.publicKey),
      refusedWith(/^declaration signature does not verify against the pinned signing key$/),
    );
  });

  void test("envelope — the same declaration re-encoded with different spacing is refused", () => {
    const original = encoder.encode(JSON.stringify(declaration));
    const envelope = sealed(original);
    const spaced = encoder.encode(JSON.stringify(declaration, null, 2));
    assert.deepEqual(JSON.parse(decoder.decode(spaced)), declaration, "same meaning");
    assert.throws(
      () => openDeclaration({ ...envelope, payload: base64(spaced) }, controlPlane.publicKey),
      refusedWith(/does not verify against the pinned signing key/),
    );
  });

  void test("envelope — parsing and re-encoding before verifying is refused even when the text looks alike", () => {
    // Bytes as another encoder might write them: same meaning, but `1.0` and an escaped slash do not survive a
    // parse and stringify round trip.
    const original = encoder.encode(
      '{"kind":"declaration","node":"web-1","epoch":0,"sequence":1.0,"path":"\\/etc"}',
    );
    const envelope = sealed(original);
    const reencoded = encoder.encode(JSON.stringify(JSON.parse(decoder.decode(original))));
    assert.notDeepEqual(reencoded, original);
    assert.throws(
      () => openDeclaration({ ...envelope, payload: base64(reencoded) }, controlPlane.publicKey),
      refusedWith(/does not verify/),
    );
    assert.deepEqual(openDeclaration(envelope, controlPlane.publicKey), original);
  });

  void test("envelope — an envelope signed by another key that claims the pinned key's fingerprint is refused", () => {
    const intruder = generateSigningKeyPair();
    const bytes = encoder.encode(JSON.stringify(declaration));
    const forged = {
      kind: "declaration_envelope" as const,
      payload: base64(bytes),
      signature: base64(sign(bytes, intruder.privateKey)),
      signer: controlPlaneFingerprint,
    };
    assert.throws(
      () => openDeclaration(forged, controlPlane.publicKey),
      refusedWith(/does not verify against the pinned signing key/),
    );
  });

  void test("envelope — an envelope honestly signed by another key is refused", () => {
    const other = generateSigningKeyPair();
    const bytes = encoder.encode(JSON.stringify(declaration));
    const envelope = sealDeclaration(bytes, other.privateKey, fingerprint(other.publicKey));
    assert.throws(() => openDeclaration(envelope, controlPlane.publicKey), KeyError);
  });

  void test("envelope — a signer field that is not the pinned key's fingerprint is refused", () => {
    const bytes = encoder.encode(JSON.stringify(declaration));
    const envelope = sealed(bytes);
    const otherFingerprint = fingerprint(generateSigningKeyPair().publicKey);
    for (const signer of [otherFingerprint, "", controlPlaneFingerprint.toLowerCase()]) {
      assert.throws(
        () => openDeclaration({ ...envelope, signer }, controlPlane.publicKey),
        refusedWith(/is not the pinned signing key/),
        signer,
      );
    }
  });

  void test("envelope — a tampered or malformed signature is refused", () => {
    const bytes = encoder.encode(JSON.stringify(declaration));
    const envelope = sealed(bytes);
    const signature = Buffer.from(envelope.signature, "base64");
    signature[10] = (signature[10] ?? 0) ^ 0x80;
    for (const bad of [signature.toString("base64"), signature.subarray(0, 32).toString("base64"), ""]) {
      assert.throws(
        () => openDeclaration({ ...envelope, signature: bad }, controlPlane.publicKey),
        refusedWith(/does not verify/),
      );
    }
    assert.throws(
      () => openDeclaration({ ...envelope, signature: "not base64!" }, controlPlane.publicKey),
      refusedWith(/signature is not valid base64/),
    );
  });

  void test("envelope — a payload that is not canonical base64 is refused", () => {
    const envelope = sealed(encoder.encode(JSON.stringify(declaration)));
    assert.throws(
      () => openDeclaration({ ...envelope, payload: `${envelope.payload}\n` }, controlPlane.publicKey),
      refusedWith(/payload is not valid base64/),
    );
  });

  void test("envelope — sealing with a signer that is not the key's own fingerprint is refused, after good seals too", () => {
    const other = fingerprint(generateSigningKeyPair().publicKey);
    sealDeclaration(encoder.encode("{}"), controlPlane.privateKey, controlPlaneFingerprint);
    assert.throws(
      () => sealDeclaration(encoder.encode("{}"), controlPlane.privateKey, other),
      refusedWith(/is not the fingerprint of the signing key/),
    );
    const again = sealDeclaration(encoder.encode("{}"), controlPlane.privateKey, controlPlaneFingerprint);
    assert.equal(again.signer, controlPlaneFingerprint);
  });

  void test("envelope — sealed and opened on the thread pool as on the caller's thread, with the same refusals", async () => {
    const bytes = encoder.encode(JSON.stringify(declaration));
    const sealedTexts = await sealDeclarationTextsOffThread(
      [bytes],
      controlPlane.privateKey,
      controlPlaneFingerprint,
      envelopeWrapping(controlPlaneFingerprint),
    );
    const envelope = parseDeclarationEnvelope(JSON.parse(new TextDecoder().decode(sealedTexts.envelopes[0])));
    // Ed25519 is deterministic: the same key over the same bytes gives the same signature on either path.
    assert.deepEqual(envelope, sealed(bytes));
    assert.deepEqual(await openDeclarationOffThread(envelope, controlPlane.publicKey), bytes);

    const other = generateSigningKeyPair();
    const forged = base64(sign(bytes, other.privateKey));
    const flipped = Buffer.from(envelope.signature, "base64");
    flipped[0] = (flipped[0] ?? 0) ^ 1;
    for (const signature of [forged, base64(flipped), base64(new Uint8Array(63))]) {
      await assert.rejects(
        openDeclarationOffThread({ ...envelope, signature }, controlPlane.publicKey),
        refusedWith(/does not verify/),
      );
    }
    const tampered = encoder.encode(JSON.stringify({ ...declaration, sequence: 2 }));
    await assert.rejects(
      openDeclarationOffThread({ ...envelope, payload: base64(tampered) }, controlPlane.publicKey),
      refusedWith(/does not verify/),
    );
    await assert.rejects(
      openDeclarationOffThread(envelope, other.publicKey),
      refusedWith(/is not the pinned signing key/),
    );
    await assert.rejects(
      sealDeclarationTextsOffThread(
        [bytes],
        controlPlane.privateKey,
        fingerprint(other.publicKey),
        envelopeWrapping(fingerprint(other.publicKey)),
      ),
      refusedWith(/is not the fingerprint of the signing key/),
    );
  });
});
