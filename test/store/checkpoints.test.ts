/**
 * A long-running control plane's SQLite store checkpoints on a thread of its own: what its commits write reaches the
 * database file without a commit copying it there, a thread that cannot open the store is told as gone, a failing
 * checkpoint is told with the driver's code, and stopping waits for the thread, closes its connection and tells
 * nothing. Real SQLite files, real worker threads.
 */
import assert from "node:assert/strict";
import { existsSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Checkpointer } from "../../src/store/checkpoints.js";
import type { MeshEvent } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { eventually } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

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
  test("what the commits write reaches the database file, copied by the thread (about 350 pages, below SQLite's own 1,000)", async () => {
    const dir = tempDir("mesh-checkpoints-");
    const path = join(dir.path, "mesh.db");
    const told: string[] = [];
    const store = await openStore(`sqlite:${path}`, {
      historyLimit: 5,
      checkpointsApart: { failed: (reason) => told.push(reason), recovered: () => told.push("recovered") },
    });
    try {
      const before = statSync(path).size;
      // A megabyte and a bit in 12 commits: fewer pages than SQLite's default checkpoint needs, so a commit never
      // copies them; only the thread can bring them into the file.
      for (let batch = 0; batch < 12; batch++) await store.events.recordMany(events(100));
      // The premise: the log holds fewer frames (4 KiB and a 24-byte header each) than a commit checkpoints at.
      const logBytes = statSync(`${path}-wal`).size;
      assert.ok(
        logBytes < 1000 * (4096 + 24),
        `the log is below SQLite's own checkpoint (${logBytes} bytes)`,
      );
      await eventually("the database file to hold the events", () =>
        statSync(path).size >= before + 1_000_000 ? true : undefined,
      );
      assert.deepEqual(told, []);
    } finally {
      await store.close();
      dir.remove();
    }
  });

  test("a thread that cannot open the store is told as gone, with the reason and the path", async () => {
    const dir = tempDir("mesh-checkpoints-");
    const told = await firstTold(join(dir.path, "missing.db")).finally(() => dir.remove());
    assert.equal(told.length, 1, told.join("\n"));
    assert.match(
      told[0] ?? "",
      /^gone: the checkpoint thread of .*missing\.db ended \(.*unable to open database file/,
    );
  });

  test("a checkpoint that fails is told, with the path, the reason and the driver's code", async () => {
    const dir = tempDir("mesh-checkpoints-");
    const path = join(dir.path, "mesh.db");
    // Not a database: the thread opens it (nothing is read yet) and every checkpoint of it fails.
    writeFileSync(path, Buffer.alloc(8192, 0x5a));
    const told = await firstTold(path).finally(() => dir.remove());
    assert.equal(told.length, 1, told.join("\n"));
    assert.match(
      told[0] ?? "",
      /^failed: a checkpoint of .*mesh\.db failed: file is not a database \(SQLITE_NOTADB\)$/,
    );
  });

  test("stopping the thread waits for it to end and tells nothing", async () => {
    const dir = tempDir("mesh-checkpoints-");
    const path = join(dir.path, "mesh.db");
    const file = new SqliteDatabase(path);
    file.pragma("journal_mode = WAL");
    const { checkpointer, told } = recordingCheckpointer(path);
    try {
      file.exec("create table t (x text)");
      // Written after the thread began, fewer pages than a commit checkpoints, and found in the file: the thread ran,
      // against this store.
      file.prepare("insert into t values (?)").run("y".repeat(200_000));
      await eventually("the thread's checkpoint", () => (statSync(path).size >= 200_000 ? true : undefined));
      await checkpointer.stop();
      file.close();
      // SQLite removes the log when the last connection to the file closes: the thread's is closed too.
      assert.equal(existsSync(`${path}-wal`), false, "the log is gone with the last connection");
      assert.deepEqual(told, []);
    } finally {
      await checkpointer.stop();
      if (file.open) file.close();
      dir.remove();
    }
  });
});

/** A checkpointer of `path`, every 10 ms, that writes down everything it tells, in order. */
function recordingCheckpointer(path: string): { checkpointer: Checkpointer; told: string[] } {
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
  return { checkpointer, told };
}

/** What a checkpointer of `path` told until the first thing it told, and as it stopped. */
async function firstTold(path: string): Promise<string[]> {
  const { checkpointer, told } = recordingCheckpointer(path);
  try {
    await eventually("the checkpointer to tell something", () => (told.length > 0 ? true : undefined));
  } finally {
    await checkpointer.stop();
  }
  return told;
}
