import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { UsageError } from "../../src/errors.js";
import { parseDeclarationFile } from "../../src/control/declarations.js";
import { encodeMessage, itemsDigest, itemsOfContents } from "../../src/link/index.js";

function refusal(files: unknown[]): string {
  try {
    parseDeclarationFile(JSON.stringify({ files }), "web.yaml");
  } catch (error) {
    assert.ok(error instanceof UsageError, String(error));
    assert.equal(error.code, "usage");
    return error.message;
  }
  assert.fail("expected a refusal");
}

describe("a declaration file is checked against the wire contract before anything is written", () => {
  test("declaration file — a path with a '..' segment is bad usage naming the file and the entry", () => {
    assert.equal(
      refusal([
        { path: "/etc/motd", content: "" },
        { path: "/etc/../root/x", content: "" },
      ]),
      "web.yaml: files[1].path: expected an absolute path with no '..' segment",
    );
  });

  test("declaration file — two files at one path, a relative path, a bad mode", () => {
    assert.match(
      refusal([
        { path: "/a", content: "1" },
        { path: "/a", content: "2" },
      ]),
      /files\[1\]\.path: repeats/,
    );
    assert.match(refusal([{ path: "etc/motd", content: "" }]), /^web\.yaml: files\[0\]\.path/);
    assert.match(refusal([{ path: "/a", content: "", mode: "999" }]), /^web\.yaml: files\[0\]\.mode/);
  });

  test("declaration file — too much content for one signed message is refused before sending", () => {
    assert.match(
      refusal(["/a", "/b", "/c"].map((path) => ({ path, content: "x".repeat(400_000) }))),
      /would be \d+ bytes, at most 1048576/,
    );
    // One file's content is bounded by itself, whatever the message could hold.
    assert.match(
      refusal([{ path: "/big", content: "x".repeat(600_000) }]),
      /files\[0\]\.content: expected at most 524288 bytes/,
    );
  });

  test("declaration file — what passes encodes as a declaration for any node", () => {
    const files = [
      { path: "/etc/motd", content: "hello\n", mode: "0644" },
      { path: "/etc/issue", content: "" },
    ];
    const items = itemsOfContents(parseDeclarationFile(JSON.stringify({ files }), "web.yaml"));
    assert.deepEqual(items[0], {
      id: "file:/etc/motd",
      type: "file",
      path: "/etc/motd",
      content: "hello\n",
      mode: "0644",
    });
    encodeMessage({
      kind: "declaration",
      node: "web-1",
      epoch: 1,
      sequence: 1,
      issued_at: new Date().toISOString(),
      items,
      digest: itemsDigest(items),
    });
  });
});
