/**
 * The agent's state directory: what a node must keep across restarts to come back on its own — its identity from
 * enrolment, its own keys, small secrets, its report counter and the last declaration it applied.
 */
import type { KeyObject } from "node:crypto";
import { lstatSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { z } from "zod";
import { MeshError } from "../errors.js";
import {
  decodeSigningPrivateKey,
  encodeSigningPublicKey,
  generateOverlayKeyPair,
  newSigningKey,
  overlayPublicKeyOf,
  readPrivateFile,
  signingPublicKeyOf,
  writePrivateFile,
} from "../keys/index.js";
import { declarationSchema, enrolReplySchema, reportSchema } from "../link/index.js";
import type { NodeCredential, Report } from "../link/index.js";

/** The state directory's files, by what they hold. */
export const stateFiles = {
  identity: "identity.json",
  signingKey: "node-signing.key",
  overlayKey: "overlay.key",
  reportSequence: "report-sequence",
  applied: "applied.json",
} as const;

const stateDirMode = 0o700;

/** The state directory could not be read or written, or a file in it is not what it should be. */
export class HostStateError extends MeshError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("host_state", message, options);
    this.name = "HostStateError";
  }
}

/**
 * Where the agent keeps its state: the `--state` flag, else `MESH_HOST_STATE`, else `/var/lib/mesh-host` for root,
 * else `~/.local/state/mesh-host`. A relative path is made absolute, so a later change of directory cannot move it.
 */
export function resolveStateDir(flag?: string, env: NodeJS.ProcessEnv = process.env): string {
  if (flag !== undefined && flag !== "") return resolve(flag);
  const fromEnv = env.MESH_HOST_STATE;
  if (fromEnv !== undefined && fromEnv !== "") return resolve(fromEnv);
  if (process.getuid?.() === 0) return "/var/lib/mesh-host";
  const home = env.HOME !== undefined && env.HOME !== "" ? env.HOME : homedir();
  return join(home, ".local", "state", "mesh-host");
}

/** Who the node is once it has joined: everything it needs to reconnect after any restart without a person. */
export interface HostIdentity {
  /** The node's authoritative name, from the token's node record. */
  node: string;
  /** The queue the node reads its declarations from. */
  queue: string;
  broker: { url: string; credential: NodeCredential };
  /** The control plane's Ed25519 public key (base64 of the raw 32 bytes), pinned at enrolment. */
  signing_key: string;
  /** The fingerprint of `signing_key`. */
  fingerprint: string;
  /** When the node joined, ISO 8601. */
  joined_at: string;
}

// The identity is the accepted enrol reply's facts, so the same contract checks them on the way in and on disk.
const identitySchema: z.ZodType<HostIdentity> = enrolReplySchema.options[0]
  .pick({ node: true, queue: true, broker: true, signing_key: true, fingerprint: true })
  .extend({ joined_at: z.iso.datetime({ offset: true }) });

/** The node's own keys. Only the public halves ever leave the machine. */
export interface NodeKeys {
  /** The node's Ed25519 public key, base64 of the raw 32 bytes, as sent at enrolment. */
  signingPublicKey: string;
  signingPrivateKey: KeyObject;
  /** The node's overlay (WireGuard) public key, base64 of the raw 32 bytes. */
  overlayPublicKey: string;
}

/** The declaration the node last applied, by its place in the control plane's order and its digest. */
export interface AppliedDeclaration {
  epoch: number;
  sequence: number;
  digest: string;
}

const appliedSchema: z.ZodType<AppliedDeclaration> = z.strictObject({
  epoch: declarationSchema.shape.epoch,
  sequence: declarationSchema.shape.sequence,
  digest: declarationSchema.shape.digest,
});

// A secret's name is one plain file name, and never one of the files above, so a secret cannot replace the identity.
const secretNamePattern = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const reservedNames = new Set<string>(Object.values(stateFiles));

/** How many files' paths a state keeps joined: more than the agent's own files and secrets. */
const pathsKept = 64;

/**
 * The agent's state directory. Private files are written 0600 and atomically (a crash leaves the old file or the
 * new one, never half of one); the directory itself is created 0700 on the first write. Reads tell a missing file
 * apart from a broken one: only a missing file is an answer ("not joined yet"), anything else is a HostStateError.
 */
export class HostState {
  /** The state directory. */
  readonly dir: string;
  private readonly storage: StateStorage;
  /**
   * `applied.json`'s text as last read, and what it was read as. The agent asks for the declaration last applied a
   * few times for each one it takes; the file is read each time (it is the truth), and read again as JSON only when
   * its text is not the text already read.
   */
  private appliedRead: { text: string; applied: Readonly<AppliedDeclaration> } | undefined;
  /** The paths of its files, by file (`path`). */
  private readonly paths = new Map<string, string>();

  /** `storage` defaults to the directory on disk; the lab keeps many simulated nodes' state in memory instead. */
  constructor(dir: string, storage: StateStorage = diskStorage) {
    this.dir = dir;
    this.storage = storage;
  }

  /** Keeps the node's identity in `identity.json` (mode 0600: it holds a broker credential). */
  saveIdentity(identity: HostIdentity): void {
    const checked = this.check(identitySchema, identity, "identity");
    this.writePrivate(stateFiles.identity, `${JSON.stringify(checked, null, 2)}\n`);
  }

  /**
   * The node's identity, or undefined when the node has not joined (no identity file).
   * @throws HostStateError when the file exists but cannot be read or does not hold an identity.
   */
  loadIdentity(): HostIdentity | undefined {
    const text = this.readIfPresent(stateFiles.identity, "private");
    if (text === undefined) return undefined;
    return this.parseJson(stateFiles.identity, text, identitySchema);
  }

  /**
   * The node's own signing and overlay keys, created on the first call and loaded on every later one. The private
   * halves stay in the state directory, mode 0600: `node-signing.key` (PKCS#8 PEM) and `overlay.key` (WireGuard).
   * Broker keys are not made here; the caller keeps them with {@link saveSecret}.
   */
  nodeKeys(): NodeKeys {
    // Keys made here are used as made; keys already here are read from their files (decoding one costs a third of
    // a millisecond, which a fleet of simulated nodes joining at once pays thousands of times).
    let signingPrivateKey: KeyObject;
    let signingPublicKey: string;
    if (this.exists(stateFiles.signingKey)) {
      signingPrivateKey = this.decode(stateFiles.signingKey, decodeSigningPrivateKey);
      signingPublicKey = encodeSigningPublicKey(signingPublicKeyOf(signingPrivateKey));
    } else {
      const made = newSigningKey();
      signingPrivateKey = made.privateKey;
      signingPublicKey = made.publicKey;
      this.writePrivate(stateFiles.signingKey, made.pem);
    }
    let overlayPublicKey: string;
    if (this.exists(stateFiles.overlayKey)) {
      overlayPublicKey = this.decode(stateFiles.overlayKey, (text) => overlayPublicKeyOf(text.trim()));
    } else {
      const pair = generateOverlayKeyPair();
      this.writePrivate(stateFiles.overlayKey, `${pair.privateKey}\n`);
      overlayPublicKey = pair.publicKey;
    }
    return {
      signingPublicKey,
      signingPrivateKey,
      overlayPublicKey,
    };
  }

  /** Keeps a small secret (such as the broker user seed) as its own file, mode 0600. */
  saveSecret(name: string, text: string): void {
    this.writePrivate(this.secretFile(name), text);
  }

  /**
   * A secret kept by {@link saveSecret}, exactly as saved, or undefined when there is none.
   * @throws HostStateError when the file exists but cannot be read, or others may read it.
   */
  loadSecret(name: string): string | undefined {
    return this.readIfPresent(this.secretFile(name), "private");
  }

  /**
   * A report kept by {@link saveSecret} (the one waiting for its receipt), checked against the wire contract, or
   * undefined when there is none.
   * @throws HostStateError when the file exists but does not hold a report.
   */
  loadReport(name: string): Report | undefined {
    const text = this.loadSecret(name);
    return text === undefined ? undefined : this.parseJson(this.secretFile(name), text, reportSchema);
  }

  /**
   * Report items kept by {@link saveSecret} (what the machine holds), checked against the wire contract, or
   * undefined when there are none.
   * @throws HostStateError when the file exists but does not hold a list of items.
   */
  loadItems(name: string): Report["items"] | undefined {
    const text = this.loadSecret(name);
    return text === undefined
      ? undefined
      : this.parseJson(this.secretFile(name), text, reportSchema.shape.items);
  }

  /** Removes a secret kept by {@link saveSecret}; removing one that is not there is not an error. */
  removeSecret(name: string): void {
    this.storage.remove(this.path(this.secretFile(name)));
  }

  /**
   * The next `report_sequence`: 1 for the first report this state directory ever sends, then one more each call.
   * It is kept on disk before it is returned, so no number is handed out twice, even across restarts.
   * @throws HostStateError when the counter file is unreadable or does not hold a count.
   */
  nextReportSequence(): number {
    const file = stateFiles.reportSequence;
    const text = this.readIfPresent(file, "plain");
    let last = 0;
    if (text !== undefined) {
      const trimmed = text.trim();
      last = Number(trimmed);
      if (!/^\d+$/.test(trimmed) || !Number.isSafeInteger(last)) {
        throw new HostStateError(
          `report counter ${this.path(file)} does not hold a count (found ${JSON.stringify(text.slice(0, 40))}); ` +
            "the control plane refuses reports that go back in order, so it is not reset by itself",
        );
      }
    }
    const next = last + 1;
    this.writePrivate(file, `${next}\n`);
    return next;
  }

  /**
   * The declaration last applied, or undefined when none has been.
   * @throws HostStateError when `applied.json` exists but cannot be read or is not a record of one.
   */
  lastApplied(): Readonly<AppliedDeclaration> | undefined {
    const text = this.readIfPresent(stateFiles.applied, "plain");
    if (text === undefined) return undefined;
    if (this.appliedRead?.text === text) return this.appliedRead.applied;
    const applied = Object.freeze(this.parseJson(stateFiles.applied, text, appliedSchema));
    this.appliedRead = { text, applied };
    return applied;
  }

  /** Records the declaration just applied, so a restarted agent knows which ones are older. */
  recordApplied(applied: AppliedDeclaration): void {
    const checked = this.check(appliedSchema, applied, "applied declaration");
    const text = `${JSON.stringify(checked)}\n`;
    this.writePrivate(stateFiles.applied, text);
    // What was written is what a read of it gives: the next read of the same text is not parsed again.
    this.appliedRead = { text, applied: Object.freeze(checked) };
  }

  /**
   * Where a file of the state lives. Each joined once: an agent asks for its few files at every declaration, and a
   * lab of 10,000 agents spent a tenth of a second of each round of declarations joining the same paths again.
   */
  private path(file: string): string {
    let path = this.paths.get(file);
    if (path === undefined) {
      path = join(this.dir, file);
      if (this.paths.size < pathsKept) this.paths.set(file, path);
    }
    return path;
  }

  private secretFile(name: string): string {
    if (!secretNamePattern.test(name) || reservedNames.has(name)) {
      throw new HostStateError(
        `${JSON.stringify(name)} cannot name a secret: expected 1–64 of a-z, 0-9, '.', '_' and '-', ` +
          `starting with a letter or digit, and none of ${[...reservedNames].join(", ")}`,
      );
    }
    return name;
  }

  private exists(file: string): boolean {
    const path = this.path(file);
    try {
      return this.storage.exists(path);
    } catch (error) {
      throw new HostStateError(`could not look up ${path}: ${messageOf(error)}`, { cause: error });
    }
  }

  private readIfPresent(file: string, kind: "private" | "plain"): string | undefined {
    if (!this.exists(file)) return undefined;
    const path = this.path(file);
    try {
      return this.storage.read(path, kind);
    } catch (error) {
      throw new HostStateError(`could not read ${path}: ${messageOf(error)}`, { cause: error });
    }
  }

  private writePrivate(file: string, text: string): void {
    const path = this.path(file);
    try {
      this.storage.write(this.dir, path, text);
    } catch (error) {
      throw new HostStateError(`could not write ${path}: ${messageOf(error)}`, { cause: error });
    }
  }

  private decode<T>(file: string, decode: (text: string) => T): T {
    const text = this.readIfPresent(file, "private");
    if (text === undefined)
      throw new HostStateError(`${this.path(file)} disappeared while it was being read`);
    try {
      return decode(text);
    } catch (error) {
      throw new HostStateError(`${this.path(file)} does not hold a usable key: ${messageOf(error)}`, {
        cause: error,
      });
    }
  }

  private parseJson<T>(file: string, text: string, schema: z.ZodType<T>): T {
    const path = this.path(file);
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (error) {
      throw new HostStateError(`${path} is not valid JSON: ${messageOf(error)}`, { cause: error });
    }
    const result = schema.safeParse(value);
    if (!result.success) {
      throw new HostStateError(`${path} is not what it should hold: ${describeIssues(result.error)}`, {
        cause: result.error,
      });
    }
    return result.data;
  }

  // Checked before writing, so the state directory never holds what it would refuse to read back.
  private check<T>(schema: z.ZodType<T>, value: T, what: string): T {
    const result = schema.safeParse(value);
    if (!result.success) {
      throw new HostStateError(`refusing to keep a malformed ${what}: ${describeIssues(result.error)}`, {
        cause: result.error,
      });
    }
    return result.data;
  }
}

/** Where a HostState keeps its files. Every path is absolute, inside the state directory. */
export interface StateStorage {
  exists(path: string): boolean;
  /** The file's text; "private" files are refused when others may read them. */
  read(path: string, kind: "private" | "plain"): string;
  /** Writes the file atomically, mode 0600, creating `dir` (0700) first when needed. */
  write(dir: string, path: string, text: string): void;
  /** Removes the file; removing one that is not there is not an error. */
  remove(path: string): void;
}

/** The state directory on disk: the agent's own. */
export const diskStorage: StateStorage = {
  // throwIfNoEntry answers a missing file with undefined and still throws every other failure.
  exists: (path) => lstatSync(path, { throwIfNoEntry: false }) !== undefined,
  // Private files are refused when others may read them: their secret can no longer be assumed private.
  read: (path, kind) => (kind === "private" ? readPrivateFile(path) : readFileSync(path, "utf8")),
  write: (dir, path, text) => {
    mkdirSync(dir, { recursive: true, mode: stateDirMode });
    writePrivateFile(path, text);
  },
  remove: (path) => rmSync(path, { force: true }),
};

/**
 * State kept in memory only, for simulated nodes (`mesh lab`): the same HostState rules over a map, without a
 * thousand fsyncs a second. Gone when the process ends, which is what a lab node is.
 */
export function memoryStorage(): StateStorage {
  const files = new Map<string, string>();
  return {
    exists: (path) => files.has(path),
    read: (path) => {
      const text = files.get(path);
      if (text === undefined) throw new Error(`${path} does not exist`);
      return text;
    },
    write: (_dir, path, text) => void files.set(path, text),
    remove: (path) => void files.delete(path),
  };
}

function describeIssues(error: z.ZodError): string {
  return error.issues
    .slice(0, 3)
    .map((issue) => `${issue.path.length > 0 ? issue.path.join(".") : "(the whole file)"}: ${issue.message}`)
    .join("; ");
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
