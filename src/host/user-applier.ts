/**
 * The user applier: makes the groups and users a declaration names exist as declared, with the system's own tools
 * (groupadd/groupmod/groupdel, useradd/usermod/userdel), and removes the ones it made earlier that are no longer
 * declared — only those. A user or group that was there before the mesh is refused unless its item says
 * `adopt: true`. It can also say, changing nothing, where they have drifted from what was declared.
 */
import { execFile } from "node:child_process";
import type { ExecFileException } from "node:child_process";
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  fstatSync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { chmod, chown, mkdir, realpath, rm, stat } from "node:fs/promises";
import { basename, join, posix, relative } from "node:path";
import { z } from "zod";
import { writePrivateFile } from "../keys/index.js";
import type { DeclaredItem } from "../link/index.js";
import { errorText } from "../log.js";
import type { Logger } from "../log.js";
import type { Drift, ItemResult, KindApplier } from "./appliers.js";
import { ApplierError } from "./appliers.js";
import { HostStateError } from "./state.js";

type UserItem = Extract<DeclaredItem, { type: "user" }>;
type GroupItem = Extract<DeclaredItem, { type: "group" }>;

export interface UserApplierOptions {
  /** Where the account files live: `/` on a node, a scratch directory in tests. */
  root: string;
  /** The agent's state directory; the record of what this applier made is `users.json` in it. */
  stateDir: string;
  log: Logger;
  /** How long one run of a tool may take before it is stopped and its item fails. */
  toolTimeoutMs?: number;
}

function compileUserApplierOptions(options: UserApplierOptions): Required<UserApplierOptions> {
  return { toolTimeoutMs: 60_000, ...options };
}

export const userRecordFile = "users.json";
/** A home the mesh makes: the user's own, like adduser's default on Debian; no skeleton files are copied in. */
const homeMode = 0o700;
const sshDirMode = 0o700;
const keysMode = 0o600;
/** Directories made on the way to a home (`/home` under a scratch root). */
const parentMode = 0o755;

// A fixed PATH so nothing inherited can stand in for the tools, and the C locale so their messages, which reach the
// report as reasons, read the same on every node.
const toolEnv = { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", LC_ALL: "C" };

type Tool = "groupadd" | "groupmod" | "groupdel" | "useradd" | "usermod" | "userdel";

const madeSchema = z.strictObject({
  users: z.array(
    z.strictObject({
      name: z.string().min(1),
      uid: z.int().min(0),
      /** The home directory the mesh made for it, removed with it. */
      madeHome: z.string().optional(),
      /** It was there before the mesh (declared with adopt): when no longer declared it is let go, not removed. */
      adopted: z.boolean().optional(),
    }),
  ),
  groups: z.array(
    z.strictObject({
      name: z.string().min(1),
      gid: z.int().min(0),
      /** Made by useradd as this user's own group: it stays while the user does and goes after it. */
      ownGroupOf: z.string().optional(),
      /** It was there before the mesh (declared with adopt): when no longer declared it is let go, not removed. */
      adopted: z.boolean().optional(),
    }),
  ),
});
type MadeUser = z.infer<typeof madeSchema>["users"][number];
type MadeGroup = z.infer<typeof madeSchema>["groups"][number];
interface Made {
  users: Map<string, MadeUser>;
  groups: Map<string, MadeGroup>;
}

/** An item the applier will not apply, with the reason a person reads in the report. */
class Refusal extends Error {
  override name = "Refusal";
}

/** A tool exited with an error; the message carries what it wrote on stderr. */
class ToolFailed extends Error {
  override name = "ToolFailed";
}

/**
 * Applies `user` and `group` items to the account files under `root`. Under a root other than `/` the tools run with
 * `--prefix <root>`: they then read and write `<root>/etc/{passwd,group,shadow,gshadow}` and nothing of the
 * machine's own (checked with strace on Debian 12's shadow 4.13). They take their defaults from the tree too, not
 * from the machine's login.defs (a scratch root has none, so useradd alone gives group 100): hence `-U` is explicit
 * below. `--root`
 * chroot(2)s into the tree instead: it also works on a tree holding only those four files, but it takes the tree for
 * a system (it checks shells inside it and runs the cache flushes there), which a scratch root is not.
 */
export class UserApplier implements KindApplier {
  readonly types = ["user", "group"] as const;
  private readonly options: Required<UserApplierOptions>;
  private readonly recordPath: string;

  constructor(options: UserApplierOptions) {
    this.options = compileUserApplierOptions(options);
    this.recordPath = join(this.options.stateDir, userRecordFile);
  }

  /**
   * Groups first (users name them), then users, then removals: users before groups, so a group is no longer
   * anyone's primary group when it goes.
   *
   * @throws ApplierError when root cannot be resolved; HostStateError when the record cannot be read or written.
   */
  async apply(given: readonly DeclaredItem[]): Promise<ItemResult[]> {
    const realRoot = await this.resolveRoot();
    const made = this.readRecord();
    const results: ItemResult[] = [];
    const declaredGroups = new Set<string>();
    const declaredUsers = new Set<string>();

    for (const item of given.filter((item): item is GroupItem => item.type === "group")) {
      const first = !declaredGroups.has(item.name);
      declaredGroups.add(item.name);
      results.push(
        await this.settle(item.id, `group ${item.name}`, made, async () => {
          if (!first) throw new Refusal(`group ${item.name} is declared by more than one item`);
          await this.applyGroup(realRoot, item, made);
        }),
      );
    }
    for (const item of given.filter((item): item is UserItem => item.type === "user")) {
      const first = !declaredUsers.has(item.name);
      declaredUsers.add(item.name);
      results.push(
        await this.settle(item.id, `user ${item.name}`, made, async () => {
          if (!first) throw new Refusal(`user ${item.name} is declared by more than one item`);
          await this.applyUser(realRoot, item, made);
        }),
      );
    }

    for (const user of [...made.users.values()].filter((user) => !declaredUsers.has(user.name))) {
      const failed = await this.settle(`user:${user.name}`, `remove user ${user.name}`, made, () =>
        this.removeUser(realRoot, user, made),
      );
      if (failed.state === "failed") results.push(failed);
    }
    const leaving = [...made.groups.values()].filter(
      (group) =>
        !declaredGroups.has(group.name) &&
        (group.ownGroupOf === undefined || !made.users.has(group.ownGroupOf)),
    );
    for (const group of leaving) {
      const failed = await this.settle(`group:${group.name}`, `remove group ${group.name}`, made, () =>
        this.removeGroup(realRoot, group, made),
      );
      if (failed.state === "failed") results.push(failed);
    }
    return results;
  }

  /** Where the declared users and groups differ from the account files under root now. */
  async verify(given: readonly DeclaredItem[]): Promise<Drift[]> {
    const items = given.filter(
      (item): item is UserItem | GroupItem => item.type === "user" || item.type === "group",
    );
    let realRoot: string;
    let files: AccountFiles;
    try {
      realRoot = await this.resolveRoot();
      files = readAccountFiles(realRoot);
    } catch (error) {
      return items.map((item) => ({ id: item.id, what: `cannot be checked: ${errorText(error)}` }));
    }
    const drifts: Drift[] = [];
    for (const item of items) {
      const differs =
        item.type === "group"
          ? groupDifferences(item, files)
          : await this.userDifferences(realRoot, item, files).catch((error: unknown) => [
              `cannot be checked: ${errorText(error)}`,
            ]);
      if (differs.length > 0) drifts.push({ id: item.id, what: differs.join("; ") });
    }
    return drifts;
  }

  private async applyGroup(realRoot: string, item: GroupItem, made: Made): Promise<void> {
    const existing = readAccountFiles(realRoot).groups.get(item.name);
    const mine = made.groups.get(item.name);
    if (existing === undefined) {
      await this.run(
        realRoot,
        "groupadd",
        [...idArgs("-g", item.gid), item.name],
        `create group ${item.name}`,
      );
      const now = mustFind(readAccountFiles(realRoot).groups, item.name, "group", realRoot);
      made.groups.set(item.name, { name: item.name, gid: now.gid });
      this.options.log.info("group_created", { group: item.name, gid: now.gid });
      return;
    }
    if (mine === undefined && item.adopt !== true) throw notMadeByMesh("group", item.name);
    if (item.gid !== undefined && item.gid !== existing.gid) {
      // groupmod moves the users whose primary group it is along; files owned by the old gid keep it.
      await this.run(realRoot, "groupmod", ["-g", String(item.gid), item.name], `change group ${item.name}`);
      this.options.log.info("group_changed", { group: item.name, gid: item.gid, was: existing.gid });
    }
    if (mine === undefined) this.options.log.info("group_adopted", { group: item.name });
    // Declared now, it is a group of its own, no longer one that goes with a user.
    const adopted = mine === undefined || mine.adopted === true;
    made.groups.set(item.name, {
      name: item.name,
      gid: item.gid ?? existing.gid,
      ...(adopted ? { adopted } : {}),
    });
  }

  private async applyUser(realRoot: string, item: UserItem, made: Made): Promise<void> {
    const files = readAccountFiles(realRoot);
    const existing = files.users.get(item.name);
    const mine = made.users.get(item.name);
    if (existing === undefined) {
      // -M: the home is made below, under root and owned by the user, without the machine's skeleton files.
      const args = ["-M", ...idArgs("-u", item.uid)];
      let ownGroup = false;
      if (item.group !== undefined) args.push("-g", String(item.group));
      // Undeclared, the primary group is one of the user's own name: joined when it is there, made when not.
      else if (files.groups.has(item.name)) args.push("-g", item.name);
      else {
        args.push("-U");
        ownGroup = true;
      }
      if (item.groups !== undefined && item.groups.length > 0) args.push("-G", item.groups.join(","));
      if (item.shell !== undefined) args.push("-s", item.shell);
      if (item.home !== undefined) args.push("-d", item.home);
      await this.run(realRoot, "useradd", [...args, item.name], `create user ${item.name}`);
      const now = readAccountFiles(realRoot);
      const entry = mustFind(now.users, item.name, "user", realRoot);
      made.users.set(item.name, { ...mine, name: item.name, uid: entry.uid });
      const group = now.groups.get(item.name);
      if (ownGroup && group !== undefined)
        made.groups.set(item.name, { name: item.name, gid: group.gid, ownGroupOf: item.name });
      // Kept at once: a user the mesh made and forgot would be refused as someone else's next time.
      this.writeRecord(made);
      this.options.log.info("user_created", { user: item.name, uid: entry.uid });
    } else {
      if (mine === undefined && item.adopt !== true) throw notMadeByMesh("user", item.name);
      const changes = userChanges(item, existing, files);
      if (changes.args.length > 0) {
        await this.run(realRoot, "usermod", [...changes.args, item.name], `change user ${item.name}`);
        this.options.log.info("user_changed", { user: item.name, changed: changes.what });
      }
      if (mine === undefined) this.options.log.info("user_adopted", { user: item.name });
      const adopted = mine === undefined || mine.adopted === true;
      made.users.set(item.name, {
        ...mine,
        name: item.name,
        uid: item.uid ?? existing.uid,
        ...(adopted ? { adopted } : {}),
      });
    }
    const entry = mustFind(readAccountFiles(realRoot).users, item.name, "user", realRoot);
    await this.ensureHome(realRoot, entry, made);
    if (item.authorized_keys !== undefined) await this.ensureKeys(realRoot, entry, item.authorized_keys);
  }

  /** Makes the user's home under root when it is not there, owned by the user; one that is there is left as it is. */
  private async ensureHome(realRoot: string, entry: PasswdEntry, made: Made): Promise<void> {
    const home = plainHome(entry);
    const parent = await this.within(realRoot, posix.dirname(home), "create");
    const target = join(parent, basename(home));
    if (lstatSync(target, { throwIfNoEntry: false }) !== undefined) return;
    await mkdir(target, { mode: homeMode });
    await chown(target, entry.uid, entry.gid);
    // mkdir's mode passes through the umask.
    await chmod(target, homeMode);
    const record = made.users.get(entry.name);
    if (record !== undefined) made.users.set(entry.name, { ...record, madeHome: home });
    this.options.log.info("user_home_created", { user: entry.name, home });
  }

  /** Writes `<home>/.ssh/authorized_keys` whole (0600, in a 0700 `.ssh`, both the user's) when it differs. */
  private async ensureKeys(realRoot: string, entry: PasswdEntry, lines: readonly string[]): Promise<void> {
    const home = plainHome(entry);
    const homeDir = await this.within(realRoot, home, "look");
    if (homeDir === undefined) throw new Refusal(`the home ${home} of user ${entry.name} is not a directory`);
    const sshPath = join(homeDir, ".ssh");
    const found = lstatSync(sshPath, { throwIfNoEntry: false });
    if (found === undefined) {
      await mkdir(sshPath, { mode: sshDirMode });
    } else if (!found.isDirectory()) {
      // The user owns the home: a link there could point root's write anywhere.
      throw new Refusal(`${home}/.ssh is not a directory; not writing authorized_keys through it`);
    }
    const dir = openSync(sshPath, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      const dirStats = fstatSync(dir);
      if (dirStats.uid !== entry.uid || dirStats.gid !== entry.gid) fchownSync(dir, entry.uid, entry.gid);
      if ((dirStats.mode & 0o7777) !== sshDirMode) fchmodSync(dir, sshDirMode);
      // Everything below goes through the open directory (/proc/self/fd/N is Linux's openat for a path API), so the
      // user swapping .ssh for a link after the check above cannot move the write.
      const inDir = `/proc/self/fd/${dir}`;
      const content = keysContent(lines);
      if (keysDifferences(join(inDir, "authorized_keys"), content, entry.uid).length === 0) return;
      const temporary = join(inDir, `.authorized_keys.mesh-${process.pid}`);
      const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;
      const fd = openSync(temporary, flags, keysMode);
      try {
        fchownSync(fd, entry.uid, entry.gid);
        fchmodSync(fd, keysMode);
        writeFileSync(fd, content);
        fsyncSync(fd);
      } catch (error) {
        closeSync(fd);
        unlinkSync(temporary);
        throw error;
      }
      closeSync(fd);
      renameSync(temporary, join(inDir, "authorized_keys"));
      this.options.log.info("user_keys_written", { user: entry.name, keys: lines.length });
    } finally {
      closeSync(dir);
    }
  }

  /**
   * Removes a user the mesh made, and the home only when the mesh made that directory: a home left behind would
   * belong, by number, to the next user given the same uid. A home that was there before is left. A user it adopted
   * was there before the mesh, and is let go as it is.
   */
  private async removeUser(realRoot: string, user: MadeUser, made: Made): Promise<void> {
    if (user.adopted === true) {
      made.users.delete(user.name);
      this.options.log.info("user_released", { user: user.name, why: "adopted, no longer declared" });
      return;
    }
    const existing = readAccountFiles(realRoot).users.get(user.name);
    if (existing === undefined) {
      made.users.delete(user.name);
      return;
    }
    if (existing.uid !== user.uid) {
      made.users.delete(user.name);
      throw new Refusal(
        `user ${user.name} now has uid ${existing.uid}, not the ${user.uid} the mesh gave it: it was made again ` +
          `by someone else, so it is left in place and no longer the mesh's`,
      );
    }
    await this.run(realRoot, "userdel", [user.name], `remove user ${user.name}`);
    made.users.delete(user.name);
    this.options.log.info("user_removed", { user: user.name });
    if (user.madeHome !== undefined) await this.removeHome(realRoot, user.madeHome, user);
  }

  private async removeHome(realRoot: string, home: string, user: MadeUser): Promise<void> {
    const parent = await this.within(realRoot, posix.dirname(home), "look");
    const target = parent === undefined ? undefined : join(parent, basename(home));
    const found = target === undefined ? undefined : lstatSync(target, { throwIfNoEntry: false });
    if (target === undefined || found === undefined) return;
    if (!found.isDirectory() || found.uid !== user.uid) {
      this.options.log.warn("user_home_kept", {
        user: user.name,
        home,
        why: "no longer the directory the mesh made (another kind or owner)",
      });
      return;
    }
    // rm does not follow symbolic links inside the tree: it removes the links.
    await rm(target, { recursive: true });
    this.options.log.info("user_home_removed", { user: user.name, home });
  }

  private async removeGroup(realRoot: string, group: MadeGroup, made: Made): Promise<void> {
    if (group.adopted === true) {
      made.groups.delete(group.name);
      this.options.log.info("group_released", { group: group.name, why: "adopted, no longer declared" });
      return;
    }
    // On `/`, userdel may already have removed a user's own group (USERGROUPS_ENAB in login.defs).
    const existing = readAccountFiles(realRoot).groups.get(group.name);
    if (existing === undefined) {
      made.groups.delete(group.name);
      return;
    }
    if (existing.gid !== group.gid) {
      made.groups.delete(group.name);
      throw new Refusal(
        `group ${group.name} now has gid ${existing.gid}, not the ${group.gid} the mesh gave it: it was made ` +
          `again by someone else, so it is left in place and no longer the mesh's`,
      );
    }
    await this.run(realRoot, "groupdel", [group.name], `remove group ${group.name}`);
    made.groups.delete(group.name);
    this.options.log.info("group_removed", { group: group.name });
  }

  private async userDifferences(realRoot: string, item: UserItem, files: AccountFiles): Promise<string[]> {
    const entry = files.users.get(item.name);
    if (entry === undefined) return ["missing"];
    const differs = userChanges(item, entry, files).what;
    const home = plainHome(entry);
    const homeDir = await this.within(realRoot, home, "look");
    if (homeDir === undefined) differs.push(`home directory ${home} missing`);
    else if (item.authorized_keys !== undefined) {
      const sshPath = join(homeDir, ".ssh");
      const ssh = lstatSync(sshPath, { throwIfNoEntry: false });
      if (ssh === undefined || !ssh.isDirectory()) differs.push(`${home}/.ssh missing or not a directory`);
      else {
        const keys = keysDifferences(
          join(sshPath, "authorized_keys"),
          keysContent(item.authorized_keys),
          entry.uid,
        );
        differs.push(...keys.map((what) => `authorized_keys ${what}`));
      }
    }
    return differs;
  }

  /** Runs one tool without a shell; fails with its stderr, which names what it refused. */
  private run(realRoot: string, tool: Tool, args: string[], doing: string): Promise<void> {
    const prefix = realRoot === "/" ? [] : ["--prefix", realRoot];
    return new Promise((resolve, reject) => {
      execFile(
        tool,
        [...prefix, ...args],
        { env: toolEnv, timeout: this.options.toolTimeoutMs, encoding: "utf8" },
        (error: ExecFileException | null, _stdout: string, stderr: string) => {
          const said = stderr
            .split("\n")
            .map((line) => line.trim())
            .filter((line) => line !== "");
          if (error === null) {
            // A success can still warn ("missing or non-executable shell"): worth a line, not a failure.
            for (const line of said) this.options.log.warn("user_tool_warning", { tool, message: line });
            resolve();
            return;
          }
          reject(new ToolFailed(`could not ${doing}: ${toolFailure(tool, error, said, this.options)}`));
        },
      );
    });
  }

  private async resolveRoot(): Promise<string> {
    try {
      return await realpath(this.options.root);
    } catch (error) {
      throw new ApplierError(`user applier root ${this.options.root} cannot be used: ${errorText(error)}`, {
        cause: error,
      });
    }
  }

  /**
   * The real directory `path` names under root, walked one component at a time so a symbolic link on the way is
   * followed only while it stays under root. With "create", missing directories are made; with "look", a missing
   * one (or something else in its place) gives undefined.
   */
  private async within(realRoot: string, path: string, mode: "create"): Promise<string>;
  private async within(realRoot: string, path: string, mode: "look"): Promise<string | undefined>;
  private async within(realRoot: string, path: string, mode: "create" | "look"): Promise<string | undefined> {
    let current = realRoot;
    for (const part of path.split("/").filter((name) => name !== "" && name !== ".")) {
      const next = join(current, part);
      const stats = lstatSync(next, { throwIfNoEntry: false });
      if (stats === undefined) {
        if (mode === "look") return undefined;
        await mkdir(next, { mode: parentMode });
        current = next;
      } else if (stats.isSymbolicLink()) {
        const real = await realpath(next);
        if (!isWithin(realRoot, real))
          throw new Refusal(`${path} leads out of the root ${realRoot} through a symbolic link to ${real}`);
        if (!(await stat(real)).isDirectory()) {
          if (mode === "look") return undefined;
          throw new Refusal(`${next} is not a directory`);
        }
        current = real;
      } else if (stats.isDirectory()) {
        current = next;
      } else {
        if (mode === "look") return undefined;
        throw new Refusal(`${next} is not a directory`);
      }
    }
    return current;
  }

  /** Runs one item's step and gives its result; the record is written after each, so nothing made is forgotten. */
  private async settle(id: string, what: string, made: Made, step: () => Promise<void>): Promise<ItemResult> {
    let result: ItemResult;
    try {
      await step();
      result = { id, state: "applied" };
    } catch (error) {
      if (error instanceof HostStateError) throw error;
      const reason =
        error instanceof Refusal || error instanceof ToolFailed
          ? error.message
          : `could not apply ${what}: ${errorText(error)}`;
      result = { id, state: "failed", reason };
    }
    this.writeRecord(made);
    return result;
  }

  private readRecord(): Made {
    let value: unknown;
    try {
      if (lstatSync(this.recordPath, { throwIfNoEntry: false }) === undefined) return emptyMade();
      value = JSON.parse(readFileSync(this.recordPath, "utf8"));
    } catch (error) {
      throw new HostStateError(`could not read the users record ${this.recordPath}: ${errorText(error)}`, {
        cause: error,
      });
    }
    // Without a trustworthy record it cannot tell its own users from others', so it stops rather than guess.
    const parsed = madeSchema.safeParse(value);
    if (!parsed.success)
      throw new HostStateError(
        `the users record ${this.recordPath} is not what this applier writes: ${parsed.error.message}`,
      );
    return {
      users: new Map(parsed.data.users.map((user) => [user.name, user])),
      groups: new Map(parsed.data.groups.map((group) => [group.name, group])),
    };
  }

  private writeRecord(made: Made): void {
    const byName = (a: { name: string }, b: { name: string }) => (a.name < b.name ? -1 : 1);
    const record = {
      users: [...made.users.values()].sort(byName),
      groups: [...made.groups.values()].sort(byName),
    };
    try {
      mkdirSync(this.options.stateDir, { recursive: true, mode: 0o700 });
      writePrivateFile(this.recordPath, `${JSON.stringify(record, null, 2)}\n`);
    } catch (error) {
      throw new HostStateError(`could not write the users record ${this.recordPath}: ${errorText(error)}`, {
        cause: error,
      });
    }
  }
}

/** One line of `etc/passwd`, as far as the applier reads it. */
export interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
  shell: string;
}

/** One line of `etc/group`. */
export interface GroupEntry {
  name: string;
  gid: number;
  members: string[];
}

interface AccountFiles {
  users: Map<string, PasswdEntry>;
  groups: Map<string, GroupEntry>;
}

/**
 * The users in a passwd file by name. Blank lines, comments and NIS `+`/`-` lines are skipped, and so is a line
 * without seven fields or with an id that is not a number; the first line for a name counts, as for getpwnam(3).
 */
export function parsePasswd(text: string): Map<string, PasswdEntry> {
  const users = new Map<string, PasswdEntry>();
  for (const fields of accountLines(text, 7)) {
    const [name = "", , uid = "", gid = "", , home = "", shell = ""] = fields;
    if (!isId(uid) || !isId(gid) || users.has(name)) continue;
    users.set(name, { name, uid: Number(uid), gid: Number(gid), home, shell });
  }
  return users;
}

/** The groups in a group file by name, read as `parsePasswd` reads users; members are the comma-separated list. */
export function parseGroup(text: string): Map<string, GroupEntry> {
  const groups = new Map<string, GroupEntry>();
  for (const fields of accountLines(text, 4)) {
    const [name = "", , gid = "", members = ""] = fields;
    if (!isId(gid) || groups.has(name)) continue;
    groups.set(name, {
      name,
      gid: Number(gid),
      members: members.split(",").filter((member) => member !== ""),
    });
  }
  return groups;
}

function accountLines(text: string, fieldCount: number): string[][] {
  return text
    .split("\n")
    .map((line) => (line.endsWith("\r") ? line.slice(0, -1) : line))
    .filter((line) => line !== "" && !line.startsWith("#") && !line.startsWith("+") && !line.startsWith("-"))
    .map((line) => line.split(":"))
    .filter((fields) => fields.length === fieldCount && fields[0] !== "");
}

function isId(text: string): boolean {
  return /^\d{1,10}$/.test(text) && Number(text) <= 4_294_967_294;
}

function readAccountFiles(realRoot: string): AccountFiles {
  const read = (name: "passwd" | "group") => {
    const path = join(realRoot, "etc", name);
    try {
      return readFileSync(path, "utf8");
    } catch (error) {
      throw new Refusal(`could not read ${path}: ${errorText(error)}`, { cause: error });
    }
  };
  return { users: parsePasswd(read("passwd")), groups: parseGroup(read("group")) };
}

/** What differs between a declared user and its passwd line, as usermod arguments and as a person reads it. */
function userChanges(
  item: UserItem,
  entry: PasswdEntry,
  files: AccountFiles,
): { args: string[]; what: string[] } {
  const args: string[] = [];
  const what: string[] = [];
  if (item.uid !== undefined && item.uid !== entry.uid) {
    args.push("-u", String(item.uid));
    what.push(`uid ${entry.uid}, not ${item.uid}`);
  }
  if (item.group !== undefined) {
    const wanted = typeof item.group === "number" ? item.group : files.groups.get(item.group)?.gid;
    if (wanted !== entry.gid) {
      args.push("-g", String(item.group));
      what.push(`primary group ${groupName(entry.gid, files)}, not ${item.group}`);
    }
  }
  if (item.groups !== undefined) {
    const wanted = [...new Set(item.groups)].sort();
    const now = [...files.groups.values()]
      .filter((group) => group.members.includes(item.name))
      .map((group) => group.name)
      .sort();
    if (wanted.join(",") !== now.join(",")) {
      // An empty list takes the user out of every supplementary group.
      args.push("-G", wanted.join(","));
      what.push(`groups ${listText(now)}, not ${listText(wanted)}`);
    }
  }
  if (item.shell !== undefined && item.shell !== entry.shell) {
    args.push("-s", item.shell);
    what.push(`shell ${entry.shell || "(none)"}, not ${item.shell}`);
  }
  // Without -m: a declaration changing the home does not move what is in the old one; the new one is made empty.
  if (item.home !== undefined && item.home !== entry.home) {
    args.push("-d", item.home);
    what.push(`home ${entry.home || "(none)"}, not ${item.home}`);
  }
  return { args, what };
}

function groupDifferences(item: GroupItem, files: AccountFiles): string[] {
  const entry = files.groups.get(item.name);
  if (entry === undefined) return ["missing"];
  return item.gid !== undefined && item.gid !== entry.gid ? [`gid ${entry.gid}, not ${item.gid}`] : [];
}

/** How an authorized_keys file differs from `content` (read without following a link at its name). */
function keysDifferences(path: string, content: Buffer, uid: number): string[] {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return ["missing"];
    if (code === "ELOOP") return ["is a symbolic link"];
    throw error;
  }
  try {
    const stats = fstatSync(fd);
    if (!stats.isFile()) return ["not a regular file"];
    const differs: string[] = [];
    if (!readFileSync(fd).equals(content)) differs.push("content changed");
    if ((stats.mode & 0o7777) !== keysMode) differs.push(`mode ${octal(stats.mode & 0o7777)}, not 0600`);
    if (stats.uid !== uid) differs.push(`owner ${stats.uid}, not ${uid}`);
    return differs;
  } finally {
    closeSync(fd);
  }
}

function keysContent(lines: readonly string[]): Buffer {
  return Buffer.from(lines.map((line) => `${line}\n`).join(""), "utf8");
}

function toolFailure(
  tool: Tool,
  error: ExecFileException,
  said: string[],
  options: Required<UserApplierOptions>,
): string {
  if (error.code === "ENOENT") return `${tool} is not installed (looked in ${toolEnv.PATH})`;
  if (error.killed === true && error.signal !== null && error.signal !== undefined)
    return `${tool} did not finish within ${options.toolTimeoutMs} ms and was stopped`;
  const status = typeof error.code === "number" ? `exited with status ${error.code}` : errorText(error);
  return said.length > 0 ? said.join("; ") : `${tool} ${status}`;
}

function notMadeByMesh(kind: "user" | "group", name: string): Refusal {
  return new Refusal(`${kind} ${name} exists and was not made by the mesh; declare adopt: true to manage it`);
}

function mustFind<T>(table: Map<string, T>, name: string, kind: "user" | "group", realRoot: string): T {
  const found = table.get(name);
  if (found === undefined)
    throw new Refusal(
      `${kind} ${name} is not in ${join(realRoot, "etc", kind === "user" ? "passwd" : "group")} after the tool ran`,
    );
  return found;
}

/** The home a passwd line names, refused when it could not be a directory under root. */
function plainHome(entry: PasswdEntry): string {
  const home = posix.normalize(entry.home);
  if (!home.startsWith("/") || home === "/" || home.includes("\0") || entry.home.split("/").includes(".."))
    throw new Refusal(
      `user ${entry.name} has home "${entry.home}", which is not a directory the mesh can make`,
    );
  return home;
}

function idArgs(flag: "-u" | "-g", id: number | undefined): string[] {
  return id === undefined ? [] : [flag, String(id)];
}

function groupName(gid: number, files: AccountFiles): string {
  const group = [...files.groups.values()].find((entry) => entry.gid === gid);
  return group === undefined ? String(gid) : group.name;
}

function listText(names: readonly string[]): string {
  return names.length === 0 ? "(none)" : names.join(",");
}

function emptyMade(): Made {
  return { users: new Map(), groups: new Map() };
}

function isWithin(realRoot: string, real: string): boolean {
  const rel = relative(realRoot, real);
  return rel === "" || (rel !== ".." && !rel.startsWith("../") && !posix.isAbsolute(rel));
}

function octal(mode: number): string {
  return mode.toString(8).padStart(4, "0");
}
