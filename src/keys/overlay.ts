import { createPrivateKey, createPublicKey } from "node:crypto";
import { KeyError } from "../errors.js";
import { decodeKeyBase64 } from "./base64.js";
import { x25519PairAsJwk } from "./signing.js";

/** Length in bytes of a raw X25519 key, private or public. */
export const overlayKeyLength = 32;

// X25519 PKCS#8 and SubjectPublicKeyInfo DER are fixed headers (algorithm OID 1.3.101.110) followed by the raw 32
// bytes. A public key is worked out in DER: a JWK export from a key object can freeze the thread on Node 20 (see
// ed25519PairAsJwk).
const pkcs8Header = Buffer.from("302e020100300506032b656e04220420", "hex");
const spkiHeader = Buffer.from("302a300506032b656e032100", "hex");

/**
 * An overlay (WireGuard) key pair, each half as base64 of its raw 32 bytes (44 characters) — the form `wg genkey`
 * and `wg pubkey` use, so the keys can be written into a WireGuard configuration as they are.
 */
export interface OverlayKeyPair {
  privateKey: string;
  publicKey: string;
}

/** Generates a fresh X25519 key pair in WireGuard format. */
export function generateOverlayKeyPair(): OverlayKeyPair {
  // Made with JWK as the job's own encoding: its raw halves come straight out, and no key object is made.
  const { d, x } = x25519PairAsJwk();
  const privateRaw = rawKey(d, "X25519 private key");
  // WireGuard stores private keys clamped (as `wg genkey` does). X25519 clamps before use anyway, so this changes
  // no public key; it only makes the stored form the one WireGuard itself would write.
  clamp(privateRaw);
  return {
    privateKey: privateRaw.toString("base64"),
    publicKey: rawKey(x, "X25519 public key").toString("base64"),
  };
}

/** The 32 raw bytes of a JWK's base64url key half. */
function rawKey(base64url: string, what: string): Buffer {
  const raw = Buffer.from(base64url, "base64url");
  if (raw.length !== overlayKeyLength) throw new KeyError(`${what} came out as ${raw.length} bytes, not 32`);
  return raw;
}

/**
 * The public overlay key of a private one, both base64 of 32 raw bytes: what `wg pubkey` prints.
 * @throws KeyError when the private key is not canonical base64 of 32 bytes.
 */
export function overlayPublicKeyOf(privateKeyBase64: string): string {
  const privateRaw = decodeKeyBase64(privateKeyBase64, overlayKeyLength, "X25519 overlay private key");
  let spki: Buffer;
  try {
    const privateKey = createPrivateKey({
      key: Buffer.concat([pkcs8Header, privateRaw]),
      format: "der",
      type: "pkcs8",
    });
    spki = createPublicKey(privateKey).export({ type: "spki", format: "der" });
  } catch (error) {
    throw new KeyError("X25519 overlay private key could not be loaded", { cause: error });
  }
  return rawAfter(spki, spkiHeader, "X25519 public key").toString("base64");
}

function rawAfter(der: Buffer, header: Buffer, what: string): Buffer {
  if (der.length !== header.length + overlayKeyLength || !der.subarray(0, header.length).equals(header)) {
    throw new KeyError(`${what} exported in an unexpected DER layout`);
  }
  return Buffer.from(der.subarray(header.length));
}

// RFC 7748 §5: clear the three low bits and the top bit, set the second-highest bit.
function clamp(scalar: Buffer): void {
  scalar[0] = (scalar[0] ?? 0) & 248;
  scalar[31] = ((scalar[31] ?? 0) & 127) | 64;
}
