import { createHash, hash, timingSafeEqual } from "node:crypto";
import type { KeyObject } from "node:crypto";
import { decodeSigningPublicKey, rawSigningPublicKey } from "./signing.js";

const keyType = "ssh-ed25519";

/**
 * The fingerprint of an Ed25519 public key, as `SHA256:` followed by unpadded base64 of the SHA-256 of the key's
 * OpenSSH wire blob — the same text `ssh-keygen -lf` prints, so an operator can check a key with tools they trust.
 *
 * @param publicKey a KeyObject, or the raw key as base64 (the form {@link encodeSigningPublicKey} writes).
 */
export function fingerprint(publicKey: KeyObject | string): string {
  const digest = createHash("sha256").update(openSshBlob(publicKey)).digest("base64");
  return `SHA256:${digest.replace(/=+$/, "")}`;
}

/**
 * The key as one `authorized_keys`-style line, `ssh-ed25519 AAAA…`, with an optional trailing comment.
 * Handy for showing a key to a person or handing it to `ssh-keygen`.
 */
export function openSshPublicKey(publicKey: KeyObject | string, comment?: string): string {
  const line = `${keyType} ${openSshBlob(publicKey).toString("base64")}`;
  return comment === undefined || comment === "" ? line : `${line} ${comment}`;
}

/**
 * Whether two fingerprints are the same, in time that does not depend on where they differ.
 * Both sides are hashed first so that neither their lengths nor their contents shape the comparison.
 */
export function fingerprintsEqual(a: string, b: string): boolean {
  // One-shot hashes: a node compares the signer of every declaration it takes, and a hash object each was most of it.
  return timingSafeEqual(hash("sha256", a, "buffer"), hash("sha256", b, "buffer"));
}

// The OpenSSH wire form (RFC 8709 §4): string "ssh-ed25519", then string <32 raw key bytes>, where each string is a
// big-endian uint32 length followed by its bytes.
function openSshBlob(publicKey: KeyObject | string): Buffer {
  const key = typeof publicKey === "string" ? decodeSigningPublicKey(publicKey) : publicKey;
  return Buffer.concat([sshString(Buffer.from(keyType, "ascii")), sshString(rawSigningPublicKey(key))]);
}

function sshString(bytes: Uint8Array): Buffer {
  const length = Buffer.alloc(4);
  length.writeUInt32BE(bytes.length);
  return Buffer.concat([length, bytes]);
}
