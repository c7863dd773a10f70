/**
 * The log: a line per event whatever a field holds (text a node chose may hold line breaks and terminal escapes), and
 * warnings about what a sender keeps doing told once a window.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { createLogger, WarningWindow } from "../../src/log.js";

/**
 * A node's reason that would forge a line and a field of its own, act on a terminal (clear the screen, C1's CSI, DEL)
 * and turn what follows around (a line separator, a right-to-left override).
 */
const hostile =
  'failed\n12:00:00 ERROR lease.lost epoch=9\r\u001b[2J\u009b31m\u007f "quoted" \\ \u2028\u202eend node=db-9';
const controls =
  // eslint-disable-next-line no-control-regex -- control characters are exactly what must not be in a line
  /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

describe("log", () => {
  test("log — a readable line shows a field as a JSON string, each control escaped, unless it is one plain word", () => {
    const lines: string[] = [];
    const log = createLogger({ write: (line) => lines.push(line), pretty: true });
    log.warn("node.declaration_failed", {
      node: "web-1",
      reason: hostile,
      items: [hostile],
      note: "x node=db-9",
    });
    assert.equal(lines.length, 1);
    const line = lines[0] ?? "";
    assert.equal(line.indexOf("\n"), line.length - 1, "one line, ended once");
    assert.doesNotMatch(line, controls);
    assert.match(line, / WARN {2}node\.declaration_failed node=web-1 reason="/, "plain text stays as it is");
    const quoted = /reason=("(?:[^"\\]|\\.)*")/.exec(line)?.[1];
    assert.equal(JSON.parse(quoted ?? "null"), hostile, "the escaped text reads back as it was");
    const list = /items=(\[.*\]) note=/.exec(line)?.[1];
    assert.deepEqual(JSON.parse(list ?? "null"), [hostile]);
    assert.match(
      line,
      / note="x node=db-9"\n$/,
      "text with a space or = is quoted: it cannot pass for a field",
    );
    const outsideStrings = line.replace(/"(?:[^"\\]|\\.)*"/g, '""');
    assert.equal(outsideStrings.match(/ node=/g)?.length, 1, `one node field, web-1's: ${outsideStrings}`);
  });

  test("log — a JSON line escapes the controls JSON would leave as they are", () => {
    const lines: string[] = [];
    const log = createLogger({ write: (line) => lines.push(line), pretty: false });
    log.warn("node.declaration_failed", { reason: hostile });
    assert.equal(lines.length, 1);
    assert.doesNotMatch(lines[0] ?? "", controls);
    assert.equal((JSON.parse(lines[0] ?? "{}") as { reason?: string }).reason, hostile);
  });

  test("log — a warning about one sender is told once a window, with how many were held back since", () => {
    const lines: string[] = [];
    const log = createLogger({ write: (line) => lines.push(line), pretty: false });
    let now = 0;
    const window = new WarningWindow(log, 60_000, () => now);
    const said = () => lines.map((line) => JSON.parse(line) as Record<string, unknown>);
    for (let index = 0; index < 500; index += 1)
      window.warn("web-1", "enrol.foreign_reply_subject", { node: "web-1" });
    window.warn("db-1", "enrol.foreign_reply_subject", { node: "db-1" });
    assert.deepEqual(
      said().map(({ node, held_back }) => [node, held_back]),
      [
        ["web-1", undefined],
        ["db-1", undefined],
      ],
    );
    now = 59_999;
    window.warn("web-1", "enrol.foreign_reply_subject", { node: "web-1" });
    assert.equal(lines.length, 2, "still within the window");
    now = 60_000;
    window.warn("web-1", "enrol.foreign_reply_subject", { node: "web-1" });
    assert.equal(said()[2]?.held_back, 500, "the 499 after the first and the one at 59,999 ms");
  });

  test("log — a warning window forgets quiet senders once it remembers many", () => {
    const lines: string[] = [];
    let now = 0;
    const window = new WarningWindow(
      createLogger({ write: (line) => lines.push(line), pretty: false }),
      1000,
      () => now,
    );
    for (let index = 0; index < 5000; index += 1) {
      now = index * 10;
      window.warn(`node-${index}`, "enrol.stray_subject", {});
    }
    assert.equal(lines.length, 5000, "each sender told once");
    const remembered = (window as unknown as { told: Map<string, unknown> }).told.size;
    assert.ok(
      remembered <= 1024 + 100,
      `${remembered} senders remembered, of 5,000 (100 within any one window)`,
    );
  });
});
