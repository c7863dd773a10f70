import {
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  sign as signWithKey,
  verify as verifyWithKey,
} from "node:crypto";
import type { JsonWebKey, KeyObject } from "node:crypto";
import { KeyError } from "../errors.js";
import { decodeKeyBase64 } from "./base64.js";

/** Length in bytes of a raw Ed25519 public key. */
export const signingPublicKeyLength = 32;
/** Length in bytes of an Ed25519 signature. */
export const signatureLength = 64;

/** An Ed25519 key pair: the private half signs declarations, the public half is pinned by those who check them. */
export interface SigningKeyPair {
  publicKey: KeyObject;
  privateKey: KeyObject;
}

/** node:crypto takes JWK as a key generation's encoding (as `keyObject.export` does); @types/node does not list it. */
const generateAsJwk = generateKeyPairSync as unknown as (
  type: "ed25519" | "x25519",
  options: { privateKeyEncoding: { format: "jwk" }; publicKeyEncoding: { format: "jwk" } },
) => { privateKey: JsonWebKey; publicKey: JsonWebKey };

/**
 * A fresh Ed25519 key pair as the raw halves of its JWK form: `d` the 32-byte seed, `x` the public key, base64url.
 *
 * Never a key object that `generateKeyPair(Sync)` returns: Node 20 shares a lock between such a key and the job that
 * made it, holds the lock while an export builds its JavaScript strings, and the job's destructor takes the same
 * lock. A garbage collection in that window (the job is garbage as soon as the call returns) freezes the thread for
 * good. Exported inside the job instead, the key has no such twin; a key object is made from this by import.
 */
export function ed25519PairAsJwk(): { d: string; x: string } {
  return pairAsJwk("ed25519");
}

/**
 * A fresh X25519 key pair, as {@link ed25519PairAsJwk} makes an Ed25519 one and for the same reason. Asked for with
 * DER encodings instead, a pair costs three times as much.
 */
export function x25519PairAsJwk(): { d: string; x: string } {
  return pairAsJwk("x25519");
}

function pairAsJwk(type: "ed25519" | "x25519"): { d: string; x: string } {
  const { privateKey } = generateAsJwk(type, {
    privateKeyEncoding: { format: "jwk" },
    publicKeyEncoding: { format: "jwk" },
  });
  const { d, x } = privateKey;
  if (typeof d !== "string" || typeof x !== "string")
    throw new KeyError(`node:crypto gave no ${type} key pair`);
  return { d, x };
}

/** Generates a fresh Ed25519 key pair, imported from its JWK form ({@link ed25519PairAsJwk} says why). */
export function generateSigningKeyPair(): SigningKeyPair {
  const { privateKey } = newSigningKey();
  return { publicKey: createPublicKey(privateKey), privateKey };
}

/** The DER of an Ed25519 PKCS#8 private key is this fixed header (algorithm OID 1.3.101.112) and the 32-byte seed. */
const ed25519Pkcs8Header = Buffer.from("302e020100300506032b657004220420", "hex");

/**
 * A fresh signing key as a node keeps and sends it: the key object, its PKCS#8 PEM (as
 * {@link encodeSigningPrivateKey} writes it) and its public half (as {@link encodeSigningPublicKey} writes it). Both
 * texts are written from the raw halves the key was made as, not exported again through OpenSSL: the PEM export
 * alone costs more than making the key.
 */
export function newSigningKey(): { privateKey: KeyObject; pem: string; publicKey: string } {
  const { d, x } = ed25519PairAsJwk();
  const privateKey = createPrivateKey({ key: { kty: "OKP", crv: "Ed25519", d, x }, format: "jwk" });
  const der = Buffer.concat([ed25519Pkcs8Header, Buffer.from(d, "base64url")]);
  // 48 bytes of DER are 64 characters of base64: one line, as OpenSSL writes it.
  const pem = `-----BEGIN PRIVATE KEY-----\n${der.toString("base64")}\n-----END PRIVATE KEY-----\n`;
  return { privateKey, pem, publicKey: Buffer.from(x, "base64url").toString("base64") };
}

/** The public half of an Ed25519 private key. */
export function signingPublicKeyOf(privateKey: KeyObject): KeyObject {
  requireEd25519(privateKey, "private");
  return createPublicKey(privateKey);
}

/** Signs `bytes` exactly as given and returns the 64-byte Ed25519 signature. */
export function sign(bytes: Uint8Array, privateKey: KeyObject): Uint8Array {
  requireEd25519(privateKey, "private");
  // Ed25519 hashes internally, so no digest algorithm is named; a copy keeps callers off Node's shared buffer pool.
  return new Uint8Array(signWithKey(null, bytes, privateKey));
}

/** Signs as {@link sign} does, on the thread pool: many signatures at once use every core. */
export function signOffThread(bytes: Uint8Array, privateKey: KeyObject): Promise<Uint8Array> {
  requireEd25519(privateKey, "private");
  return new Promise((resolve, reject) => {
    signWithKey(null, bytes, privateKey, (error, signature) => {
      if (error === null) resolve(new Uint8Array(signature));
      else reject(error);
    });
  });
}

/**
 * Whether `signature` is a valid Ed25519 signature of `bytes` by `publicKey`.
 *
 * Any wrong signature — wrong length, random bytes, another key's — is answered `false`, never an exception, so a
 * caller has one refusal path for all of them. Passing a key that is not an Ed25519 public key is a programming
 * error and does throw.
 */
export function verify(bytes: Uint8Array, signature: Uint8Array, publicKey: KeyObject): boolean {
  requireEd25519(publicKey, "public");
  if (signature.length !== signatureLength) return false;
  return verifyWithKey(null, bytes, publicKey, signature);
}

/** Checks as {@link verify} does, on the thread pool. */
export function verifyOffThread(
  bytes: Uint8Array,
  signature: Uint8Array,
  publicKey: KeyObject,
): Promise<boolean> {
  requireEd25519(publicKey, "public");
  if (signature.length !== signatureLength) return Promise.resolve(false);
  return new Promise((resolve, reject) => {
    verifyWithKey(null, bytes, publicKey, signature, (error, valid) => {
      if (error === null) resolve(valid);
      else reject(error);
    });
  });
}

/**
 * The raw 32 bytes of an Ed25519 public key. Read from the key's JWK form (its `x`): the SubjectPublicKeyInfo export
 * goes through OpenSSL's encoders and costs some forty times as much.
 */
export function rawSigningPublicKey(publicKey: KeyObject): Uint8Array {
  requireEd25519(publicKey, "public");
  const { x } = publicKey.export({ format: "jwk" });
  const raw = typeof x === "string" ? Buffer.from(x, "base64url") : undefined;
  if (raw?.length !== signingPublicKeyLength) {
    throw new KeyError("Ed25519 public key exported without its 32 raw bytes");
  }
  return new Uint8Array(raw);
}

/**
 * Keys already encoded: a KeyObject never changes, and the control plane encodes its own in every enrolment's answer
 * (an export through OpenSSL, a tenth of a millisecond each).
 */
const encodedPublicKeys = new WeakMap<KeyObject, string>();

/**
 * The public key as base64 of its raw 32 bytes: the form sent at enrolment, stored and pinned.
 * The raw form is what SSH, WireGuard and most tools print, and it has no encoding choices left to disagree on.
 */
export function encodeSigningPublicKey(publicKey: KeyObject): string {
  let encoded = encodedPublicKeys.get(publicKey);
  if (encoded === undefined) {
    encoded = Buffer.from(rawSigningPublicKey(publicKey)).toString("base64");
    encodedPublicKeys.set(publicKey, encoded);
  }
  return encoded;
}

/**
 * Public keys already decoded, by their text: the same text gives the same (immutable) KeyObject, so what is worked
 * out once per key (its fingerprint) is worked out once for the many nodes of one process that pin the same key.
 */
const decodedPublicKeys = new Map<string, KeyObject>();
const decodedKeysKept = 64;

/**
 * Reads a public key written by {@link encodeSigningPublicKey}.
 * @throws KeyError when the text is not canonical base64 or does not hold exactly 32 bytes.
 */
export function decodeSigningPublicKey(base64: string): KeyObject {
  let key = decodedPublicKeys.get(base64);
  if (key === undefined) {
    key = signingPublicKeyFromRaw(
      decodeKeyBase64(base64, signingPublicKeyLength, "Ed25519 signing public key"),
    );
    if (decodedPublicKeys.size >= decodedKeysKept)
      decodedPublicKeys.delete(decodedPublicKeys.keys().next().value as string);
    decodedPublicKeys.set(base64, key);
  }
  return key;
}

/** An Ed25519 public key from its raw 32 bytes. */
export function signingPublicKeyFromRaw(raw: Uint8Array): KeyObject {
  if (raw.length !== signingPublicKeyLength) {
    throw new KeyError(
      `Ed25519 signing public key must be ${signingPublicKeyLength} bytes, got ${raw.length}`,
    );
  }
  try {
    // As a JWK: the same key as from SubjectPublicKeyInfo DER, at a tenth of the cost (no OpenSSL decoder lookup).
    const x = Buffer.from(raw).toString("base64url");
    return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" });
  } catch (error) {
    throw new KeyError("Ed25519 signing public key could not be loaded", { cause: error });
  }
}

/** The private key as PKCS#8 PEM, the form kept on disk. */
export function encodeSigningPrivateKey(privateKey: KeyObject): string {
  requireEd25519(privateKey, "private");
  // Node's typing allows a Buffer here even though PEM export yields text.
  const pem = privateKey.export({ type: "pkcs8", format: "pem" });
  return typeof pem === "string" ? pem : pem.toString("utf8");
}

/**
 * Reads a PKCS#8 PEM private key and checks that it is Ed25519.
 * @throws KeyError when the PEM does not parse or holds another kind of key.
 */
export function decodeSigningPrivateKey(pem: string): KeyObject {
  let privateKey: KeyObject;
  try {
    privateKey = createPrivateKey({ key: pem, format: "pem" });
  } catch (error) {
    throw new KeyError("signing private key is not a readable PKCS#8 PEM key", { cause: error });
  }
  requireEd25519(privateKey, "private");
  return privateKey;
}

export function requireEd25519(key: KeyObject, type: "public" | "private"): void {
  if (key.type !== type || key.asymmetricKeyType !== "ed25519") {
    throw new KeyError(
      `expected an Ed25519 ${type} key, got a ${key.asymmetricKeyType ?? "symmetric"} ${key.type} key`,
    );
  }
}

/**
 * An Ed25519 private key from its 32-byte seed (the form other key formats, such as NATS nkeys, keep). Imported as a
 * JWK, which hands the seed to OpenSSL as a raw private key: ~70 µs, where PKCS#8 DER goes through OpenSSL's
 * decoders (350–800 µs here, at every node's join). Node asks that the JWK name its public half `x` but makes the
 * key from `d` alone and derives the public half from it, so `x` is given as zeros: a test pins that the key made
 * so is the one PKCS#8 gives, with the right public half.
 */
export function signingPrivateKeyFromSeed(seed: Uint8Array): KeyObject {
  if (seed.length !== 32) throw new KeyError(`an Ed25519 seed is 32 bytes, got ${seed.length}`);
  return createPrivateKey({
    key: { kty: "OKP", crv: "Ed25519", d: Buffer.from(seed).toString("base64url"), x: zeroPublicHalf },
    format: "jwk",
  });
}

/** A placeholder for the public half a JWK must name (see `signingPrivateKeyFromSeed`). */
const zeroPublicHalf = Buffer.alloc(signingPublicKeyLength).toString("base64url");
