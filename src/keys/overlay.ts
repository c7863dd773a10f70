import { createPrivateKey, createPublicKey, generateKeyPairSync } from "node:crypto";
import { KeyError } from "../errors.js";
import { decodeKeyBase64 } from "./base64.js";

/** Length in bytes of a raw X25519 key, private or public. */
export const overlayKeyLength = 32;

// X25519 PKCS#8 and SubjectPublicKeyInfo DER are fixed headers (algorithm OID 1.3.101.110) followed by the raw 32
// bytes. Working in DER keeps us off the JWK export, which does not return for X25519 keys on Node 20.
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
  const pair = generateKeyPairSync("x25519", {
    privateKeyEncoding: { type: "pkcs8", format: "der" },
    publicKeyEncoding: { type: "spki", format: "der" },
  });
  const privateRaw = rawAfter(pair.privateKey, pkcs8Header, "X25519 private key");
  // WireGuard stores private keys clamped (as `wg genkey` does). X25519 clamps before use anyway, so this changes
  // no public key; it only makes the stored form the one WireGuard itself would write.
  clamp(privateRaw);
  return {
    privateKey: privateRaw.toString("base64"),
    publicKey: rawAfter(pair.publicKey, spkiHeader, "X25519 public key").toString("base64"),
  };
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
