/**
 * Keys of the mesh: Ed25519 signing keys and their fingerprints, the signed declaration envelope, X25519 overlay
 * keys in WireGuard format, and private key files on disk.
 */
export {
  decodeSigningPrivateKey,
  decodeSigningPublicKey,
  encodeSigningPrivateKey,
  encodeSigningPublicKey,
  ed25519PairAsJwk,
  generateSigningKeyPair,
  newSigningKey,
  rawSigningPublicKey,
  sign,
  signatureLength,
  signOffThread,
  signingPublicKeyFromRaw,
  signingPublicKeyLength,
  signingPublicKeyOf,
  signingPrivateKeyFromSeed,
  verify,
  verifyOffThread,
} from "./signing.js";
export type { SigningKeyPair } from "./signing.js";
export { fingerprint, fingerprintsEqual, openSshPublicKey } from "./fingerprint.js";
export {
  openDeclaration,
  openDeclarationOffThread,
  sealDeclaration,
  sealDeclarationTextsOffThread,
  batchSigningFrom,
} from "./envelope.js";
export type { DeclarationEnvelope, SealedDeclaration, SealedTexts } from "./envelope.js";
export type { EnvelopeWrapping } from "./sign-pool.js";
export { generateOverlayKeyPair, overlayKeyLength, overlayPublicKeyOf } from "./overlay.js";
export type { OverlayKeyPair } from "./overlay.js";
export {
  loadOrCreateSigningKey,
  NotFlushed,
  readPrivateFile,
  signingKeyFile,
  signingPublicKeyFile,
  writeFileAtomically,
  writePrivateFile,
} from "./files.js";
export type { AtomicWriteOptions, SigningIdentity } from "./files.js";
