/**
 * Reports, alives and declarations' envelopes in their plain shape are checked without their schema: whatever the quick check takes must
 * be taken by the schema too, as the very same message, and anything else must be left to the schema.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";

import { messageSchemas } from "../../src/link/messages.js";
import { parseAlive, parseDeclarationEnvelope, parseReportText } from "../../src/link/index.js";
import { quickAlive, quickEnvelope, quickReport } from "../../src/link/quick-check.js";

/** A field left out of the message altogether. */
const absent = Symbol("absent");

/** Mostly a valid value, sometimes something else or nothing: most messages are valid, and each field is tried. */
function field<T>(valid: fc.Arbitrary<T>, other: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc.oneof({ weight: 14, arbitrary: valid }, other, fc.constant(absent));
}

/** An optional field: mostly absent or valid, sometimes something else. */
function optional<T>(valid: fc.Arbitrary<T>, other: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc.oneof({ weight: 7, arbitrary: fc.constant(absent) }, { weight: 7, arbitrary: valid }, other);
}

/** The message without its absent fields, after any unknown ones. */
function message(fields: fc.Arbitrary<Record<string, unknown>>): fc.Arbitrary<object> {
  return fc.tuple(fields, extras).map(([known, extra]) => ({
    ...extra,
    ...Object.fromEntries(Object.entries(known).filter(([, value]) => value !== absent)),
  }));
}

const extras = fc.oneof(
  { weight: 3, arbitrary: fc.constant({}) },
  fc.dictionary(fc.constantFrom("extra", "note", "__proto__", "constructor", "x-y"), fc.jsonValue(), {
    maxKeys: 2,
  }),
);
const validNode = fc.stringMatching(/^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/);
const otherNodes = fc.oneof(
  fc.string({ maxLength: 70 }),
  fc.constantFrom("", "-web", "web-", "Web-1", "web 1", "a".repeat(64), "wéb", 7, null),
);
const validCount = fc.oneof(fc.nat(), fc.constantFrom(0, -0, Number.MAX_SAFE_INTEGER));
const otherCounts = fc.oneof(
  fc.integer({ max: -1 }),
  fc.double(),
  fc.constantFrom(-1, 1.5, Number.MAX_SAFE_INTEGER + 1, 1e300, "3", null, true),
);
const validDigest = fc.stringMatching(/^sha256:[0-9a-f]{64}$/);
const otherDigests = fc.oneof(
  fc.stringMatching(/^sha256:[0-9a-fA-F]{63,65}$/),
  fc.constantFrom("", "sha256:", `SHA256:${"a".repeat(64)}`, `sha256:${"a".repeat(64)}\n`, 5),
);
const validTimestamp = fc.oneof(
  fc
    .date({ noInvalidDate: true, min: new Date(0), max: new Date("9999-12-31T23:59:59Z") })
    .map((at) => at.toISOString()),
  fc.constantFrom(
    "2026-11-29T14:49:00Z",
    "2026-11-29T14:49:00+01:00",
    "2026-11-29T14:49:00.123456-05:30",
    "2024-02-29T00:00:00Z",
  ),
);
const otherTimestamps = fc.oneof(
  fc.constantFrom(
    "2026-02-29T00:00:00Z",
    "2026-11-29T14:49:00",
    "2026-11-29 14:49:00Z",
    "2026-11-29T24:00:00Z",
    "2026-11-29T14:49Z",
    "+010000-01-01T00:00:00.000Z",
    "",
    1764427740000,
  ),
  fc.string({ maxLength: 30 }),
);
/** Reasons, details and drifts: short text, text near the 512-byte bound in several scripts. */
const validText = fc.oneof(
  { weight: 3, arbitrary: fc.string({ minLength: 1, maxLength: 40 }) },
  fc
    .integer({ min: 160, max: 520 })
    .chain((length) =>
      fc.constantFrom("a", "é", "€", "😀").map((char) => char.repeat(Math.max(1, length / char.length))),
    ),
  fc.string({ unit: "grapheme", minLength: 100, maxLength: 300 }),
);
const otherTexts = fc.constantFrom("", 0, null, ["x"], { text: "x" });
const validItemId = fc.oneof(
  fc.constantFrom("file:/etc/motd", "service:web", "user:deploy", "file:/a\nb", `file:/${"x".repeat(4_090)}`),
  fc
    .tuple(fc.stringMatching(/^[a-z_]{1,8}$/), fc.string({ minLength: 1, maxLength: 30 }))
    .map(([type, name]) => `${type}:${name}`),
);
const otherItemIds = fc.oneof(
  fc.string({ maxLength: 20 }),
  fc.constantFrom("file:", ":x", "File:/x", `file:/${"x".repeat(4_091)}`, 1, null),
);
const items = fc.oneof(
  {
    weight: 8,
    arbitrary: message(
      fc.record({
        id: field(validItemId, otherItemIds),
        state: field(fc.constantFrom("applied", "failed"), fc.constantFrom("held", "Applied", 1)),
        reason: optional(validText, otherTexts),
        detail: optional(validText, otherTexts),
        drift: optional(validText, otherTexts),
      }),
    ),
  },
  fc.constantFrom(null, "file:/x", [], 3),
);
const orderings = fc.oneof(
  { weight: 3, arbitrary: fc.constant({ epoch: absent, sequence: absent, report_sequence: absent }) },
  {
    weight: 6,
    arbitrary: fc.record({
      epoch: field(validCount, otherCounts),
      sequence: field(validCount, otherCounts),
      report_sequence: field(validCount, otherCounts),
    }),
  },
);
const reports = message(
  fc
    .tuple(
      fc.record({
        kind: field(fc.constant("report"), fc.constantFrom("alive", "Report", null)),
        node: field(validNode, otherNodes),
        digest: field(validDigest, otherDigests),
        outcome: field(
          fc.constantFrom("applied", "applied", "failed", "refused"),
          fc.constantFrom("done", null),
        ),
        reason: optional(validText, otherTexts),
        items: field(fc.array(items, { maxLength: 4 }), fc.constantFrom({}, "x", null)),
        sent_at: field(validTimestamp, otherTimestamps),
      }),
      orderings,
    )
    .map(([fields, ordering]) => ({ ...fields, ...ordering })),
);
const alives = message(
  fc.record({
    kind: field(fc.constant("alive"), fc.constantFrom("report", null)),
    node: field(validNode, otherNodes),
    sent_at: field(validTimestamp, otherTimestamps),
    report_sequence: optional(validCount, otherCounts),
    holds: optional(
      message(fc.record({ epoch: field(validCount, otherCounts), sequence: field(validCount, otherCounts) })),
      fc.constantFrom(null, [], 0),
    ),
  }),
);

const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/**
 * `text` (canonical base64) with its last character's unused bits set, where it has any: the same bytes to a lenient
 * decoder, not the canonical spelling. Without unused bits, a stray `=` instead.
 */
function withUnusedBits(text: string): string {
  const padding = text.length - text.replace(/=+$/, "").length;
  if (padding === 0) return `${text}=`;
  const at = text.length - padding - 1;
  const index = base64Alphabet.indexOf(text.charAt(at));
  return `${text.slice(0, at)}${base64Alphabet.charAt(index + 1)}${text.slice(at + 1)}`;
}

/** Base64 of `bytes`, canonical or not: padding dropped, unused bits set, a space, the URL alphabet. */
function base64Of(bytes: fc.Arbitrary<Uint8Array>): fc.Arbitrary<string> {
  return bytes.chain((raw) => {
    const text = Buffer.from(raw).toString("base64");
    return fc.oneof(
      { weight: 8, arbitrary: fc.constant(text) },
      fc.constant(text.replace(/=+$/, "")),
      fc.constant(withUnusedBits(text)),
      fc.constant(` ${text}`),
      fc.constant(text.replaceAll("+", "-")),
    );
  });
}
const envelopes = message(
  fc.record({
    kind: field(fc.constant("declaration_envelope"), fc.constantFrom("declaration", "report", null)),
    payload: field(
      base64Of(fc.uint8Array({ maxLength: 300 })),
      fc.constantFrom("", "====", "AA==AA==", 7, null),
    ),
    signature: field(
      base64Of(fc.uint8Array({ minLength: 64, maxLength: 64 })),
      fc.oneof(base64Of(fc.uint8Array({ minLength: 62, maxLength: 66 })), fc.constantFrom("", null, 64)),
    ),
    signer: field(
      base64Of(fc.uint8Array({ minLength: 32, maxLength: 32 })).map(
        (text) => `SHA256:${text.replace(/=+$/, "")}`,
      ),
      fc.oneof(
        fc.stringMatching(/^SHA256:[A-Za-z0-9+/=]{40,45}$/),
        fc.constantFrom("", "sha256:abc", `SHA256:${"A".repeat(43)}\n`, null),
      ),
    ),
  }),
);

/**
 * Holds `quick` to `schema` over values JSON.parse made from generated messages: what it takes, the schema takes as
 * the same message. Gives back how many the schema took and how many of those the quick check took.
 */
function holdsTo(
  arbitrary: fc.Arbitrary<object>,
  quick: (value: unknown) => unknown,
  schema: (typeof messageSchemas)["report" | "alive" | "declaration_envelope"],
): { valid: number; taken: number; runs: number } {
  let valid = 0;
  let taken = 0;
  const runs = 20_000;
  fc.assert(
    fc.property(arbitrary, (generated) => {
      const value: unknown = JSON.parse(JSON.stringify(generated));
      const quickly = quick(value);
      const checked = schema.safeParse(value);
      if (checked.success) valid++;
      if (quickly === undefined) return;
      taken++;
      assert.ok(checked.success, `taken quickly, refused by the schema: ${JSON.stringify(value)}`);
      assert.deepStrictEqual(quickly, checked.data);
      // Field for field in the same order: a message written from either is the same bytes (`encodeMessage`).
      assert.equal(JSON.stringify(quickly), JSON.stringify(checked.data));
    }),
    { numRuns: runs },
  );
  return { valid, taken, runs };
}

test("quick check of reports — what it takes, the schema takes as the same report; the rest is the schema's", () => {
  const { valid, taken, runs } = holdsTo(reports, quickReport, messageSchemas.report);
  // Every valid report is in the plain shape (the schema has no transforms): the quick check takes them all, and
  // the generator makes enough of them for that to say something.
  assert.ok(valid > runs / 20, `only ${valid} of ${runs} generated reports were valid`);
  assert.equal(taken, valid, `the quick check took ${taken} of the ${valid} valid reports`);
});

test("quick check of alives — what it takes, the schema takes as the same alive; the rest is the schema's", () => {
  const { valid, taken, runs } = holdsTo(alives, quickAlive, messageSchemas.alive);
  assert.ok(valid > runs / 20, `only ${valid} of ${runs} generated alives were valid`);
  assert.equal(taken, valid, `the quick check took ${taken} of the ${valid} valid alives`);
});

test("quick check of envelopes — what it takes, the schema takes as the same envelope; the rest is the schema's", () => {
  const { valid, taken, runs } = holdsTo(envelopes, quickEnvelope, messageSchemas.declaration_envelope);
  assert.ok(valid > runs / 20, `only ${valid} of ${runs} generated envelopes were valid`);
  assert.equal(taken, valid, `the quick check took ${taken} of the ${valid} valid envelopes`);
});

test("quick check — a current agent's report and alive are taken quickly, with unknown fields dropped", () => {
  const report = {
    kind: "report",
    node: "web-1",
    epoch: 3,
    sequence: 7,
    report_sequence: 12,
    digest: `sha256:${"ab".repeat(32)}`,
    outcome: "failed",
    reason: "1 of 2 items failed",
    items: [
      { id: "file:/etc/motd", state: "applied", drift: "content changed", later: 1 },
      { id: "service:web", state: "failed", reason: "exit 1" },
    ],
    sent_at: "2026-12-01T10:00:00.000Z",
    newer_field: { any: "thing" },
  };
  const taken = quickReport(JSON.parse(JSON.stringify(report)));
  const { newer_field: _dropped, ...known } = report;
  const [first, second] = report.items;
  assert.deepStrictEqual(taken, {
    ...known,
    items: [{ id: first?.id, state: first?.state, drift: first?.drift }, second],
  });
  assert.deepStrictEqual(parseReportText(new TextEncoder().encode(JSON.stringify(report))).report, taken);

  const alive = {
    kind: "alive",
    node: "web-1",
    sent_at: "2026-12-01T10:00:00Z",
    holds: { epoch: 3, sequence: 7 },
  };
  assert.deepStrictEqual(quickAlive(JSON.parse(JSON.stringify(alive))), alive);
  assert.deepStrictEqual(parseAlive(JSON.stringify(alive)), alive);
});

test("quick check — refusals still come from the schema, with its reasons", () => {
  const halfOrdered = {
    kind: "report",
    node: "web-1",
    epoch: 3,
    digest: `sha256:${"ab".repeat(32)}`,
    outcome: "applied",
    items: [],
    sent_at: "2026-12-01T10:00:00Z",
  };
  assert.equal(quickReport(halfOrdered), undefined);
  assert.throws(
    () => parseReportText(new TextEncoder().encode(JSON.stringify(halfOrdered))),
    /report\.sequence: required when epoch is given/,
  );
  assert.throws(
    () => parseAlive(JSON.stringify({ kind: "alive", node: "web-1", sent_at: "yesterday" })),
    /alive\.sent_at: expected an ISO 8601 timestamp/,
  );
  const envelope = {
    kind: "declaration_envelope",
    payload: "e30=",
    signature: Buffer.alloc(64, 7).toString("base64"),
    signer: `SHA256:${Buffer.alloc(32, 9).toString("base64").replace(/=+$/, "")}`,
  };
  assert.deepStrictEqual(parseDeclarationEnvelope(JSON.stringify(envelope)), envelope);
  assert.equal(quickEnvelope({ ...envelope, signed_by: "me" }), undefined);
  assert.throws(
    () => parseDeclarationEnvelope(JSON.stringify({ ...envelope, signed_by: "me" })),
    /declaration_envelope: unknown field "signed_by"/,
  );
  assert.throws(
    () => parseDeclarationEnvelope(JSON.stringify({ ...envelope, payload: "e30" })),
    /declaration_envelope\.payload: expected the declaration's bytes in base64/,
  );
});
