/**
 * The file applier: makes the files, directories and symbolic links a declaration names exist with their content,
 * mode and owner, and removes the ones it made earlier that are no longer declared — only those, never what someone
 * else put there. It can also say, changing nothing, where they have drifted from what was declared.
 */
import { lstatSync, mkdirSync, readFileSync, readlinkSync } from "node:fs";
import type { Stats } from "node:fs";
import {
  chmod,
  chown,
  lchown,
  mkdir,
  readFile,
  realpath,
  rename,
  rmdir,
  stat,
  symlink,
  unlink,
} from "node:fs/promises";
import { basename, dirname, join, posix, relative } from "node:path";
import { NotFlushed, writeFileAtomically, writePrivateFile } from "../keys/index.js";
import type { DeclaredItem } from "../link/index.js";
import type { Drift, ItemResult, KindApplier } from "./appliers.js";
import { ApplierError } from "./appliers.js";
import { HostStateError } from "./state.js";

/** A declared file system entry: a regular file, a directory or a symbolic link. */
export type FileItem = Extract<DeclaredItem, { type: "file" | "directory" | "symlink" }>;
type Kind = FileItem["type"];
type Entry = { path: string; kind: Kind };

const defaultMode = "0644";
/** Directories made on the way to a declared entry. */
const directoryMode = 0o755;

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
export class FileApplier implements KindApplier {
  readonly types = ["file", "directory", "symlink"] as const;
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
  async apply(given: readonly DeclaredItem[]): Promise<ItemResult[]> {
    const realRoot = await this.resolveRoot();
    const accounts = new Accounts(realRoot);
    const written = new Map(this.readRecord().map((entry) => [entry.path, entry.kind]));
    const owned = new Map<string, Kind>();
    const declared = new Set<string>();
    const results: ItemResult[] = [];

    for (const item of inApplyOrder(fileItems(given))) {
      const path = posix.normalize(item.path);
      const firstClaim = !declared.has(path);
      declared.add(path);
      try {
        if (!firstClaim) throw new Refusal(`${path} is declared by more than one item`);
        await this.make(realRoot, path, item, written.get(path), accounts);
        owned.set(path, item.type);
        results.push({ id: item.id, state: "applied" });
      } catch (error) {
        // What it made before is still its own while it stays declared, even when remaking it failed.
        const before = written.get(path);
        if (before !== undefined) owned.set(path, before);
        else if (error instanceof NotDurable) owned.set(path, item.type);
        results.push({ id: item.id, state: "failed", reason: reasonFor(error, "write", path) });
      }
    }

    // Deepest first, so a directory it made is emptied of what it made before it is removed.
    const leaving = [...written]
      .filter(([path]) => !declared.has(path))
      .sort(([a], [b]) => b.length - a.length);
    for (const [path, kind] of leaving) {
      try {
        await this.remove(realRoot, path, kind);
      } catch (error) {
        // Something on the way vanished between looking and removing: the entry is gone, which is what was wanted.
        if (isErrno(error, "ENOENT")) continue;
        // A directory someone else put files in stays, and is no longer the applier's.
        if (kind === "directory" && isErrno(error, "ENOTEMPTY")) continue;
        // Kept in the record so the removal is tried again with the next declaration.
        owned.set(path, kind);
        results.push({ id: `file:${path}`, state: "failed", reason: reasonFor(error, "remove", path) });
      }
    }

    this.writeRecord(
      [...owned].map(([path, kind]) => ({ path, kind })).sort((a, b) => (a.path < b.path ? -1 : 1)),
    );
    return results;
  }

  /** Records as its own each `file:<path>` that exists under root, as the kind it is there. */
  async adopt(ids: readonly string[]): Promise<void> {
    const realRoot = await this.resolveRoot();
    const entries = new Map(this.readRecord().map((entry) => [entry.path, entry.kind]));
    for (const id of ids) {
      if (!id.startsWith("file:")) continue;
      const path = posix.normalize(id.slice("file:".length));
      if (!isPlainFilePath(path)) continue;
      const parent = await this.resolveParent(realRoot, path, "look");
      const found =
        parent === undefined ? undefined : lstatSync(join(parent, basename(path)), { throwIfNoEntry: false });
      if (found === undefined) continue;
      const kind = kindOf(found);
      if (kind === "file" || kind === "directory" || kind === "symlink") entries.set(path, kind);
    }
    this.writeRecord(
      [...entries].map(([path, kind]) => ({ path, kind })).sort((a, b) => (a.path < b.path ? -1 : 1)),
    );
  }

  /** Where the declared entries differ from what is under root now: content, mode, owner, kind, or absence. */
  async verify(given: readonly DeclaredItem[]): Promise<Drift[]> {
    const realRoot = await this.resolveRoot();
    const accounts = new Accounts(realRoot);
    const drifts: Drift[] = [];
    for (const item of fileItems(given)) {
      const path = posix.normalize(item.path);
      const differs = await this.differences(realRoot, path, item, accounts).catch((error: unknown) => [
        `cannot be checked: ${messageOf(error)}`,
      ]);
      if (differs.length > 0) drifts.push({ id: item.id, what: differs.join("; ") });
    }
    return drifts;
  }

  private async differences(
    realRoot: string,
    path: string,
    item: FileItem,
    accounts: Accounts,
  ): Promise<string[]> {
    const parent = await this.resolveParent(realRoot, path, "look");
    const target = parent === undefined ? undefined : join(parent, basename(path));
    const existing = target === undefined ? undefined : lstatSync(target, { throwIfNoEntry: false });
    if (target === undefined || existing === undefined) return ["missing"];
    if (item.type === "symlink") {
      if (!existing.isSymbolicLink()) return [`not a symbolic link (${kindOf(existing)})`];
      const now = readlinkSync(target);
      return now === item.target ? [] : [`points to ${now}, not ${item.target}`];
    }
    const wanted = item.type === "directory" ? "directory" : "file";
    if (kindOf(existing) !== wanted) return [`a ${kindOf(existing)}, not a ${wanted}`];
    const differs: string[] = [];
    const mode = modeOf(item);
    if ((existing.mode & 0o7777) !== mode)
      differs.push(`mode ${octal(existing.mode & 0o7777)}, not ${octal(mode)}`);
    const owner = accounts.ids(item);
    if (owner.uid !== undefined && existing.uid !== owner.uid)
      differs.push(`owner ${existing.uid}, not ${owner.uid}`);
    if (owner.gid !== undefined && existing.gid !== owner.gid)
      differs.push(`group ${existing.gid}, not ${owner.gid}`);
    if (item.type === "file" && !(await readFile(target)).equals(contentOf(item)))
      differs.push("content changed");
    return differs;
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

  private async make(
    realRoot: string,
    path: string,
    item: FileItem,
    madeBefore: Kind | undefined,
    accounts: Accounts,
  ): Promise<void> {
    if (!isPlainFilePath(path)) throw new Refusal(`${path} is not an absolute path below the root`);
    const parent = await this.resolveParent(realRoot, path, "create");
    const target = join(parent, basename(path));
    const existing = lstatSync(target, { throwIfNoEntry: false });
    const owner = accounts.ids(item);
    if (item.type === "symlink") {
      if (existing?.isSymbolicLink() === true && readlinkSync(target) === item.target) return;
      if (existing !== undefined && !existing.isSymbolicLink() && madeBefore === undefined)
        throw new Refusal(`${path} is a ${kindOf(existing)} the mesh did not make`);
      if (existing?.isDirectory() === true) throw new Refusal(`${path} is a directory`);
      // Made beside and renamed into place: the link is replaced whole, never missing in between.
      const temporary = join(parent, `.${basename(path)}.mesh-${process.pid}`);
      await unlink(temporary).catch((error: unknown) => {
        if (!isErrno(error, "ENOENT")) throw error;
      });
      await symlink(item.target, temporary);
      await rename(temporary, target);
      return;
    }
    const mode = modeOf(item);
    if (item.type === "directory") {
      if (existing === undefined) await mkdir(target, { mode });
      else if (!existing.isDirectory())
        throw new Refusal(`${path} is a ${kindOf(existing)}, not a directory`);
      // mkdir's mode passes through the umask: set it as declared.
      await chmod(target, mode);
      if (owner.uid !== undefined || owner.gid !== undefined)
        await chown(target, owner.uid ?? -1, owner.gid ?? -1);
      return;
    }
    if (existing?.isDirectory() === true) throw new Refusal(`${path} is a directory`);
    const content = contentOf(item);
    if (existing !== undefined && (await holds(target, existing, content, mode, owner))) return;
    try {
      // Atomic, with the declared mode from the start; a rename replaces a symbolic link at the target rather than
      // writing through it.
      writeFileAtomically(target, content, { mode });
    } catch (error) {
      if (!(error instanceof NotFlushed)) throw error;
      const why = `written, but ${dirname(path)} could not be flushed to disk: ${messageOf(error.cause)}`;
      throw new NotDurable(why, { cause: error });
    }
    if (owner.uid !== undefined || owner.gid !== undefined)
      await lchown(target, owner.uid ?? -1, owner.gid ?? -1);
  }

  private async remove(realRoot: string, path: string, kind: Kind): Promise<void> {
    const parent = await this.resolveParent(realRoot, path, "look");
    if (parent === undefined) return;
    const target = join(parent, basename(path));
    const existing = lstatSync(target, { throwIfNoEntry: false });
    // Only what it made, still of the kind it made; anything else there now was put there by someone else.
    if (existing === undefined || kindOf(existing) !== (kind === "file" ? "file" : kind)) return;
    if (kind === "directory") await rmdir(target);
    else await unlink(target);
    // Directories made on the way to a file stay: the applier cannot know whether it made them or found them.
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

  private readRecord(): Entry[] {
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
    // Without a trustworthy record it cannot tell its own files from others', so it stops rather than guess. An
    // entry that is a bare path is a regular file (the record's first form).
    const entries = Array.isArray(value) ? value : undefined;
    const records = entries?.map((entry: unknown): Entry | undefined => {
      if (typeof entry === "string")
        return isPlainFilePath(entry) ? { path: entry, kind: "file" } : undefined;
      if (typeof entry !== "object" || entry === null) return undefined;
      const { path, kind } = entry as { path?: unknown; kind?: unknown };
      if (typeof path !== "string" || !isPlainFilePath(path)) return undefined;
      return kind === "file" || kind === "directory" || kind === "symlink" ? { path, kind } : undefined;
    });
    if (records === undefined || records.some((entry) => entry === undefined)) {
      throw new HostStateError(`the written-files record ${this.recordPath} is not a JSON list of entries`);
    }
    return (records as Entry[]).map((entry) => ({ ...entry, path: posix.normalize(entry.path) }));
  }

  private writeRecord(entries: Entry[]): void {
    try {
      mkdirSync(dirname(this.recordPath), { recursive: true, mode: 0o700 });
      // A regular file as its bare path (the record's first form), anything else with its kind.
      const written = entries.map((entry) => (entry.kind === "file" ? entry.path : entry));
      writePrivateFile(this.recordPath, `${JSON.stringify(written, null, 2)}\n`);
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

// Rewriting a file that already holds the declared bytes, mode and owner would only wake whatever watches it.
async function holds(
  target: string,
  existing: Stats,
  content: Buffer,
  mode: number,
  owner: { uid?: number | undefined; gid?: number | undefined },
): Promise<boolean> {
  if (!existing.isFile() || (existing.mode & 0o7777) !== mode || existing.size !== content.length)
    return false;
  if (
    (owner.uid !== undefined && existing.uid !== owner.uid) ||
    (owner.gid !== undefined && existing.gid !== owner.gid)
  )
    return false;
  return (await readFile(target)).equals(content);
}

function fileItems(items: readonly DeclaredItem[]): FileItem[] {
  return items.filter(
    (item): item is FileItem => item.type === "file" || item.type === "directory" || item.type === "symlink",
  );
}

/** Directories before what goes in them (shallowest first); the declaration's order otherwise. */
function inApplyOrder(items: readonly FileItem[]): FileItem[] {
  const directories = items
    .filter((item) => item.type === "directory")
    .sort((a, b) => a.path.split("/").length - b.path.split("/").length);
  return [...directories, ...items.filter((item) => item.type !== "directory")];
}

function modeOf(item: FileItem): number {
  const text =
    item.type === "symlink" ? "0777" : (item.mode ?? (item.type === "directory" ? "0755" : defaultMode));
  if (!/^[0-7]{3,4}$/.test(text)) throw new Refusal(`${JSON.stringify(text)} is not an octal file mode`);
  return parseInt(text, 8);
}
function contentOf(item: Extract<FileItem, { type: "file" }>): Buffer {
  return item.content_base64 === undefined
    ? Buffer.from(item.content ?? "", "utf8")
    : Buffer.from(item.content_base64, "base64");
}

function kindOf(stats: Stats): string {
  if (stats.isSymbolicLink()) return "symlink";
  if (stats.isDirectory()) return "directory";
  if (stats.isFile()) return "file";
  return "special file";
}

function octal(mode: number): string {
  return mode.toString(8).padStart(4, "0");
}

/**
 * Users and groups by name, from the root's own `etc/passwd` and `etc/group` (under a scratch root, its files, never
 * the machine's), read once per apply: an owner declared by name is looked up where the user applier made it.
 */
class Accounts {
  private users: Map<string, number> | undefined;
  private groups: Map<string, number> | undefined;

  constructor(private readonly realRoot: string) {}

  ids(item: FileItem): { uid?: number; gid?: number } {
    if (item.type === "symlink") return {};
    const uid = item.owner === undefined ? undefined : this.idOf(item.owner, "passwd");
    const gid = item.group === undefined ? undefined : this.idOf(item.group, "group");
    return { ...(uid === undefined ? {} : { uid }), ...(gid === undefined ? {} : { gid }) };
  }

  private idOf(name: string | number, file: "passwd" | "group"): number {
    if (typeof name === "number") return name;
    const table = file === "passwd" ? (this.users ??= this.read(file)) : (this.groups ??= this.read(file));
    const id = table.get(name);
    if (id === undefined)
      throw new Refusal(
        `no ${file === "passwd" ? "user" : "group"} named ${name} in ${join(this.realRoot, "etc", file)}`,
      );
    return id;
  }

  private read(file: "passwd" | "group"): Map<string, number> {
    const path = join(this.realRoot, "etc", file);
    const text = lstatSync(path, { throwIfNoEntry: false }) === undefined ? "" : readFileSync(path, "utf8");
    const ids = new Map<string, number>();
    for (const line of text.split("\n")) {
      const [name, , id] = line.split(":");
      if (name !== undefined && name !== "" && id !== undefined && /^\d+$/.test(id))
        ids.set(name, Number(id));
    }
    return ids;
  }
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
