/**
 * A long-running control plane's SQLite store checkpoints on a thread of its own: what its commits write reaches the
 * database file without a commit copying it there, a thread that cannot open the store is told as gone, and stopping
 * it waits for it and tells nothing. Real SQLite files, real worker threads.
 */
import assert from "node:assert/strict";
import { statSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Checkpointer } from "../../src/store/checkpoints.js";
import type { MeshEvent } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { tempDir } from "../support/tmp.js";

/** Resolves once `check` holds, looking every 25 ms; fails after `withinMs` saying what it waited for. */
async function until(what: string, check: () => boolean, withinMs = 60_000): Promise<void> {
  const deadline = Date.now() + withinMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`waited ${withinMs} ms for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** `count` events of about a kilobyte each. */
function events(count: number): MeshEvent[] {
  return Array.from({ length: count }, (_, i) => ({
    at: new Date(Date.UTC(2026, 0, 1, 0, 0, i)).toISOString(),
    kind: "test.filler",
    node: null,
    epoch: null,
    detail: { i, filler: "x".repeat(1000) },
  }));
}

describe("SQLite checkpoints on a thread of their own", () => {
  test("what the commits write reaches the database file, copied by the thread (about 500 pages, below SQLite's own 1,000)", async () => {
    const dir = tempDir("mesh-checkpoints-");
    const path = join(dir.path, "mesh.db");
    const told: string[] = [];
    const store = await openStore(`sqlite:${path}`, {
      historyLimit: 5,
      checkpointsApart: { failed: (reason) => told.push(reason), recovered: () => told.push("recovered") },
    });
    try {
      const before = statSync(path).size;
      // Two megabytes in 20 commits: fewer pages than SQLite's default checkpoint needs, so a commit never copies
      // them; only the thread can bring them into the file.
      for (let batch = 0; batch < 20; batch++) await store.events.recordMany(events(100));
      await until("the database file to hold the events", () => statSync(path).size >= before + 1_500_000);
      assert.deepEqual(told, []);
    } finally {
      await store.close();
      dir.remove();
    }
  });

  test("a thread that cannot open the store is told as gone, with the reason and the path", async () => {
    const dir = tempDir("mesh-checkpoints-");
    const path = join(dir.path, "missing.db");
    const failed: string[] = [];
    let reason = "";
    const checkpointer = new Checkpointer(path, {
      failed: (said) => failed.push(said),
      recovered: () => failed.push("recovered"),
      gone: (said) => (reason = said),
    });
    try {
      await until("the thread's end to be told", () => reason !== "");
      assert.match(reason, /the checkpoint thread of .*missing\.db ended/);
      assert.match(reason, /unable to open database file/);
      assert.deepEqual(failed, []);
    } finally {
      await checkpointer.stop();
      dir.remove();
    }
  });

  test("stopping the thread waits for it to end and tells nothing", async () => {
    const dir = tempDir("mesh-checkpoints-");
    const path = join(dir.path, "mesh.db");
    const file = new SqliteDatabase(path);
    file.pragma("journal_mode = WAL");
    const told: string[] = [];
    const checkpointer = new Checkpointer(
      path,
      {
        failed: (reason) => told.push(`failed: ${reason}`),
        recovered: () => told.push("recovered"),
        gone: (reason) => told.push(`gone: ${reason}`),
      },
      10,
    );
    try {
      file.exec("create table t (x text)");
      // Written after the thread began, fewer pages than a commit checkpoints, and found in the file: the thread ran,
      // against this store.
      file.prepare("insert into t values (?)").run("y".repeat(200_000));
      await until("the thread's checkpoint", () => statSync(path).size >= 200_000);
    } finally {
      await checkpointer.stop();
      file.close();
      dir.remove();
    }
    assert.deepEqual(told, []);
  });
});
