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

function writeAtomically(
  path: string,
  contents: string | Uint8Array,
  mode: number,
  publication: "replace" | "create-only",
): void {
  try {
    writeFileAtomically(path, contents, { mode, publication });
  } catch (error) {
    throw new KeyError(`could not write ${path}`, { cause: error });
  }
}

/*
 * The one way the mesh replaces a file on disk: a new file beside it, created with its final mode, written, flushed,
 * then renamed over the old one, and the directory flushed. A crash leaves the old file or the new one, never half
 * of one, and the bytes are never visible with a wider mode than asked for. Keys, the control plane's records, the
 * agent's state and the files a declaration names all go through it.
 */

export interface AtomicWriteOptions {
  /** The file's mode, set when it is created (and again past the umask). */
  mode: number;
  /**
   * "replace" (the default) renames over whatever is there. "create-only" publishes the file only when the name is
   * free, atomically: a file someone made in the meantime is kept, and the answer says so.
   */
  publication?: "replace" | "create-only";
}

/**
 * The file is in place under its name, but the directory entry could not be flushed: it is written, and a crash
 * may still lose it. Callers that report what they wrote tell this apart from a write that did not happen.
 */
export class NotFlushed extends Error {
  override name = "NotFlushed";
}

/**
 * Writes `contents` to `path` atomically. Returns "written", or "present" when `publication` is "create-only" and the
 * name was taken.
 *
 * @throws the file system's error when nothing was published; NotFlushed when it was but the directory was not
 *   flushed; an AggregateError when the temporary file could not be removed either.
 */
export function writeFileAtomically(
  path: string,
  contents: string | Uint8Array,
  options: AtomicWriteOptions,
): "written" | "present" {
  const dir = dirname(path);
  const temp = join(dir, `.${basename(path)}.${randomBytes(6).toString("hex")}.tmp`);
  let fd: number | undefined;
  let outcome: "written" | "present";
  try {
    // "wx" makes a brand-new file, never one someone left there with other permissions; the mode is set at
    // creation so the bytes are never visible more widely, and fchmod restores what a strict umask took away.
    fd = openSync(temp, "wx", options.mode);
    fchmodSync(fd, options.mode);
    writeFileSync(fd, contents);
    fsyncSync(fd);
    closeSync(fd);
    fd = undefined;
    // A rename replaces a symbolic link at the target rather than writing through it.
    if (options.publication === "create-only") {
      outcome = publishUnlessPresent(temp, path);
    } else {
      renameSync(temp, path);
      outcome = "written";
    }
  } catch (error) {
    discardTemp(fd, temp, error);
    throw error;
  }
  try {
    syncDirectory(dir);
  } catch (error) {
    throw new NotFlushed(`written, but ${dir} could not be flushed to disk: ${messageOf(error)}`, {
      cause: error,
    });
  }
  return outcome;
}

// A hard link fails when the name exists, where a rename would silently replace it: this is how "create only if
// absent" stays atomic. Finding the name taken is an answer, not a failure.
function publishUnlessPresent(temp: string, path: string): "written" | "present" {
  let outcome: "written" | "present" = "written";
  try {
    linkSync(temp, path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    outcome = "present";
  }
  unlinkSync(temp);
  return outcome;
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
    throw new AggregateError(
      [original, cleanupError],
      `could not write, nor remove the temporary file ${temp}`,
    );
  }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function octal(mode: number): string {
  return `0${(mode & 0o777).toString(8).padStart(3, "0")}`;
}
