/**
 * Statements built once per shape (on a real SQLite file): the SQL is reused with new values bound, and a statement
 * that would bind its values in another order than the caller lists them is refused before it runs.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { Kysely, SqliteDialect, sql } from "kysely";
import { StoreError } from "../../src/errors.js";
import type { Database } from "../../src/store/schema.js";
import { withStatementCache } from "../../src/store/open.js";
import { rowValues, StatementTexts } from "../../src/store/statements.js";
import { tempDir } from "../support/tmp.js";

const dir = tempDir("mesh-statements-");
let db: Kysely<Database>;

before(async () => {
  db = new Kysely<Database>({
    dialect: new SqliteDialect({ database: new SqliteDatabase(join(dir.path, "s.db")) }),
  });
  await sql`create table nodes (name text primary key, state text not null, enrolled_at text)`.execute(db);
  await sql`insert into nodes values ('a', 'invited', null), ('b', 'enrolled', 't1'), ('c', 'retired', 't2')`.execute(
    db,
  );
});
after(async () => {
  await db.destroy();
  dir.remove();
});

const states = (names: string[]) => () =>
  db.selectFrom("nodes").select(["name", "state"]).where("name", "in", names).orderBy("name");

test("statements — one shape's SQL is built once and bound to each call's values", async () => {
  const statements = new StatementTexts();
  let built = 0;
  const run = async (names: string[]) => {
    const { rows } = await statements.run(db, `states.${names.length}`, names, () => {
      built++;
      return states(names)();
    });
    return rows.map((row) => `${row.name}=${row.state}`);
  };
  assert.deepEqual(await run(["a", "b"]), ["a=invited", "b=enrolled"]);
  assert.deepEqual(await run(["b", "c"]), ["b=enrolled", "c=retired"]);
  assert.deepEqual(await run(["c", "nobody"]), ["c=retired"]);
  assert.equal(built, 1, "the second and third calls reuse the first call's SQL");
  assert.deepEqual(await run(["a"]), ["a=invited"]);
  assert.equal(built, 2, "another number of values is another shape");
});

test("statements — values listed in another order than the statement binds them are refused, and nothing runs", async () => {
  const statements = new StatementTexts();
  // The statement binds the new time first and the name second.
  await assert.rejects(
    statements.run(db, "enrolled-at", ["b", "t9"], () =>
      db.updateTable("nodes").set({ enrolled_at: "t9" }).where("name", "=", "b"),
    ),
    (error: unknown) =>
      error instanceof StoreError &&
      /the statement enrolled-at binds its values in an unexpected order/.test(error.message),
  );
  const { rows } = await statements.run(db, "enrolled-at.read", ["b"], () =>
    db.selectFrom("nodes").select("enrolled_at").where("name", "=", "b"),
  );
  assert.deepEqual(rows, [{ enrolled_at: "t1" }]);
});

test("statements — the prepared statements kept are the most recently used: a hot one stays past the limit", () => {
  const file = new SqliteDatabase(join(dir.path, "cache.db"));
  const prepared: string[] = [];
  const prepare = file.prepare.bind(file);
  file.prepare = (text: string) => {
    prepared.push(text);
    return prepare(text);
  };
  const cached = withStatementCache(file, 3);
  const hot = "select 0 as n";
  const ask = (text: string) => (cached.prepare(text).get() as { n: number }).n;
  // The cache is full before the hot statement first comes.
  for (const n of [100, 101, 102]) assert.equal(ask(`select ${n} as n`), n);
  assert.equal(ask(hot), 0);
  // Ten other texts, the hot one asked for between each: it is never the least recently used.
  for (let n = 1; n <= 10; n++) {
    assert.equal(ask(`select ${n} as n`), n);
    assert.equal(ask(hot), 0);
  }
  assert.equal(prepared.filter((text) => text === hot).length, 1, "the hot statement was prepared once");
  // Three held at most: the oldest of the others was dropped, and is prepared again when it comes back.
  assert.equal(ask("select 1 as n"), 1);
  assert.equal(prepared.filter((text) => text === "select 1 as n").length, 2);
  assert.equal(ask("select 10 as n"), 10);
  assert.equal(prepared.filter((text) => text === "select 10 as n").length, 1, "a recent one is still held");
  file.close();
});

test("statements — a many-row insert's values are the rows' values, row after row, each in its key order", () => {
  const rows = [
    { node: "a", epoch: 1, report: null },
    { node: "b", epoch: 2, report: "{}" },
  ];
  assert.deepEqual(rowValues(rows), ["a", 1, null, "b", 2, "{}"]);
  assert.deepEqual(rowValues([]), []);
});
