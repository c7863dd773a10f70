import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { test } from "node:test";
// @ts-expect-error -- a plain script without type declarations
import { findEmptyCatches } from "../../scripts/lint-empty-catch.mjs";

type Finding = { line: number; message: string };
const find = findEmptyCatches as (fileName: string, text: string) => Finding[];
const fixture = (name: string) => new URL(`../fixtures/lint/${name}`, import.meta.url);

test("empty-on-error lint — finds every marked catch in the fixture and nothing else", () => {
  const text = readFileSync(fixture("swallows.ts"), "utf8");
  const marked = text.split("\n").flatMap((line, index) => (line.includes("// FIND") ? [index + 1] : []));
  assert.equal(marked.length, 8);
  const found = find("swallows.ts", text).map((f) => f.line);
  assert.deepEqual(
    found.sort((a, b) => a - b),
    marked,
  );
});

test("empty-on-error lint — honest error handling is not flagged", () => {
  assert.deepEqual(find("honest.ts", readFileSync(fixture("honest.ts"), "utf8")), []);
});

test("empty-on-error lint — the command exits 1 on the bad fixture and 0 on the honest one", () => {
  const script = new URL("../../scripts/lint-empty-catch.mjs", import.meta.url).pathname;
  const bad = spawnSync(process.execPath, [script, fixture("swallows.ts").pathname], { encoding: "utf8" });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /8 empty-on-error finding\(s\)/);
  const good = spawnSync(process.execPath, [script, fixture("honest.ts").pathname], { encoding: "utf8" });
  assert.equal(good.status, 0, good.stderr);
});
