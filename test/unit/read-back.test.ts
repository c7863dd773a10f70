import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { join } from "node:path";
import { MeshError } from "../../src/errors.js";
import { HostState, HostStateError, memoryStorage } from "../../src/host/state.js";
import { encodeMessage, emptyDigest, parseHolderRecord } from "../../src/link/index.js";
import { tempDir } from "../support/tmp.js";

const scratch = tempDir("mesh-read-back-");
after(() => scratch.remove());

describe("what is read back is checked", () => {
  test("read back — a lease holder record is checked, and a damaged one names where it was read", () => {
    const holder = {
      id: "h-1",
      host: "a",
      pid: 7,
      taken_at: "2026-11-30T12:00:00Z",
      epoch: 3,
      ttl_ms: 15000,
    };
    assert.deepEqual(
      parseHolderRecord(JSON.stringify({ ...holder, added_later: true }), "the bucket"),
      holder,
    );
    for (const [text, pattern] of [
      ["{", /the lease holder record in the bucket is not JSON/],
      [JSON.stringify({ ...holder, pid: "7" }), /in the bucket is damaged: pid: /],
      [JSON.stringify({ host: "a", pid: 7, taken_at: "x" }), /damaged: id: /],
    ] as const) {
      assert.throws(
        () => parseHolderRecord(text, "the bucket"),
        (error: unknown) =>
          error instanceof MeshError && error.code === "lease" && pattern.test(error.message),
      );
    }
  });

  test("read back — the agent's kept report and held items are checked against the wire contract", () => {
    const state = new HostState(join(scratch.path, "state"), memoryStorage());
    assert.equal(state.loadReport("pending-report.json"), undefined);
    assert.equal(state.loadItems("held-items.json"), undefined);
    const report = new TextDecoder().decode(
      encodeMessage({
        kind: "report",
        node: "web-1",
        epoch: 1,
        sequence: 1,
        report_sequence: 4,
        digest: emptyDigest,
        outcome: "applied",
        items: [{ id: "file:/etc/motd", state: "applied" }],
        sent_at: new Date().toISOString(),
      }),
    );
    state.saveSecret("pending-report.json", report);
    assert.equal(state.loadReport("pending-report.json")?.report_sequence, 4);
    state.saveSecret("held-items.json", JSON.stringify([{ id: "file:/etc/motd", state: "applied" }]));
    assert.deepEqual(state.loadItems("held-items.json"), [{ id: "file:/etc/motd", state: "applied" }]);

    state.saveSecret("pending-report.json", JSON.stringify({ report_sequence: "4" }));
    assert.throws(
      () => state.loadReport("pending-report.json"),
      (error: unknown) =>
        error instanceof HostStateError &&
        /pending-report\.json is not what it should hold/.test(error.message),
    );
    state.saveSecret("held-items.json", JSON.stringify([{ id: "file:/etc/motd", state: "maybe" }]));
    assert.throws(
      () => state.loadItems("held-items.json"),
      (error: unknown) =>
        error instanceof HostStateError && /held-items\.json is not what it should hold/.test(error.message),
    );
  });
});
