/**
 * The liveness watch's first read, each node's newest crossing, goes through the crossings' own partial index on
 * SQLite (a real store file, migrated as `openStore` migrates it), not through every event of the audit trail: SQLite
 * would use that index only for a statement whose own condition shows it holds, so a change of the statement or of
 * the kinds without the index fails here.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Kysely, SqliteDialect } from "kysely";
import { openStore } from "../../src/store/index.js";
import { crossingKinds, newestCrossings } from "../../src/store/events.js";
import type { Database } from "../../src/store/schema.js";
import { tempDir } from "../support/tmp.js";

const dir = tempDir("mesh-crossings-");
after(() => dir.remove());

test("crossings — each node's newest crossing is read through events_crossings, and other events are not read for it", async () => {
  const path = join(dir.path, "mesh.db");
  const store = await openStore(`sqlite:${path}`, { historyLimit: 50 });
  const at = new Date().toISOString();
  try {
    await store.events.recordMany([
      { at, kind: "node.out_of_touch", node: "a-1", epoch: null, detail: { silent_for_s: 60 } },
      { at, kind: "node.back_in_touch", node: "a-1", epoch: null, detail: {} },
      { at, kind: "node.out_of_touch", node: "b-1", epoch: null, detail: { silent_for_s: 90 } },
      // Newer than b-1's crossing, and not a crossing: it changes nothing.
      { at, kind: "node.drift", node: "b-1", epoch: 1, detail: { sequence: 1 } },
      { at, kind: "node.drift", node: "c-1", epoch: 1, detail: { sequence: 1 } },
    ]);
    assert.deepEqual([...(await store.events.latestCrossings())].sort(), [
      ["a-1", "node.back_in_touch"],
      ["b-1", "node.out_of_touch"],
    ]);
  } finally {
    await store.close();
  }

  const file = new SqliteDatabase(path, { readonly: true });
  const db = new Kysely<Database>({ dialect: new SqliteDialect({ database: file }) });
  try {
    const { sql, parameters } = newestCrossings(db).compile();
    const plan = file
      .prepare(`explain query plan ${sql}`)
      .all(...(parameters as unknown[]))
      .map((row) => (row as { detail: string }).detail);
    assert.ok(
      plan.some((step) => /USING (COVERING )?INDEX events_crossings\b/.test(step)),
      `the crossings are read through events_crossings: ${plan.join(" | ")}`,
    );
    assert.ok(
      !plan.some((step) => /\bevents_node\b/.test(step) || /^SCAN (TABLE )?events\b/.test(step)),
      `no pass over the whole audit trail: ${plan.join(" | ")}`,
    );
    const indexed = file
      .prepare("select sql from sqlite_master where type = 'index' and name = 'events_crossings'")
      .get() as { sql: string } | undefined;
    // The index names exactly the kinds the statement asks for: one more or one fewer on either side fails here.
    const named = [...(indexed?.sql ?? "").matchAll(/'([^']*)'/g)].map((match) => match[1]);
    assert.deepEqual(
      named.sort(),
      [...crossingKinds].sort(),
      `the index's kinds: ${indexed?.sql ?? "no index"}`,
    );
  } finally {
    await db.destroy();
  }
});
