import type { KeyObject } from "node:crypto";
import { KeyError } from "../errors.js";
import { decodeCanonicalBase64 } from "./base64.js";
import { fingerprint, fingerprintsEqual } from "./fingerprint.js";
import type { EnvelopeWrapping } from "./sign-pool.js";
import { SigningPool } from "./sign-pool.js";
import { sign, signingPublicKeyOf, signOffThread, verify, verifyOffThread } from "./signing.js";

/**
 * A declaration as it travels: its bytes exactly as composed, the control plane's signature over those bytes, and
 * the fingerprint of the key that made it. The declaration is never re-encoded between signing and checking.
 */
export interface DeclarationEnvelope {
  kind: "declaration_envelope";
  /** Base64 of the declaration's bytes, exactly as signed. */
  payload: string;
  /** Base64 of the 64-byte Ed25519 signature over the payload's bytes. */
  signature: string;
  /** Fingerprint (`SHA256:…`) of the signing key. */
  signer: string;
}

/** The fields of an envelope that {@link openDeclaration} reads. */
export type SealedDeclaration = Pick<DeclarationEnvelope, "payload" | "signature" | "signer">;

/**
 * The fingerprint of a signing key (of its public half, for a private key), worked out once per key: deriving and
 * hashing it costs more than the signature, and every declaration is sealed, and checked, against one key.
 */
const fingerprints = new WeakMap<KeyObject, string>();
function fingerprintOf(key: KeyObject): string {
  let known = fingerprints.get(key);
  if (known === undefined) {
    known = fingerprint(key.type === "private" ? signingPublicKeyOf(key) : key);
    fingerprints.set(key, known);
  }
  return known;
}

/** The signer each private key was last checked to be: a fleet's declarations are sealed one after another. */
const sealsAs = new WeakMap<KeyObject, string>();

/**
 * Signs a declaration's bytes exactly as they will be published and wraps them in an envelope.
 *
 * @param signer the fingerprint of `privateKey`'s public half; checked here so that an envelope every node would
 *   refuse is never sent.
 * @throws KeyError when `signer` is not the fingerprint of `privateKey`.
 */
export function sealDeclaration(
  declarationBytes: Uint8Array,
  privateKey: KeyObject,
  signer: string,
): DeclarationEnvelope {
  checkSigner(privateKey, signer);
  return envelopeOf(declarationBytes, sign(declarationBytes, privateKey), signer);
}

/**
 * Below this many declarations a batch is signed on the thread pool one by one: starting signing threads costs a
 * command more than it saves on a few signatures.
 */
export const batchSigningFrom = 64;

/** Each key's signing threads, started by its first large batch and kept for the process's life. */
const pools = new WeakMap<KeyObject, SigningPool>();

/** Declarations sealed and written out: each envelope's bytes, ready to send, and its signature (base64). */
export interface SealedTexts {
  envelopes: Uint8Array[];
  signatures: string[];
}

/**
 * Seals many declarations as {@link sealDeclaration} does, in their order, and writes each envelope's text around
 * its payload and signature as `wrapping` says (the caller's wire format): a large batch on signing threads of its
 * own (one message to them and one back), with the texts, so the thread that records and sends them only hands
 * them on; a small one on the thread pool.
 */
export async function sealDeclarationTextsOffThread(
  declarations: readonly Uint8Array[],
  privateKey: KeyObject,
  signer: string,
  wrapping: EnvelopeWrapping,
): Promise<SealedTexts> {
  checkSigner(privateKey, signer);
  const base64 = (bytes: Uint8Array) =>
    Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
  if (declarations.length < batchSigningFrom) {
    const signatures = await Promise.all(declarations.map((bytes) => signOffThread(bytes, privateKey)));
    const encoder = new TextEncoder();
    return {
      envelopes: declarations.map((bytes, i) =>
        encoder.encode(
          wrapping.head +
            base64(bytes) +
            wrapping.mid +
            base64(signatures[i] ?? new Uint8Array()) +
            wrapping.tail,
        ),
      ),
      signatures: signatures.map(base64),
    };
  }
  const { signatures, envelopes } = await poolOf(privateKey).sealAll(declarations, wrapping);
  if (envelopes.length !== declarations.length)
    throw new KeyError(`${envelopes.length} of ${declarations.length} declarations were sealed`);
  return { envelopes, signatures: signatures.map(base64) };
}

function poolOf(privateKey: KeyObject): SigningPool {
  let pool = pools.get(privateKey);
  if (pool === undefined) {
    pool = new SigningPool(privateKey);
    pools.set(privateKey, pool);
  }
  return pool;
}

function checkSigner(privateKey: KeyObject, signer: string): void {
  if (sealsAs.get(privateKey) === signer) return;
  const ownFingerprint = fingerprintOf(privateKey);
  if (!fingerprintsEqual(signer, ownFingerprint)) {
    throw new KeyError(`signer ${signer} is not the fingerprint of the signing key (${ownFingerprint})`);
  }
  sealsAs.set(privateKey, signer);
}

function envelopeOf(
  declarationBytes: Uint8Array,
  signature: Uint8Array,
  signer: string,
): DeclarationEnvelope {
  return {
    kind: "declaration_envelope",
    payload: Buffer.from(declarationBytes).toString("base64"),
    signature: Buffer.from(signature).toString("base64"),
    signer,
  };
}

/**
 * Checks an envelope against the signing key pinned at enrolment and returns the declaration's bytes unchanged.
 * Parse them only after this returns.
 *
 * The signature is checked against `pinnedPublicKey` alone: nothing the envelope says about its signer is trusted,
 * the `signer` field only has to agree with the pinned key.
 *
 * @throws KeyError when the signer is not the pinned key, the fields are not base64, or the signature does not verify.
 */
export function openDeclaration(envelope: SealedDeclaration, pinnedPublicKey: KeyObject): Uint8Array {
  const { bytes, signature } = sealedParts(envelope, pinnedPublicKey);
  if (!verify(bytes, signature, pinnedPublicKey)) throw new KeyError(notVerified);
  return new Uint8Array(bytes);
}

/**
 * Opens as {@link openDeclaration} does, checking the signature on the thread pool: an agent's loop is not held
 * while it is checked (and a lab of many nodes checks theirs on every core).
 */
export async function openDeclarationOffThread(
  envelope: SealedDeclaration,
  pinnedPublicKey: KeyObject,
): Promise<Uint8Array> {
  const { bytes, signature } = sealedParts(envelope, pinnedPublicKey);
  if (!(await verifyOffThread(bytes, signature, pinnedPublicKey))) throw new KeyError(notVerified);
  return new Uint8Array(bytes);
}

const notVerified = "declaration signature does not verify against the pinned signing key";

/** The envelope's bytes and signature, once its signer is the pinned key. */
function sealedParts(
  envelope: SealedDeclaration,
  pinnedPublicKey: KeyObject,
): { bytes: Buffer; signature: Buffer } {
  const pinnedFingerprint = fingerprintOf(pinnedPublicKey);
  if (!fingerprintsEqual(envelope.signer, pinnedFingerprint)) {
    throw new KeyError(
      `declaration signer ${envelope.signer} is not the pinned signing key ${pinnedFingerprint}`,
    );
  }
  // The signature covers these decoded bytes as they are. Re-encoding them first (even parse + stringify) could
  // change key order or spacing, and a signature over the same meaning would then no longer verify.
  return {
    bytes: decodeCanonicalBase64(envelope.payload, "declaration payload"),
    signature: decodeCanonicalBase64(envelope.signature, "declaration signature"),
  };
}
