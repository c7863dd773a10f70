import { KeyError } from "../errors.js";

/**
 * Decodes base64 that is in canonical form: standard alphabet, padded, no whitespace, no stray bits.
 *
 * Node's own decoder skips characters it does not know and ignores missing padding, so two different strings can
 * decode to the same key. Keys and signatures are compared and pinned as text, so only one spelling is accepted.
 * `what` names the value in the refusal; the value itself is never echoed, since it may be a private key.
 */
export function decodeCanonicalBase64(text: string, what: string): Buffer {
  const bytes = Buffer.from(text, "base64");
  if (bytes.toString("base64") !== text) {
    throw new KeyError(`${what} is not valid base64 (standard alphabet with padding, no whitespace)`);
  }
  return bytes;
}

/** Decodes canonical base64 that must hold exactly `length` bytes, e.g. a raw 32-byte key. */
export function decodeKeyBase64(text: string, length: number, what: string): Buffer {
  const bytes = decodeCanonicalBase64(text, what);
  if (bytes.length !== length) {
    const characters = Math.ceil(length / 3) * 4;
    throw new KeyError(
      `${what} must be ${length} bytes (${characters} base64 characters), but it decodes to ${bytes.length} bytes`,
    );
  }
  return bytes;
}
