/**
 * An operator's file is read as the YAML parser reads it, whether `JSON.parse` or the YAML parser reads it: a file
 * written as JSON goes to `JSON.parse` only when that reads it alike, and everything else (a key given twice, a number
 * or an escape written another way, YAML) to the YAML parser, as before.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { parseOperatorFile, readAsJson } from "../../src/control/operator-file.js";
import { UsageError } from "../../src/errors.js";
import { parsePlanFile } from "../../src/control/plans.js";

type Outcome = { read: unknown } | { refused: string };

/** What the file reader did before `JSON.parse` read anything: the YAML parser alone. */
function throughYaml(text: string): Outcome {
  try {
    return { read: parseYaml(text) as unknown };
  } catch (error) {
    return { refused: `plan.json is neither YAML nor JSON: ${(error as Error).message}` };
  }
}

function read(text: string): Outcome {
  try {
    return { read: parseOperatorFile(z.unknown(), text, "plan.json") };
  } catch (error) {
    assert.ok(error instanceof UsageError, String(error));
    return { refused: error.message };
  }
}

/** JSON as a person or a program may write it: on one line, indented by spaces or tabs, with CRLF line ends. */
const written = fc
  .tuple(fc.jsonValue(), fc.constantFrom(undefined, 2, 4, "\t"), fc.boolean())
  .map(([value, indent, crlf]) => {
    const text = JSON.stringify(value, null, indent);
    return crlf ? text.replaceAll("\n", "\r\n") : text;
  });

test("operator file — any JSON, however spaced, reads as the YAML parser reads it", () => {
  fc.assert(
    fc.property(written, (text) => assert.deepEqual(read(text), throughYaml(text))),
    { numRuns: 3000 },
  );
});

test("operator file — a JSON object with a key given twice is refused as the YAML parser refuses it", () => {
  const objectText = fc
    .dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 2 }), { minKeys: 1, maxKeys: 6 })
    .chain((object) =>
      fc.tuple(fc.constant(object), fc.nat(Object.keys(object).length - 1), fc.jsonValue({ maxDepth: 1 })),
    )
    .map(([object, at, again]) => {
      const entries = Object.entries(object).map(
        ([key, value]) => `${JSON.stringify(key)}: ${JSON.stringify(value)}`,
      );
      const key = Object.keys(object)[at] ?? "";
      entries.splice(at + 1, 0, `${JSON.stringify(key)}: ${JSON.stringify(again)}`);
      return `{"outer": {${entries.join(", ")}}}`;
    });
  fc.assert(
    fc.property(objectText, (text) => {
      const outcome = read(text);
      assert.ok("refused" in outcome, `${text} was read: ${JSON.stringify(outcome)}`);
      assert.deepEqual(outcome, throughYaml(text));
    }),
    { numRuns: 500 },
  );
  assert.throws(
    () => parsePlanFile('{"units": [], "units": [{"name": "web"}]}', "plan.json"),
    (error: unknown) =>
      error instanceof UsageError && /^plan\.json is neither YAML nor JSON: .*unique/s.test(error.message),
  );
});

test("operator file — JSON written otherwise than JSON.stringify writes it reads as the YAML parser reads it", () => {
  for (const text of [
    '{"count": 1e2}',
    '{"count": 1.0}',
    '{"count": -0}',
    '{"big": 123456789012345678901234567890}',
    '{"path": "\\/etc\\/motd"}',
    '{"content": "caf\\u00e9"}',
    '{"content": "\\ud83d\\ude00"}',
    '{"1": "a", "0": "b"}',
    '{"__proto__": {"polluted": true}}',
    '\ufeff{"units": []}',
    '{"units": [],}',
    '{"units": [] # a comment\n}',
    "{units: []}",
    "[1, 2, 3] trailing",
  ]) {
    assert.deepEqual(read(text), throughYaml(text), text);
  }
  assert.equal(({} as Record<string, unknown>).polluted, undefined);
});

test("operator file — YAML reads as before", () => {
  const yaml = "units:\n  - name: web\n    files:\n      - path: /etc/motd\n        content: hello\n";
  assert.deepEqual(read(yaml), throughYaml(yaml));
  assert.deepEqual(read("[a, b]"), { read: ["a", "b"] });
});

test("operator file — JSON as JSON.stringify writes it is read by JSON.parse; what it would read otherwise is not", () => {
  const plan = {
    units: [
      {
        name: "web",
        where: { labels: { role: "web" } },
        files: [{ path: "/etc/motd", content: 'a "quoted text" with spaces\n' }],
      },
    ],
  };
  for (const indent of [undefined, 2, "\t"]) {
    const text = JSON.stringify(plan, null, indent);
    assert.deepEqual(readAsJson(text), { read: plan }, text);
    assert.deepEqual(readAsJson(` \r\n${text.replaceAll("\n", "\r\n")}\n`), { read: plan }, text);
  }
  for (const text of ['{"a": 1, "a": 2}', '{"a": 1e2}', '{"a": "\\/"}', "units: []", "", "  "]) {
    assert.ok("notJson" in readAsJson(text), text);
  }
});
