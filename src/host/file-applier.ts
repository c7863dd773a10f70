/**
 * The `file` applier: makes the files a declaration names exist with their content and mode, and removes the ones
 * it wrote earlier that are no longer declared — only those, never a file someone else put there.
 */
import { lstatSync, mkdirSync, readFileSync } from "node:fs";
import type { Stats } from "node:fs";
import { mkdir, readFile, realpath, stat, unlink } from "node:fs/promises";
import { basename, dirname, join, posix, relative } from "node:path";
import { MeshError } from "../errors.js";
import { NotFlushed, writeFileAtomically, writePrivateFile } from "../keys/index.js";
import type { Declaration, Report } from "../link/index.js";
import { HostStateError } from "./state.js";

/** A declared file: where it goes, what it holds and its mode (octal text, "0644" when absent). */
export type FileItem = Extract<Declaration["items"][number], { type: "file" }>;

/** What became of one item, in the form a report carries it. */
export type ItemResult = Report["items"][number];

const defaultMode = "0644";
const directoryMode = 0o755;

/** The applier could not start at all: its root is missing or unreadable. */
export class ApplierError extends MeshError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("applier", message, options);
    this.name = "ApplierError";
  }
}

/** A declared path the applier will not touch, with the reason a person reads in the report. */
class Refusal extends Error {
  override name = "Refusal";
}

/** The file is in place, but the directory entry could not be made durable: it is written, and failed. */
class NotDurable extends Error {
  override name = "NotDurable";
}

/**
 * Applies `file` items under `root` (usually `/`; a test directory in tests). Every file is written atomically: a
 * reader sees the old file or the new one, never half of one. The paths it has written are kept in the record file
 * at `recordPath`, which is how it knows which files are its own to remove.
 */
export class FileApplier {
  readonly root: string;
  readonly recordPath: string;

  constructor(root: string, recordPath: string) {
    this.root = root;
    this.recordPath = recordPath;
  }

  /**
   * Makes the files under root match `items`: each declared file written, each file written earlier and no longer
   * declared removed. One item failing does not stop the others. The results name every item; a removal that
   * failed adds a failed result with id `file:<path>`.
   *
   * @throws ApplierError when root cannot be resolved; HostStateError when the record cannot be read or written.
   */
  async apply(items: readonly FileItem[]): Promise<ItemResult[]> {
    const realRoot = await this.resolveRoot();
    const written = new Set(this.readRecord());
    const owned = new Set<string>();
    const declared = new Set<string>();
    const results: ItemResult[] = [];

    for (const item of items) {
      const path = posix.normalize(item.path);
      const firstClaim = !declared.has(path);
      declared.add(path);
      try {
        if (!firstClaim) throw new Refusal(`${path} is declared by more than one item`);
        await this.write(realRoot, path, item);
        owned.add(path);
        results.push({ id: item.id, state: "applied" });
      } catch (error) {
        // A file it wrote before is still its own while it stays declared, even when rewriting it failed.
        if (written.has(path) || error instanceof NotDurable) owned.add(path);
        results.push({ id: item.id, state: "failed", reason: reasonFor(error, "write", path) });
      }
    }

    for (const path of written) {
      if (declared.has(path)) continue;
      try {
        await this.remove(realRoot, path);
      } catch (error) {
        // Something on the way vanished between looking and removing: the file is gone, which is what was wanted.
        if (isErrno(error, "ENOENT")) continue;
        // Kept in the record so the removal is tried again with the next declaration.
        owned.add(path);
        results.push({ id: `file:${path}`, state: "failed", reason: reasonFor(error, "remove", path) });
      }
    }

    this.writeRecord([...owned].sort());
    return results;
  }

  private async resolveRoot(): Promise<string> {
    try {
      return await realpath(this.root);
    } catch (error) {
      throw new ApplierError(`file applier root ${this.root} cannot be used: ${messageOf(error)}`, {
        cause: error,
      });
    }
  }

  private async write(realRoot: string, path: string, item: FileItem): Promise<void> {
    if (!isPlainFilePath(path)) throw new Refusal(`${path} is not an absolute path to a file`);
    const modeText = item.mode ?? defaultMode;
    if (!/^[0-7]{3,4}$/.test(modeText))
      throw new Refusal(`${JSON.stringify(modeText)} is not an octal file mode`);
    const mode = parseInt(modeText, 8);
    const parent = await this.resolveParent(realRoot, path, "create");
    const target = join(parent, basename(path));
    const existing = lstatSync(target, { throwIfNoEntry: false });
    if (existing?.isDirectory()) throw new Refusal(`${path} is a directory`);
    const content = Buffer.from(item.content, "utf8");
    if (existing !== undefined && (await holds(target, existing, content, mode))) return;

    try {
      // Atomic, with the declared mode from the start; a rename replaces a symbolic link at the target rather than
      // writing through it.
      writeFileAtomically(target, content, { mode });
    } catch (error) {
      if (!(error instanceof NotFlushed)) throw error;
      const why = `written, but ${dirname(path)} could not be flushed to disk: ${messageOf(error.cause)}`;
      throw new NotDurable(why, { cause: error });
    }
  }

  private async remove(realRoot: string, path: string): Promise<void> {
    const parent = await this.resolveParent(realRoot, path, "look");
    if (parent === undefined) return;
    const target = join(parent, basename(path));
    const existing = lstatSync(target, { throwIfNoEntry: false });
    // It wrote a regular file; anything else there now was put there by someone else and is left alone.
    if (existing === undefined || !existing.isFile()) return;
    await unlink(target);
    // Emptied directories stay: the applier cannot know whether it made them or found them.
  }

  /**
   * The real directory that holds `path` under root, walked one component at a time so that a symbolic link on the
   * way is followed only when it stays under root. With "create", missing directories are made; with "look", a
   * missing directory, or something else in its place, means the file cannot be there (undefined).
   */
  private async resolveParent(realRoot: string, path: string, mode: "create"): Promise<string>;
  private async resolveParent(realRoot: string, path: string, mode: "look"): Promise<string | undefined>;
  private async resolveParent(
    realRoot: string,
    path: string,
    mode: "create" | "look",
  ): Promise<string | undefined> {
    let current = realRoot;
    let declaredSoFar = "";
    const parts = posix
      .dirname(path)
      .split("/")
      .filter((name) => name !== "" && name !== ".");
    for (const part of parts) {
      declaredSoFar = `${declaredSoFar}/${part}`;
      const next = join(current, part);
      const stats = lstatSync(next, { throwIfNoEntry: false });
      if (stats === undefined) {
        if (mode === "look") return undefined;
        await mkdir(next, { mode: directoryMode });
        current = next;
      } else if (stats.isSymbolicLink()) {
        const real = await realpath(next);
        if (!isWithin(realRoot, real)) {
          throw new Refusal(
            `${declaredSoFar} is a symbolic link to ${real}, outside the root ${this.root}; ${path} would escape it`,
          );
        }
        if (!(await stat(real)).isDirectory()) {
          if (mode === "look") return undefined;
          throw new Refusal(`${declaredSoFar} is not a directory`);
        }
        current = real;
      } else if (stats.isDirectory()) {
        current = next;
      } else {
        if (mode === "look") return undefined;
        throw new Refusal(`${declaredSoFar} is not a directory`);
      }
    }
    return current;
  }

  private readRecord(): string[] {
    let value: unknown;
    try {
      if (lstatSync(this.recordPath, { throwIfNoEntry: false }) === undefined) return [];
      value = JSON.parse(readFileSync(this.recordPath, "utf8"));
    } catch (error) {
      throw new HostStateError(
        `could not read the written-files record ${this.recordPath}: ${messageOf(error)}`,
        {
          cause: error,
        },
      );
    }
    // Without a trustworthy record it cannot tell its own files from others', so it stops rather than guess.
    if (
      !Array.isArray(value) ||
      !value.every((entry) => typeof entry === "string" && isPlainFilePath(entry))
    ) {
      throw new HostStateError(`the written-files record ${this.recordPath} is not a JSON list of paths`);
    }
    return value.map((path: string) => posix.normalize(path));
  }

  private writeRecord(paths: string[]): void {
    try {
      mkdirSync(dirname(this.recordPath), { recursive: true, mode: 0o700 });
      writePrivateFile(this.recordPath, `${JSON.stringify(paths, null, 2)}\n`);
    } catch (error) {
      throw new HostStateError(
        `could not write the written-files record ${this.recordPath}: ${messageOf(error)}`,
        { cause: error },
      );
    }
  }
}

/** True for an absolute path naming a file: no `..`, no NUL, not the root and not ending in '/'. */
function isPlainFilePath(path: string): boolean {
  return (
    path.startsWith("/") && !path.endsWith("/") && !path.includes("\0") && !path.split("/").includes("..")
  );
}

// Rewriting a file that already holds the declared bytes and mode would only wake whatever watches it.
async function holds(target: string, existing: Stats, content: Buffer, mode: number): Promise<boolean> {
  if (!existing.isFile() || (existing.mode & 0o7777) !== mode || existing.size !== content.length)
    return false;
  return (await readFile(target)).equals(content);
}

function isWithin(realRoot: string, real: string): boolean {
  const rel = relative(realRoot, real);
  return rel === "" || (rel !== ".." && !rel.startsWith("../") && !posix.isAbsolute(rel));
}

const errnoReasons: Record<string, string> = {
  EACCES: "permission denied",
  EPERM: "operation not permitted",
  ENOTDIR: "a parent is not a directory",
  EISDIR: "it is a directory",
  ENOSPC: "no space left on the device",
  EDQUOT: "disk quota exceeded",
  EROFS: "the file system is read-only",
  ENAMETOOLONG: "the name is too long",
  ELOOP: "too many symbolic links on the way",
  ENOENT: "a directory on the way is gone, or a symbolic link on the way points nowhere",
};

function reasonFor(error: unknown, action: "write" | "remove", path: string): string {
  if (error instanceof Refusal) return `refused to ${action} ${path}: ${error.message}`;
  if (error instanceof NotDurable) return `${path} was ${error.message}`;
  const code = error instanceof Error ? (error as NodeJS.ErrnoException).code : undefined;
  const known = code === undefined ? undefined : errnoReasons[code];
  const why = known === undefined ? messageOf(error) : `${known} (${code})`;
  return `could not ${action} ${path}: ${why}`;
}

function isErrno(error: unknown, code: string): boolean {
  return error instanceof Error && (error as NodeJS.ErrnoException).code === code;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
