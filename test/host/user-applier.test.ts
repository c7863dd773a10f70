import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { ItemResult } from "../../src/host/appliers.js";
import { HostStateError } from "../../src/host/state.js";
import { parseGroup, parsePasswd, UserApplier } from "../../src/host/user-applier.js";
import type { DeclaredItem } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import { tempDir } from "../support/tmp.js";

type UserItem = Extract<DeclaredItem, { type: "user" }>;
type GroupItem = Extract<DeclaredItem, { type: "group" }>;

// The tools need root, and these tests change only a scratch root's account files.
const canRun =
  process.getuid?.() === 0 && spawnSync("/usr/sbin/useradd", ["--help"], { stdio: "ignore" }).status === 0;
const skip = canRun ? false : "needs root and the shadow tools (useradd)";

const scratch = tempDir("mesh-user-applier-");
after(() => scratch.remove());
let cases = 0;

// The machine's own account files, read before any test and compared after all of them.
const machineFiles = ["/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow"].filter((path) =>
  existsSync(path),
);
const machineBefore = new Map(machineFiles.map((path) => [path, readFileSync(path, "utf8")]));

/** A scratch root holding only root and `olduser` (uid 1500, not made by the mesh), and an applier on it. */
function freshCase(): { root: string; stateDir: string; applier: UserApplier; logs: string[] } {
  cases += 1;
  const base = join(scratch.path, `case-${cases}`);
  const root = join(base, "root");
  mkdirSync(join(root, "etc"), { recursive: true });
  writeFileSync(
    join(root, "etc", "passwd"),
    "root:x:0:0:root:/root:/bin/bash\nolduser:x:1500:1500::/home/olduser:/bin/sh\n",
  );
  writeFileSync(join(root, "etc", "group"), "root:x:0:\nolduser:x:1500:\n");
  writeFileSync(join(root, "etc", "shadow"), "root:*:19000:0:99999:7:::\nolduser:!:19000:0:99999:7:::\n", {
    mode: 0o640,
  });
  writeFileSync(join(root, "etc", "gshadow"), "root:*::\nolduser:!::\n", { mode: 0o640 });
  const stateDir = join(base, "state");
  const logs: string[] = [];
  const log = createLogger({ level: "debug", pretty: false, write: (line) => void logs.push(line) });
  return { root, stateDir, logs, applier: new UserApplier({ root, stateDir, log }) };
}

function user(name: string, fields: Omit<UserItem, "id" | "type" | "name"> = {}): UserItem {
  return { id: `user:${name}`, type: "user", name, ...fields };
}

function group(name: string, fields: Omit<GroupItem, "id" | "type" | "name"> = {}): GroupItem {
  return { id: `group:${name}`, type: "group", name, ...fields };
}

function etc(root: string, name: string): string {
  return readFileSync(join(root, "etc", name), "utf8");
}

function lineOf(root: string, file: string, name: string): string | undefined {
  return etc(root, file)
    .split("\n")
    .find((line) => line.startsWith(`${name}:`));
}

function applied(results: ItemResult[]): void {
  for (const result of results) assert.equal(result.state, "applied", JSON.stringify(result));
}

const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnly0000000000000000000 ops@example";
// The example user, a group, and a user in groups with keys.
const declared = (): DeclaredItem[] => [
  group("deploy", { gid: 1600 }),
  user("app", { uid: 1777, shell: "/usr/sbin/nologin" }),
  user("web", { uid: 1778, group: "deploy", groups: ["olduser"], home: "/srv/web", authorized_keys: [key] }),
];

describe("user applier", { skip }, () => {
  before(() => assert.ok(machineFiles.includes("/etc/passwd")));
  after(() => {
    for (const [path, text] of machineBefore)
      assert.equal(readFileSync(path, "utf8"), text, `${path} changed`);
  });

  test("user applier — creates groups and users in the scratch root's files, never the machine's", async () => {
    const { root, applier, stateDir } = freshCase();
    const machinePasswd = readFileSync("/etc/passwd", "utf8");
    const results = await applier.apply(declared());
    assert.deepEqual(
      results.map((result) => result.id),
      ["group:deploy", "user:app", "user:web"],
    );
    applied(results);

    assert.equal(lineOf(root, "group", "deploy"), "deploy:x:1600:");
    assert.match(lineOf(root, "passwd", "app") ?? "", /^app:x:1777:\d+::\/home\/app:\/usr\/sbin\/nologin$/);
    // Undeclared, app's primary group is one of its own name, made with it.
    const appGroup = parseGroup(etc(root, "group")).get("app");
    assert.equal(parsePasswd(etc(root, "passwd")).get("app")?.gid, appGroup?.gid);
    assert.match(lineOf(root, "passwd", "web") ?? "", /^web:x:1778:1600::\/srv\/web:/);
    assert.deepEqual(parseGroup(etc(root, "group")).get("olduser")?.members, ["web"]);
    assert.ok(lineOf(root, "shadow", "app") !== undefined && lineOf(root, "shadow", "web") !== undefined);
    assert.ok(lineOf(root, "gshadow", "deploy") !== undefined);

    // Homes made under the root, the user's; keys 0600 in a 0700 .ssh, the user's.
    const home = statSync(join(root, "home", "app"));
    assert.ok(home.isDirectory());
    assert.equal(home.uid, 1777);
    assert.equal(home.mode & 0o7777, 0o700);
    const ssh = statSync(join(root, "srv", "web", ".ssh"));
    assert.equal(ssh.mode & 0o7777, 0o700);
    assert.equal(ssh.uid, 1778);
    const keys = join(root, "srv", "web", ".ssh", "authorized_keys");
    assert.equal(readFileSync(keys, "utf8"), `${key}\n`);
    assert.equal(statSync(keys).mode & 0o7777, 0o600);
    assert.equal(statSync(keys).uid, 1778);
    assert.equal(statSync(keys).gid, 1600);

    for (const name of ["app", "web", "deploy"]) {
      assert.ok(!readFileSync("/etc/passwd", "utf8").includes(`\n${name}:x:17`), `${name} in /etc/passwd`);
    }
    assert.equal(readFileSync("/etc/passwd", "utf8"), machinePasswd);
    assert.ok(!existsSync("/srv/web/.ssh/authorized_keys"), "keys written outside the scratch root");

    const record = JSON.parse(readFileSync(join(stateDir, "users.json"), "utf8")) as {
      users: Array<{ name: string }>;
      groups: Array<{ name: string }>;
    };
    assert.deepEqual(
      record.users.map((entry) => entry.name),
      ["app", "web"],
    );
    assert.deepEqual(
      record.groups.map((entry) => entry.name),
      ["app", "deploy"],
    );
    assert.deepEqual(await applier.verify(declared()), []);
  });

  test("user applier — a second apply of the same items changes nothing", async () => {
    const { root, applier, logs } = freshCase();
    applied(await applier.apply(declared()));
    const before = ["passwd", "group", "shadow", "gshadow"].map((name) => etc(root, name));
    logs.length = 0;
    applied(await applier.apply(declared()));
    assert.deepEqual(
      ["passwd", "group", "shadow", "gshadow"].map((name) => etc(root, name)),
      before,
    );
    assert.deepEqual(logs, []);
  });

  test("user applier — a changed shell is applied with usermod, and only that", async () => {
    const { root, applier, logs } = freshCase();
    applied(await applier.apply(declared()));
    logs.length = 0;
    const changed = declared().map((item) =>
      item.id === "user:app" ? user("app", { uid: 1777, shell: "/bin/sh" }) : item,
    );
    applied(await applier.apply(changed));
    assert.match(lineOf(root, "passwd", "app") ?? "", /^app:x:1777:.*:\/bin\/sh$/);
    const events = logs.map((line) => JSON.parse(line) as { event: string; changed?: string[] });
    assert.deepEqual(
      events.map((entry) => entry.event),
      ["user_changed"],
    );
    assert.deepEqual(events[0]?.changed, ["shell /usr/sbin/nologin, not /bin/sh"]);
    assert.deepEqual(await applier.verify(changed), []);
  });

  test("user applier — verify reports a hand-edited shell and a deleted user, and apply restores them", async () => {
    const { root, applier } = freshCase();
    applied(await applier.apply(declared()));
    const passwd = etc(root, "passwd");
    const edited = passwd
      .split("\n")
      .filter((line) => !line.startsWith("web:"))
      .map((line) => (line.startsWith("app:") ? line.replace(/\/usr\/sbin\/nologin$/, "/bin/bash") : line))
      .join("\n");
    writeFileSync(join(root, "etc", "passwd"), edited);
    const before = readFileSync(join(root, "etc", "passwd"), "utf8");

    const drifts = await applier.verify(declared());
    assert.deepEqual(drifts, [
      { id: "user:app", what: "shell /bin/bash, not /usr/sbin/nologin" },
      { id: "user:web", what: "missing" },
    ]);
    assert.equal(etc(root, "passwd"), before, "verify changed nothing");

    applied(await applier.apply(declared()));
    assert.match(lineOf(root, "passwd", "app") ?? "", /:\/usr\/sbin\/nologin$/);
    assert.match(lineOf(root, "passwd", "web") ?? "", /^web:x:1778:1600::\/srv\/web:/);
    assert.deepEqual(await applier.verify(declared()), []);
  });

  test("user applier — verify reports changed keys, a lost group and another gid", async () => {
    const { root, applier } = freshCase();
    applied(await applier.apply([...declared(), group("ops", { gid: 1601 })]));
    writeFileSync(join(root, "srv", "web", ".ssh", "authorized_keys"), "ssh-ed25519 AAAA intruder\n");
    writeFileSync(
      join(root, "etc", "group"),
      etc(root, "group")
        .split("\n")
        .filter((line) => !line.startsWith("ops:"))
        .map((line) => (line.startsWith("deploy:") ? line.replace(":1600:", ":1650:") : line))
        .join("\n"),
    );
    const drifts = await applier.verify([...declared(), group("ops", { gid: 1601 })]);
    assert.deepEqual(drifts, [
      { id: "group:deploy", what: "gid 1650, not 1600" },
      { id: "user:web", what: "primary group 1600, not deploy; authorized_keys content changed" },
      { id: "group:ops", what: "missing" },
    ]);
    applied(await applier.apply([...declared(), group("ops", { gid: 1601 })]));
    assert.equal(readFileSync(join(root, "srv", "web", ".ssh", "authorized_keys"), "utf8"), `${key}\n`);
    assert.deepEqual(await applier.verify([...declared(), group("ops", { gid: 1601 })]), []);
  });

  test("user applier — a user that was there before is refused without adopt, and managed with it", async () => {
    const { root, applier, stateDir } = freshCase();
    const before = etc(root, "passwd");
    const refused = await applier.apply([user("olduser", { shell: "/bin/bash" })]);
    assert.deepEqual(refused, [
      {
        id: "user:olduser",
        state: "failed",
        reason: "user olduser exists and was not made by the mesh; declare adopt: true to manage it",
      },
    ]);
    assert.equal(etc(root, "passwd"), before);
    const refusedGroup = await applier.apply([group("olduser", { gid: 1501 })]);
    assert.deepEqual(refusedGroup, [
      {
        id: "group:olduser",
        state: "failed",
        reason: "group olduser exists and was not made by the mesh; declare adopt: true to manage it",
      },
    ]);

    mkdirSync(join(root, "home", "olduser"), { recursive: true });
    writeFileSync(join(root, "home", "olduser", "notes"), "kept");
    applied(await applier.apply([user("olduser", { shell: "/bin/bash", adopt: true })]));
    assert.equal(lineOf(root, "passwd", "olduser"), "olduser:x:1500:1500::/home/olduser:/bin/bash");
    const record = readFileSync(join(stateDir, "users.json"), "utf8");
    assert.match(record, /"name": "olduser"/);
    // Adopted, it was there before the mesh: no longer declared, it is let go as it is, home and all.
    applied(await applier.apply([]));
    assert.equal(lineOf(root, "passwd", "olduser"), "olduser:x:1500:1500::/home/olduser:/bin/bash");
    assert.equal(readFileSync(join(root, "home", "olduser", "notes"), "utf8"), "kept");
  });

  test("user applier — removing from the declaration removes only the mesh's users and groups", async () => {
    const { root, applier } = freshCase();
    applied(await applier.apply(declared()));
    assert.ok(existsSync(join(root, "home", "app")));
    const results = await applier.apply([group("deploy", { gid: 1600 })]);
    applied(results);
    assert.deepEqual(
      results.map((result) => result.id),
      ["group:deploy"],
    );
    assert.equal(lineOf(root, "passwd", "app"), undefined);
    assert.equal(lineOf(root, "passwd", "web"), undefined);
    assert.equal(lineOf(root, "shadow", "app"), undefined);
    // app's own group went with it; the declared group stays; web left olduser's members.
    assert.equal(lineOf(root, "group", "app"), undefined);
    assert.equal(lineOf(root, "group", "deploy"), "deploy:x:1600:");
    assert.equal(lineOf(root, "group", "olduser"), "olduser:x:1500:");
    // The homes the mesh made went with their users.
    assert.ok(!existsSync(join(root, "home", "app")));
    assert.ok(!existsSync(join(root, "srv", "web")));
    assert.equal(lineOf(root, "passwd", "olduser"), "olduser:x:1500:1500::/home/olduser:/bin/sh");
    assert.equal(lineOf(root, "passwd", "root"), "root:x:0:0:root:/root:/bin/bash");

    applied(await applier.apply([]));
    assert.equal(lineOf(root, "group", "deploy"), undefined);
    assert.equal(lineOf(root, "group", "olduser"), "olduser:x:1500:");
  });

  test("user applier — a uid another user holds fails with useradd's message, and the rest is applied", async () => {
    const { root, applier } = freshCase();
    const results = await applier.apply([user("dup", { uid: 1500 }), user("fine", { uid: 1700 })]);
    assert.deepEqual(results[0], {
      id: "user:dup",
      state: "failed",
      reason: "could not create user dup: useradd: UID 1500 is not unique",
    });
    assert.equal(results[1]?.state, "applied");
    assert.equal(lineOf(root, "passwd", "dup"), undefined);

    const changed = await applier.apply([user("fine", { uid: 1500 })]);
    assert.deepEqual(changed, [
      {
        id: "user:fine",
        state: "failed",
        reason: "could not change user fine: usermod: UID '1500' already exists",
      },
    ]);
    const missingGroup = await applier.apply([
      user("fine", { uid: 1700 }),
      user("lost", { group: "nosuch" }),
    ]);
    assert.deepEqual(missingGroup[1], {
      id: "user:lost",
      state: "failed",
      reason: "could not create user lost: useradd: group 'nosuch' does not exist",
    });
  });

  test("user applier — a symbolic link at ~/.ssh is not written through", async () => {
    const { root, applier } = freshCase();
    applied(await applier.apply(declared()));
    const outside = join(root, "..", "outside");
    mkdirSync(outside);
    const ssh = join(root, "srv", "web", ".ssh");
    spawnSync("rm", ["-r", ssh]);
    spawnSync("ln", ["-s", outside, ssh]);
    const results = await applier.apply(declared());
    const web = results.find((result) => result.id === "user:web");
    assert.deepEqual(web, {
      id: "user:web",
      state: "failed",
      reason: "/srv/web/.ssh is not a directory; not writing authorized_keys through it",
    });
    assert.ok(!existsSync(join(outside, "authorized_keys")));
  });

  test("user applier — a damaged record stops the apply rather than guess", async () => {
    const { applier, stateDir } = freshCase();
    mkdirSync(stateDir, { recursive: true });
    writeFileSync(join(stateDir, "users.json"), '{"users": "app"}');
    await assert.rejects(applier.apply(declared()), HostStateError);
  });
});

test("user applier — passwd and group lines are read carefully", () => {
  const users = parsePasswd(
    [
      "# a comment",
      "",
      "root:x:0:0:root:/root:/bin/bash",
      "+nisuser::::::",
      "short:x:1",
      "bad:x:one:1::/home/bad:/bin/sh",
      "app:x:1777:1777:App,,,:/home/app:",
      "app:x:9999:9999::/elsewhere:/bin/sh",
      "win:x:5:5::/home/win:/bin/sh\r",
    ].join("\n"),
  );
  assert.deepEqual([...users.keys()], ["root", "app", "win"]);
  assert.deepEqual(users.get("app"), { name: "app", uid: 1777, gid: 1777, home: "/home/app", shell: "" });
  assert.equal(users.get("win")?.shell, "/bin/sh");
  const groups = parseGroup("root:x:0:\nwheel:x:10:a,b,\n-nis\nodd:x:12\n");
  assert.deepEqual(
    [...groups.values()],
    [
      { name: "root", gid: 0, members: [] },
      { name: "wheel", gid: 10, members: ["a", "b"] },
    ],
  );
});
