/**
 * A node's kept accounts are trimmed to the history every tenth account, not at each (on a real SQLite file, whose
 * rows are counted here directly): the table never holds more than the history and nine, the history read is the
 * newest `historyLimit` whatever the table holds, and a store opened afresh (a new process) trims at its first.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import type { AccountRecord } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { enrolled } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";

const dir = tempDir("mesh-account-trim-");
after(() => dir.remove());

const historyLimit = 3;

function account(node: string, n: number): AccountRecord {
  return {
    node,
    receivedAt: new Date(Date.UTC(2026, 0, 1, 0, 0, n)).toISOString(),
    epoch: 1,
    sequence: 1,
    reportSequence: n,
    digest: "sha256:aa",
    outcome: "applied",
    report: JSON.stringify({ n }),
  };
}

test("accounts — trimmed every tenth account: the table holds at most the history and nine, reads show the history", async () => {
  const file = join(dir.path, "trim.db");
  const rows = (node: string) => {
    const raw = new SqliteDatabase(file, { readonly: true });
    try {
      return (raw.prepare("select count(*) as n from accounts where node = ?").get(node) as { n: number }).n;
    } finally {
      raw.close();
    }
  };
  const store = await openStore(`sqlite:${file}`, { historyLimit });
  const counts: number[] = [];
  try {
    await enrolled(store, "trim-one", new Date());
    await enrolled(store, "trim-many", new Date());
    for (let n = 1; n <= 30; n++) {
      await store.accounts.keep(account("trim-one", n));
      counts.push(rows("trim-one"));
      assert.deepEqual(
        (await store.accounts.history("trim-one")).map((kept) => kept.reportSequence),
        [n, n - 1, n - 2].filter((sequence) => sequence >= 1),
      );
    }
    // Trimmed at the first account (none kept yet by this store), then every tenth: never more than 3 + 9.
    assert.ok(Math.max(...counts) <= historyLimit + 9, `kept ${Math.max(...counts)} rows`);
    assert.deepEqual(counts.slice(0, 12), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 3, 4]);
    // Many of one node's accounts in one batch count as many.
    await store.accounts.keepMany(Array.from({ length: 25 }, (_, i) => account("trim-many", i + 1)));
    assert.equal(rows("trim-many"), historyLimit);
  } finally {
    await store.close();
  }
  // A new process does not know what the last one kept since its trim: it trims at its first account.
  assert.ok(rows("trim-one") > historyLimit);
  const reopened = await openStore(`sqlite:${file}`, { historyLimit });
  try {
    await reopened.accounts.keep(account("trim-one", 31));
    assert.equal(rows("trim-one"), historyLimit);
    assert.deepEqual(
      (await reopened.accounts.history("trim-one")).map((kept) => kept.reportSequence),
      [31, 30, 29],
    );
  } finally {
    await reopened.close();
  }
});
