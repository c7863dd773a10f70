import { randomBytes } from "node:crypto";
import type { KeyObject } from "node:crypto";
import {
  closeSync,
  existsSync,
  fchmodSync,
  fstatSync,
  fsyncSync,
  linkSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { basename, dirname, join } from "node:path";
import { KeyError } from "../errors.js";
import { fingerprint } from "./fingerprint.js";
import {
  decodeSigningPrivateKey,
  encodeSigningPrivateKey,
  encodeSigningPublicKey,
  generateSigningKeyPair,
  signingPublicKeyOf,
} from "./signing.js";
import type { SigningKeyPair } from "./signing.js";

/** File name of the signing private key (PKCS#8 PEM, mode 0600) inside a key directory. */
export const signingKeyFile = "signing.key";
/** File name of the signing public key (raw base64) inside a key directory. */
export const signingPublicKeyFile = "signing.pub";

const privateFileMode = 0o600;
// The public key is no secret, but it lives in the control plane's data dir, where every file is its owner's alone.
const publicFileMode = 0o600;
const keyDirectoryMode = 0o700;
// Any permission for group or others, not only read: a key others can replace is as unsafe as one they can read.
const notOwnerBits = 0o077;

/** A signing key pair as loaded from its key directory, with the public key's fingerprint. */
export interface SigningIdentity extends SigningKeyPair {
  fingerprint: string;
}

/**
 * Writes a private file (a key) so that it is never readable by anyone but its owner, not even for a moment, and
 * never half-written: the bytes go to a new file in the same directory created with mode 0600, are flushed to disk,
 * and only then renamed over `path`. A crash leaves either the old file or the new one.
 *
 * @throws KeyError (with the file system error as cause) when the file cannot be written.
 */
export function writePrivateFile(path: string, contents: string | Uint8Array): void {
  writeAtomically(path, contents, privateFileMode, "replace");
}

/**
 * Reads a private file (a key) as UTF-8 text, refusing one that group or others may read or change, since its
 * secret can no longer be assumed private.
 *
 * @throws KeyError when the file cannot be read, is not a regular file, or its mode is too open.
 */
export function readPrivateFile(path: string): string {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (error) {
    throw new KeyError(`could not open private key file ${path}`, { cause: error });
  }
  try {
    // Mode and contents come from the same open file, so the file cannot be swapped between the check and the read.
    const stats = fstatSync(fd);
    if (!stats.isFile()) {
      throw new KeyError(`private key file ${path} is not a regular file`);
    }
    if ((stats.mode & notOwnerBits) !== 0) {
      throw new KeyError(
        `private key file ${path} has mode ${octal(stats.mode)}, which lets other users read or change it; ` +
          `restrict it to its owner with: chmod 600 ${path}`,
      );
    }
    return readFileSync(fd, "utf8");
  } catch (error) {
    if (error instanceof KeyError) throw error;
    throw new KeyError(`could not read private key file ${path}`, { cause: error });
  } finally {
    closeSync(fd);
  }
}

/**
 * Loads the signing key kept in `dir`, creating it on first use: `signing.key` holds the private key (PKCS#8 PEM,
 * mode 0600) and `signing.pub` the public key as raw base64. The directory is created with mode 0700 if missing.
 * Every later call returns the same key.
 *
 * @throws KeyError when a file cannot be read or written, the private key file is too open, or `signing.pub` does
 *   not belong to `signing.key`.
 */
export function loadOrCreateSigningKey(dir: string): SigningIdentity {
  try {
    mkdirSync(dir, { recursive: true, mode: keyDirectoryMode });
  } catch (error) {
    throw new KeyError(`could not create key directory ${dir}`, { cause: error });
  }
  const keyPath = join(dir, signingKeyFile);
  if (!existsSync(keyPath)) {
    const fresh = generateSigningKeyPair();
    // Create-only: if another process made its key in the meantime, theirs is kept and read below, so both
    // processes end up holding the one key that is on disk.
    writeAtomically(keyPath, encodeSigningPrivateKey(fresh.privateKey), privateFileMode, "create-only");
  }

  const pem = readPrivateFile(keyPath);
  let privateKey: KeyObject;
  try {
    privateKey = decodeSigningPrivateKey(pem);
  } catch (error) {
    throw new KeyError(`signing key file ${keyPath} does not hold an Ed25519 private key`, { cause: error });
  }
  const publicKey = signingPublicKeyOf(privateKey);
  keepPublicCopy(join(dir, signingPublicKeyFile), encodeSigningPublicKey(publicKey), keyPath);
  return { privateKey, publicKey, fingerprint: fingerprint(publicKey) };
}

// The private key is the source of truth; signing.pub is a copy for people and scripts. A missing copy is written;
// a copy naming another key means one of the two files was replaced, which is reported rather than papered over.
function keepPublicCopy(path: string, encoded: string, keyPath: string): void {
  if (!existsSync(path)) {
    writeAtomically(path, `${encoded}\n`, publicFileMode, "replace");
    return;
  }
  let stored: string;
  try {
    stored = readFileSync(path, "utf8").trim();
  } catch (error) {
    throw new KeyError(`could not read signing public key file ${path}`, { cause: error });
  }
  if (stored !== encoded) {
    throw new KeyError(
      `${path} does not match the private key in ${keyPath}; ` +
        `if ${keyPath} is the right key, delete ${path} and it will be written again`,
    );
  }
}

type Publication = "replace" | "create-only";

function writeAtomically(
  path: string,
  contents: string | Uint8Array,
  mode: number,
  publication: Publication,
): void {
  const dir = dirname(path);
  const temp = join(dir, `.${basename(path)}.${randomBytes(6).toString("hex")}.tmp`);
  let fd: number | undefined;
  try {
    // "wx" makes a brand-new file, never one someone left there with other permissions; the mode is set at
    // creation so the bytes are never visible more widely, and fchmod restores what a strict umask took away.
    fd = openSync(temp, "wx", mode);
    fchmodSync(fd, mode);
    writeFileSync(fd, contents);
    fsyncSync(fd);
    closeSync(fd);
    fd = undefined;
    if (publication === "replace") {
      renameSync(temp, path);
    } else {
      publishUnlessPresent(temp, path);
    }
    syncDirectory(dir);
  } catch (error) {
    discardTemp(fd, temp, error);
    throw new KeyError(`could not write ${path}`, { cause: error });
  }
}

// A hard link fails when the name exists, where a rename would silently replace it: this is how "create only if
// absent" stays atomic. Finding the name taken is an answer, not a failure.
function publishUnlessPresent(temp: string, path: string): void {
  try {
    linkSync(temp, path);
  } catch (error) {
    if (!isErrno(error, "EEXIST")) throw error;
  }
  unlinkSync(temp);
}

// A rename is only durable once the directory entry itself reaches the disk.
function syncDirectory(dir: string): void {
  const fd = openSync(dir, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

function discardTemp(fd: number | undefined, temp: string, original: unknown): void {
  try {
    if (fd !== undefined) closeSync(fd);
    rmSync(temp, { force: true });
  } catch (cleanupError) {
    throw new KeyError(`could not write a key file, nor remove its temporary file ${temp}`, {
      cause: new AggregateError([original, cleanupError]),
    });
  }
}

function isErrno(error: unknown, code: string): boolean {
  return error instanceof Error && (error as NodeJS.ErrnoException).code === code;
}

function octal(mode: number): string {
  return `0${(mode & 0o777).toString(8).padStart(3, "0")}`;
}
