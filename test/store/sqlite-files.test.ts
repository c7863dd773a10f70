/**
 * What a SQLite store does with files besides its own under load: a transaction's multi-row statements keep their
 * statement journals in memory instead of in a temporary file made and deleted for each statement, and the log a
 * burst grew is not cut back at its next restart only to be grown again by the next burst. Real SQLite files, the
 * store's own connection, the checkpoint thread of a control plane.
 */
import assert from "node:assert/strict";
import { openSync, readdirSync, readlinkSync, readSync, closeSync, statSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { declarationChunk } from "../../src/control/declarations.js";
import { logKeptBytes } from "../../src/store/checkpoints.js";
import type { MeshEvent, NewDeclaration, Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { eventually } from "../support/processes.js";
import { keptParts } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";

/** The temporary files SQLite has open in this process (it deletes them as it opens them). */
function temporaryFilesOpen(): string[] {
  return readdirSync("/proc/self/fd").flatMap((fd) => {
    try {
      const target = readlinkSync(`/proc/self/fd/${fd}`);
      return target.includes("etilqs") ? [target] : [];
    } catch (error) {
      // The directory's own descriptor, closed once read, cannot be followed: that is the only one expected.
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw error;
    }
  });
}

/** `count` events of about a kilobyte each. */
function events(count: number, from: number): MeshEvent[] {
  return Array.from({ length: count }, (_, i) => ({
    at: new Date(Date.UTC(2026, 0, 1, 0, 0, from + i)).toISOString(),
    kind: "test.filler",
    node: null,
    epoch: null,
    detail: { i: from + i, filler: "x".repeat(1000) },
  }));
}

/** The log header's checkpoint sequence and salts: they change when a writer starts the log again from its start. */
function logGeneration(path: string): string {
  const header = Buffer.alloc(12);
  const fd = openSync(`${path}-wal`, "r");
  try {
    readSync(fd, header, 0, 12, 12);
  } finally {
    closeSync(fd);
  }
  return header.toString("hex");
}

async function withStore(apart: boolean, run: (store: Store, path: string) => Promise<void>): Promise<void> {
  const dir = tempDir("mesh-sqlite-files-");
  const path = join(dir.path, "mesh.db");
  const told: string[] = [];
  const store = await openStore(`sqlite:${path}`, {
    historyLimit: 5,
    ...(apart
      ? { checkpointsApart: { failed: (reason) => told.push(reason), recovered: () => undefined } }
      : {}),
  });
  try {
    await run(store, path);
    assert.deepEqual(told, [], "the checkpoint thread told of no failure");
  } finally {
    await store.close();
    dir.remove();
  }
}

describe("a SQLite store's files under load", () => {
  test("reports kept in batches, and a roll-out's chunks, open no temporary file", async () => {
    await withStore(false, async (store) => {
      const nodes = Array.from({ length: 500 }, (_, i) => `files-${String(i).padStart(3, "0")}`);
      for (const [i, node] of nodes.entries()) {
        await store.tokens.issue({
          id: `tok_${String(i).padStart(12, "0")}`,
          node,
          secretHash: `h${i}`,
          createdAt: "2026-01-01T00:00:00.000Z",
          expiresAt: "2026-01-02T00:00:00.000Z",
        });
      }
      const seen: string[] = [];
      // Each node's reports as ingest keeps them: a batch of the fleet's reports in one transaction, and again, so
      // its history grows and is trimmed.
      for (let round = 1; round <= 12; round++) {
        await store.transaction(async (tx) => {
          await tx.accounts.keepMany(
            nodes.map((node) => ({
              node,
              receivedAt: new Date(Date.UTC(2026, 0, 1, 0, 0, round)).toISOString(),
              epoch: 1,
              sequence: round,
              reportSequence: round,
              digest: `sha256:${node}:${round}`,
              outcome: "applied",
              report: JSON.stringify({ items: [], filler: "z".repeat(300) }),
            })),
          );
          // Still inside the transaction: a statement journal or a sort spilled to a file would be open now.
          seen.push(...temporaryFilesOpen());
        });
      }
      // Declarations of a plan's size (about 1.8 kB of items), each a composition of its own (the most a roll-out
      // writes), as a roll-out records them: a whole chunk in one transaction.
      const declaration = (node: string): NewDeclaration => ({
        node,
        sequence: 1,
        epoch: 1,
        issuedAt: "2026-01-01T00:00:01.000Z",
        digest: `sha256:${node}`,
        ...keptParts(JSON.stringify([{ node, filler: "y".repeat(1800) }])),
        units: ["web", "base"],
      });
      assert.ok(nodes.length >= declarationChunk, "the nodes fill a chunk");
      await store.transaction(async (tx) => {
        await tx.declarations.recordMany(nodes.slice(0, declarationChunk).map(declaration));
        seen.push(...temporaryFilesOpen());
      });
      assert.deepEqual(seen, []);
      assert.equal((await store.accounts.recoveryCopy("files-499"))?.sequence, 12, "the reports were kept");
      assert.equal(
        (await store.declarations.latest(nodes[declarationChunk - 1] ?? ""))?.sequence,
        1,
        "the declarations were recorded",
      );
    });
  });

  test("a log a burst grew keeps its size when the checkpoint thread has emptied it and it starts again", async () => {
    await withStore(true, async (store, path) => {
      // About 12 MB in one transaction: three times what the log was once cut back to, well below what it keeps.
      // One commit, so the thread cannot empty the log and let it start again part way (on a slow machine it might
      // between commits), and the log holds the whole burst.
      const burstBytes = 12_000_000;
      assert.ok(burstBytes < logKeptBytes, "the burst is below what the log keeps");
      await store.transaction(async (tx) => {
        for (let batch = 0; batch < 120; batch++) await tx.events.recordMany(events(100, batch * 100));
      });
      const grown = statSync(`${path}-wal`).size;
      assert.ok(grown >= burstBytes, `the burst grew the log (${grown} bytes)`);
      const generation = logGeneration(path);
      // Once the thread has copied the whole log into the database, the next commit starts the log again from its
      // start; that is the moment a log above its kept size is cut back.
      let next = 12_000;
      await eventually("the log to start again", async () => {
        await store.events.recordMany(events(1, next++));
        return logGeneration(path) !== generation ? true : undefined;
      });
      await store.events.recordMany(events(1, next++));
      const kept = statSync(`${path}-wal`).size;
      assert.ok(
        kept >= grown,
        `the log file keeps the size the burst grew it to (${kept} of ${grown} bytes)`,
      );
    });
  });
});
