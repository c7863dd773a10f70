import { createHash, timingSafeEqual } from "node:crypto";
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
 * Whether two fingerprints are the same, in time that does not depend on where they differ. Texts of different
 * lengths are unequal at once: a fingerprint's length is set by its form, which is public. A node compares the
 * signer of every declaration it takes: hashing both sides first, to hide the lengths too, cost eight times as much.
 */
export function fingerprintsEqual(a: string, b: string): boolean {
  const left = Buffer.from(a, "utf8");
  const right = Buffer.from(b, "utf8");
  return left.length === right.length && timingSafeEqual(left, right);
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
