import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { exitCodeOf, exitCodes, MeshError, meshErrorCodes, UsageError } from "../../src/errors.js";
import type { MeshErrorCode } from "../../src/errors.js";

const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");

/** The rows of README.md's error-code table, as [code, exit, meaning]. */
function documentedRows(): string[][] {
  const start = readme.indexOf("<!-- error-codes:start -->");
  const end = readme.indexOf("<!-- error-codes:end -->");
  assert.ok(start >= 0 && end > start, "README.md has the error-code table between its markers");
  return readme
    .slice(start, end)
    .split("\n")
    .filter((line) => line.startsWith("|"))
    .slice(2) // the header and its rule
    .map((line) =>
      line
        .slice(1, -1)
        .split("|")
        .map((cell) => cell.trim()),
    );
}

describe("error codes", () => {
  test("error codes — README.md documents every code, its exit code and meaning, in the table's order", () => {
    const expected = Object.entries(meshErrorCodes).map(([code, { exit, meaning }]) => [
      `\`${code}\``,
      String(exit),
      meaning,
    ]);
    assert.deepEqual(documentedRows(), expected);
  });

  test("error codes — only bad usage exits 2, only a refused node identity exits 3; every other code exits 1", () => {
    const apart: Partial<Record<MeshErrorCode, number>> = {
      usage: exitCodes.usage,
      identity_refused: exitCodes.identityRefused,
    };
    for (const code of Object.keys(meshErrorCodes) as MeshErrorCode[]) {
      assert.equal(exitCodeOf(code), apart[code] ?? exitCodes.failure, code);
    }
  });

  test("error codes — an error's exit code follows its code, whatever its class", () => {
    assert.equal(exitCodeOf(new UsageError("bad flag").code), exitCodes.usage);
    assert.equal(exitCodeOf(new MeshError("usage", "a bad URL").code), exitCodes.usage);
    assert.equal(exitCodeOf(new MeshError("broker", "refused").code), exitCodes.failure);
  });
});
