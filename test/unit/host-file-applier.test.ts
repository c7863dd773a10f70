import assert from "node:assert/strict";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { FileApplier } from "../../src/host/file-applier.js";
import type { ItemResult } from "../../src/host/appliers.js";
import type { FileItem } from "../../src/host/file-applier.js";
import { HostStateError } from "../../src/host/state.js";
import { tempDir } from "../support/tmp.js";

const scratch = tempDir("mesh-file-applier-");
after(() => scratch.remove());
let cases = 0;

/** A fresh root (with `outside` next to it) and an applier whose record lives outside the root. */
function freshCase(): { root: string; outside: string; record: string; applier: FileApplier } {
  cases += 1;
  const base = join(scratch.path, `case-${cases}`);
  const root = join(base, "root");
  const outside = join(base, "outside");
  mkdirSync(root, { recursive: true });
  mkdirSync(outside);
  const record = join(base, "state", "files.json");
  return { root, outside, record, applier: new FileApplier(root, record) };
}

function file(path: string, content: string, mode?: string): FileItem {
  return mode === undefined
    ? { id: `file:${path}`, type: "file", path, content }
    : { id: `file:${path}`, type: "file", path, content, mode };
}

function recordOf(recordPath: string): unknown {
  return JSON.parse(readFileSync(recordPath, "utf8"));
}

function modeOf(path: string): number {
  return statSync(path).mode & 0o7777;
}

function allApplied(results: ItemResult[]): void {
  assert.deepEqual(
    results.filter((result) => result.state !== "applied"),
    [],
  );
}

void describe("file applier", () => {
  void test("applier — writes each file with its content and mode under root, parents created", async () => {
    const { root, record, applier } = freshCase();
    const results = await applier.apply([
      file("/etc/motd", "hello\n"),
      file("/etc/app/config.yaml", "port: 80\n", "0640"),
      file("/usr/local/bin/tool", "#!/bin/sh\necho hi\n", "0755"),
    ]);
    assert.deepEqual(results, [
      { id: "file:/etc/motd", state: "applied" },
      { id: "file:/etc/app/config.yaml", state: "applied" },
      { id: "file:/usr/local/bin/tool", state: "applied" },
    ]);
    assert.equal(readFileSync(join(root, "etc/motd"), "utf8"), "hello\n");
    assert.equal(modeOf(join(root, "etc/motd")), 0o644);
    assert.equal(readFileSync(join(root, "etc/app/config.yaml"), "utf8"), "port: 80\n");
    assert.equal(modeOf(join(root, "etc/app/config.yaml")), 0o640);
    assert.equal(modeOf(join(root, "usr/local/bin/tool")), 0o755);
    // No temporary file is left beside what was written.
    assert.deepEqual(readdirSync(join(root, "etc")).sort(), ["app", "motd"]);
    assert.deepEqual(recordOf(record), ["/etc/app/config.yaml", "/etc/motd", "/usr/local/bin/tool"]);
  });

  void test("applier — the declared mode is kept whatever the umask", async () => {
    const { root, applier } = freshCase();
    const previous = process.umask(0o077);
    try {
      allApplied(await applier.apply([file("/srv/shared.txt", "x", "0664")]));
    } finally {
      process.umask(previous);
    }
    assert.equal(modeOf(join(root, "srv/shared.txt")), 0o664);
  });

  void test("applier — a file dropped from the set is removed, an unrelated file beside it is left", async () => {
    const { root, record, applier } = freshCase();
    allApplied(await applier.apply([file("/etc/a.conf", "a"), file("/etc/b.conf", "b")]));
    writeFileSync(join(root, "etc/unrelated.conf"), "not the applier's");

    allApplied(await applier.apply([file("/etc/a.conf", "a")]));
    assert.equal(existsSync(join(root, "etc/b.conf")), false);
    assert.equal(readFileSync(join(root, "etc/a.conf"), "utf8"), "a");
    assert.equal(readFileSync(join(root, "etc/unrelated.conf"), "utf8"), "not the applier's");
    assert.deepEqual(recordOf(record), ["/etc/a.conf"]);

    // Declaring nothing removes only what it wrote, and keeps the folders.
    assert.deepEqual(await applier.apply([]), []);
    assert.deepEqual(readdirSync(join(root, "etc")), ["unrelated.conf"]);
    assert.deepEqual(recordOf(record), []);
  });

  void test("applier — a file it never wrote at a declared path is overwritten, and then its own", async () => {
    const { root, record, applier } = freshCase();
    mkdirSync(join(root, "etc"));
    writeFileSync(join(root, "etc/hosts"), "old\n", { mode: 0o600 });
    allApplied(await applier.apply([file("/etc/hosts", "new\n")]));
    assert.equal(readFileSync(join(root, "etc/hosts"), "utf8"), "new\n");
    assert.equal(modeOf(join(root, "etc/hosts")), 0o644);
    assert.deepEqual(recordOf(record), ["/etc/hosts"]);
  });

  void test("applier — a parent that is a symlink to outside root is refused and nothing is written outside", async () => {
    const { root, outside, record, applier } = freshCase();
    symlinkSync(outside, join(root, "etc"));
    mkdirSync(join(root, "srv"));
    symlinkSync(join(outside, "deeper"), join(root, "srv", "data"));
    mkdirSync(join(outside, "deeper"));

    const results = await applier.apply([
      file("/etc/passwd", "owned\n"),
      file("/srv/data/x/y.txt", "owned\n"),
      file("/ok.txt", "fine\n"),
    ]);
    const [escape, nested, fine] = results;
    assert.equal(escape?.state, "failed");
    assert.match(escape?.reason ?? "", /\/etc is a symbolic link to .*outside the root/);
    assert.equal(nested?.state, "failed");
    assert.match(nested?.reason ?? "", /\/srv\/data is a symbolic link/);
    assert.deepEqual(fine, { id: "file:/ok.txt", state: "applied" });
    assert.deepEqual(readdirSync(outside), ["deeper"]);
    assert.deepEqual(readdirSync(join(outside, "deeper")), []);
    assert.deepEqual(recordOf(record), ["/ok.txt"]);
  });

  void test("applier — a symlinked parent that stays inside root is followed", async () => {
    const { root, record, applier } = freshCase();
    mkdirSync(join(root, "run"));
    symlinkSync("run", join(root, "var-run"));
    allApplied(await applier.apply([file("/var-run/app.pid", "42\n")]));
    assert.equal(readFileSync(join(root, "run/app.pid"), "utf8"), "42\n");
    assert.deepEqual(recordOf(record), ["/var-run/app.pid"]);
  });

  void test("applier — one failing item does not stop the others", async () => {
    const { root, record, applier } = freshCase();
    writeFileSync(join(root, "blocker"), "a regular file where a directory is needed");
    mkdirSync(join(root, "etc", "taken"), { recursive: true });
    const results = await applier.apply([
      file("/first.txt", "1"),
      file("/blocker/inside.txt", "never"),
      file("/etc/taken", "a directory is in the way"),
      file("/last.txt", "2"),
    ]);
    assert.deepEqual(
      results.map((result) => result.state),
      ["applied", "failed", "failed", "applied"],
    );
    assert.match(results[1]?.reason ?? "", /\/blocker is not a directory/);
    assert.match(results[2]?.reason ?? "", /\/etc\/taken is a directory/);
    assert.equal(readFileSync(join(root, "first.txt"), "utf8"), "1");
    assert.equal(readFileSync(join(root, "last.txt"), "utf8"), "2");
    assert.equal(readFileSync(join(root, "blocker"), "utf8"), "a regular file where a directory is needed");
    assert.deepEqual(recordOf(record), ["/first.txt", "/last.txt"]);
  });

  void test("applier — re-applying the same set is idempotent", async () => {
    const { root, record, applier } = freshCase();
    const items = [file("/etc/motd", "hello\n"), file("/etc/app/env", "A=1\n", "0600")];
    allApplied(await applier.apply(items));
    const before = statSync(join(root, "etc/motd"));
    const again = await new FileApplier(root, record).apply(items);
    allApplied(again);
    assert.equal(again.length, 2);
    // An unchanged file is not rewritten: the same inode, untouched.
    assert.equal(statSync(join(root, "etc/motd")).ino, before.ino);
    assert.equal(readFileSync(join(root, "etc/app/env"), "utf8"), "A=1\n");
    assert.equal(modeOf(join(root, "etc/app/env")), 0o600);
    assert.deepEqual(recordOf(record), ["/etc/app/env", "/etc/motd"]);
  });

  void test("applier — a changed content or mode is written again", async () => {
    const { root, applier } = freshCase();
    allApplied(await applier.apply([file("/etc/motd", "hello\n")]));
    allApplied(await applier.apply([file("/etc/motd", "hello\n", "0600")]));
    assert.equal(modeOf(join(root, "etc/motd")), 0o600);
    allApplied(await applier.apply([file("/etc/motd", "goodbye\n", "0600")]));
    assert.equal(readFileSync(join(root, "etc/motd"), "utf8"), "goodbye\n");
  });

  void test("applier — the record lists exactly the applied paths, and its own files while still declared", async () => {
    const { root, record, applier } = freshCase();
    allApplied(await applier.apply([file("/a/one", "1"), file("/b/two", "2")]));
    assert.deepEqual(recordOf(record), ["/a/one", "/b/two"]);

    // /b/two cannot be rewritten this time, but the copy it wrote before is still its own and stays recorded.
    const results = await applier.apply([
      file("/a/one", "1"),
      file("/b/two", "2, again", "0999"),
      file("/c/three", "3"),
      file("/a//./one2", "x"),
    ]);
    assert.deepEqual(
      results.map((result) => result.state),
      ["applied", "failed", "applied", "applied"],
    );
    assert.equal(readFileSync(join(root, "b/two"), "utf8"), "2");
    assert.deepEqual(recordOf(record), ["/a/one", "/a/one2", "/b/two", "/c/three"]);

    allApplied(await applier.apply([file("/a/one", "1")]));
    assert.deepEqual(recordOf(record), ["/a/one"]);
    assert.deepEqual(readdirSync(join(root, "a")), ["one"]);
    assert.deepEqual(readdirSync(join(root, "b")), []);
  });

  void test("applier — a path declared twice is written once and the second item fails", async () => {
    const { root, applier } = freshCase();
    const results = await applier.apply([
      file("/etc/motd", "first"),
      { id: "file:motd-again", type: "file", path: "/etc//motd", content: "second" },
    ]);
    assert.equal(results[0]?.state, "applied");
    assert.equal(results[1]?.state, "failed");
    assert.match(results[1]?.reason ?? "", /declared by more than one item/);
    assert.equal(readFileSync(join(root, "etc/motd"), "utf8"), "first");
  });

  void test("applier — a file it wrote that someone replaced with a directory is left alone", async () => {
    const { root, record, applier } = freshCase();
    allApplied(await applier.apply([file("/data/cache", "x")]));
    rmSync(join(root, "data/cache"));
    mkdirSync(join(root, "data/cache"));
    assert.deepEqual(await applier.apply([]), []);
    assert.equal(statSync(join(root, "data/cache")).isDirectory(), true);
    assert.deepEqual(recordOf(record), []);
  });

  void test("applier — a file whose folder was replaced by a file or a dangling link is forgotten", async () => {
    const { root, outside, record, applier } = freshCase();
    allApplied(await applier.apply([file("/x/one", "1"), file("/y/two", "2")]));
    rmSync(join(root, "x"), { recursive: true });
    writeFileSync(join(root, "x"), "someone else's file");
    rmSync(join(root, "y"), { recursive: true });
    symlinkSync(join(outside, "nowhere"), join(root, "y"));
    assert.deepEqual(await applier.apply([]), []);
    assert.equal(readFileSync(join(root, "x"), "utf8"), "someone else's file");
    assert.deepEqual(recordOf(record), []);
  });

  void test("applier — a removal that fails is reported as file:<path> and kept in the record", async () => {
    const { root, outside, record, applier } = freshCase();
    allApplied(await applier.apply([file("/etc/old.conf", "x")]));
    // The parent now escapes root, so removing through it would touch a file outside.
    writeFileSync(join(outside, "old.conf"), "outside, not the applier's");
    renameSync(join(root, "etc"), join(root, "etc-moved"));
    symlinkSync(outside, join(root, "etc"));
    const results = await applier.apply([]);
    assert.equal(results.length, 1);
    assert.equal(results[0]?.id, "file:/etc/old.conf");
    assert.equal(results[0]?.state, "failed");
    assert.match(results[0]?.reason ?? "", /refused to remove \/etc\/old\.conf/);
    assert.equal(readFileSync(join(outside, "old.conf"), "utf8"), "outside, not the applier's");
    assert.deepEqual(recordOf(record), ["/etc/old.conf"]);
  });

  void test("applier — a corrupt record stops the apply rather than guessing what it owns", async () => {
    const { record, applier } = freshCase();
    mkdirSync(join(record, ".."), { recursive: true });
    for (const corrupt of ["{", '{"paths": []}', '["relative/path"]', "[1]"]) {
      writeFileSync(record, corrupt);
      await assert.rejects(
        applier.apply([file("/x", "x")]),
        (error: unknown) => error instanceof HostStateError && error.message.includes(record),
      );
    }
  });
});
