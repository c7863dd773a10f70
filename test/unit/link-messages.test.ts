import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { describe, test } from "node:test";
import fc from "fast-check";

import {
  ContractError,
  encodeMessage,
  maxMessageBytes,
  messageKinds,
  parseAlive,
  parseDeclaration,
  parseDeclarationBytes,
  parseDeclarationEnvelope,
  parseEnrol,
  parseEnrolReply,
  parseMessage,
  parseReport,
} from "../../src/link/index.js";
import type { MessageKind } from "../../src/link/index.js";

const digest = `sha256:${createHash("sha256").update("a declaration").digest("hex")}`;
const fingerprint = `SHA256:${createHash("sha256").update("a key").digest("base64").replace(/=+$/, "")}`;
const publicKey = randomBytes(32).toString("base64");
const sentAt = "2026-11-29T14:49:00Z";

/** One valid message of every kind, as plain JSON values. */
const valid: Record<MessageKind, Record<string, unknown>> = {
  enrol: {
    kind: "enrol",
    node: "web-1",
    token_id: "tok_0123456789ab",
    secret: randomBytes(32).toString("base64url"),
    keys: {
      signing: publicKey,
      overlay: randomBytes(32).toString("base64"),
      broker_user: `U${"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".repeat(2).slice(0, 55)}`,
    },
    profile: { cpu: 4, memory_mb: 8192, os: "linux", arch: "x64", labels: { zone: "eu-1" }, roles: ["web"] },
    agent_version: "0.1.0",
    sent_at: sentAt,
  },
  enrol_reply: {
    kind: "enrol_reply",
    accepted: true,
    node: "web-1",
    queue: "node.web-1",
    broker: { url: "nats://127.0.0.1:4222", credential: { type: "nats", jwt: "eyJhIjoxfQ.eyJiIjoyfQ.c2ln" } },
    signing_key: publicKey,
    fingerprint,
  },
  declaration: {
    kind: "declaration",
    node: "web-1",
    epoch: 7,
    sequence: 3,
    issued_at: sentAt,
    items: [{ id: "file:/etc/motd", type: "file", path: "/etc/motd", content: "hello\n", mode: "0644" }],
    digest,
  },
  declaration_envelope: {
    kind: "declaration_envelope",
    payload: Buffer.from('{"kind":"declaration"}').toString("base64"),
    signature: randomBytes(64).toString("base64"),
    signer: fingerprint,
  },
  report: {
    kind: "report",
    node: "web-1",
    epoch: 7,
    sequence: 3,
    report_sequence: 12,
    digest,
    outcome: "failed",
    reason: "one file could not be written",
    items: [{ id: "file:/etc/motd", state: "failed", reason: "read-only file system" }],
    sent_at: sentAt,
  },
  alive: { kind: "alive", node: "web-1", sent_at: sentAt, report_sequence: 12 },
  receipt: { kind: "receipt", node: "web-1", report_sequence: 12, verdict: "kept" },
};

/** A change to a valid message: set or drop the field at a dotted path such as `items.0.path`. */
type Change = { path: string[]; to?: unknown; drop?: true };
const set = (path: string, to: unknown): Change => ({ path: path.split("."), to });
const drop = (path: string): Change => ({ path: path.split("."), drop: true });

/** A fresh copy of the valid message of `kind` with `changes` applied. */
function validWith(kind: MessageKind, ...changes: Change[]): Record<string, unknown> {
  const copy = structuredClone(valid[kind]);
  for (const change of changes) {
    const parent = change.path
      .slice(0, -1)
      .reduce((object, key) => object[key] as Record<string, unknown>, copy);
    const last = change.path[change.path.length - 1]!;
    if (change.drop) delete parent[last];
    else parent[last] = change.to;
  }
  return copy;
}

/** Runs `parse` and asserts it is refused with a ContractError whose reason contains every one of `parts`. */
function assertRefused(parse: () => unknown, ...parts: string[]): void {
  assert.throws(parse, (error: unknown) => {
    assert.ok(error instanceof ContractError, `expected a ContractError, got ${String(error)}`);
    assert.equal(error.code, "contract");
    for (const part of parts)
      assert.ok(error.reason.includes(part), `reason ${JSON.stringify(error.reason)} lacks ${part}`);
    return true;
  });
}

/** Parses and lets only a ContractError with a non-empty reason through; anything else fails the property. */
function acceptedOrContractError(kind: MessageKind, input: unknown): void {
  try {
    const parsed = parseMessage(kind, input);
    // What is accepted must survive its own encoding unchanged (compared as JSON: a value built in memory may carry
    // an optional field set to undefined, which JSON has no way to say).
    assert.deepEqual(parseMessage(kind, encodeMessage(parsed)), JSON.parse(JSON.stringify(parsed)));
  } catch (error) {
    if (!(error instanceof ContractError)) throw error;
    assert.equal(typeof error.reason, "string");
    assert.ok(error.reason.length > 0, "a refusal must say why");
  }
}

void describe("link messages", () => {
  for (const kind of messageKinds) {
    void test(`messages — a valid ${kind} parses from a value, a string and bytes`, () => {
      const message = valid[kind];
      const fromValue = parseMessage(kind, message);
      assert.equal(fromValue.kind, kind);
      assert.deepEqual(parseMessage(kind, JSON.stringify(message)), fromValue);
      assert.deepEqual(parseMessage(kind, new TextEncoder().encode(JSON.stringify(message))), fromValue);
      assert.deepEqual(parseMessage(kind, encodeMessage(fromValue)), fromValue);
    });
  }

  void test("messages — the per-kind parse functions parse their own kind", () => {
    assert.equal(parseEnrol(valid.enrol).kind, "enrol");
    assert.equal(parseEnrolReply(valid.enrol_reply).kind, "enrol_reply");
    assert.equal(parseDeclaration(valid.declaration).kind, "declaration");
    assert.equal(parseDeclarationEnvelope(valid.declaration_envelope).kind, "declaration_envelope");
    assert.equal(parseReport(valid.report).kind, "report");
    assert.equal(parseAlive(valid.alive).kind, "alive");
  });

  void test("messages — a message of another kind is refused, naming the kind field", () => {
    assertRefused(() => parseReport(valid.alive), "report.kind", "expected report");
  });

  void test("messages — enrol fills the profile's defaults and drops unknown fields", () => {
    const enrol = parseEnrol(
      validWith(
        "enrol",
        drop("profile.labels"),
        drop("profile.roles"),
        drop("keys.broker_user"),
        set("added_by_a_newer_agent", true),
      ),
    );
    assert.deepEqual(enrol.profile.labels, {});
    assert.deepEqual(enrol.profile.roles, []);
    assert.deepEqual(enrol.profile.drivers, []);
    assert.equal(enrol.keys.broker_user, undefined);
    assert.equal("added_by_a_newer_agent" in enrol, false);
  });

  void test("messages — enrol refusals name the field", () => {
    assertRefused(() => parseEnrol(validWith("enrol", set("node", "Web_1"))), "enrol.node", "node name");
    assertRefused(
      () => parseEnrol(validWith("enrol", set("secret", randomBytes(31).toString("base64url")))),
      "enrol.secret",
      "32 bytes",
    );
    assertRefused(
      () => parseEnrol(validWith("enrol", set("keys.overlay", randomBytes(33).toString("base64")))),
      "enrol.keys.overlay",
    );
    assertRefused(
      () =>
        parseEnrol(validWith("enrol", set("keys.signing", "not base64 at all, but 44 characters long!!"))),
      "enrol.keys.signing",
    );
    assertRefused(
      () => parseEnrol(validWith("enrol", set("keys.broker_user", "A".repeat(56)))),
      "enrol.keys.broker_user",
    );
    assertRefused(
      () => parseEnrol(validWith("enrol", set("profile.cpu", 0))),
      "enrol.profile.cpu",
      "at least 1",
    );
    assertRefused(
      () => parseEnrol(validWith("enrol", set("profile.memory_mb", 1.5))),
      "enrol.profile.memory_mb",
    );
    assertRefused(
      () => parseEnrol(validWith("enrol", set("profile.labels", { _x: "y" }))),
      "enrol.profile.labels",
    );
    assertRefused(() => parseEnrol(validWith("enrol", drop("sent_at"))), "enrol.sent_at: required");
    assertRefused(
      () => parseEnrol(validWith("enrol", set("sent_at", "yesterday"))),
      "enrol.sent_at",
      "ISO 8601",
    );
  });

  void test("messages — an enrol reply is accepted with a credential, or refused with a reason", () => {
    const amqp = parseEnrolReply(
      validWith(
        "enrol_reply",
        set("broker", {
          url: "amqp://127.0.0.1:5672",
          credential: { type: "amqp", username: "node-web-1", password: "pw" },
        }),
      ),
    );
    assert.equal(amqp.accepted && amqp.broker.credential.type, "amqp");
    const refused = parseEnrolReply({ kind: "enrol_reply", accepted: false, reason: "token refused" });
    assert.equal(refused.accepted, false);
    assertRefused(
      () => parseEnrolReply({ kind: "enrol_reply", accepted: false }),
      "enrol_reply.reason: required",
    );
    assertRefused(
      () => parseEnrolReply(validWith("enrol_reply", set("accepted", "yes"))),
      "enrol_reply.accepted",
    );
    assertRefused(
      () => parseEnrolReply(validWith("enrol_reply", set("broker.credential.type", "ldap"))),
      "enrol_reply.broker.credential.type: expected one of nats|amqp",
    );
    assertRefused(
      () => parseEnrolReply(validWith("enrol_reply", set("fingerprint", "SHA256:short"))),
      "enrol_reply.fingerprint",
    );
    assertRefused(
      () => parseEnrolReply(validWith("enrol_reply", set("broker.url", "http://x"))),
      "enrol_reply.broker.url",
    );
  });

  void test("messages — declaration refusals name the field", () => {
    const refusedWith = (change: Change, ...parts: string[]) =>
      assertRefused(() => parseDeclaration(validWith("declaration", change)), ...parts);
    refusedWith(set("items.0.path", "etc/motd"), "declaration.items[0].path", "absolute");
    refusedWith(
      set("items.0.path", "/etc/../root/.ssh/authorized_keys"),
      "declaration.items[0].path",
      "'..'",
    );
    refusedWith(set("items.0.mode", "rw-r--r--"), "declaration.items[0].mode", "octal");
    refusedWith(set("items.0.type", "socket"), "declaration.items[0].type: expected one of file");
    // An item must be named by what it is: a file by its path.
    refusedWith(set("items.0.id", "file:/etc/other"), "declaration.items[0].id", "named by its path");
    refusedWith(set("epoch", -1), "declaration.epoch");
    refusedWith(set("sequence", 0), "declaration.sequence");
    refusedWith(set("digest", digest.toUpperCase()), "declaration.digest");
    refusedWith(
      set("items.1", (valid.declaration.items as unknown[])[0]),
      "declaration.items[1].id",
      "repeats",
    );
  });

  void test("messages — declarations and envelopes refuse unknown fields instead of dropping them", () => {
    assertRefused(
      () => parseDeclaration(validWith("declaration", set("run_as", "root"))),
      "declaration",
      "unknown field",
      "run_as",
    );
    assertRefused(
      () => parseDeclaration(validWith("declaration", set("items.0.run_as", "root"))),
      "declaration.items[0]",
      "run_as",
    );
    assertRefused(
      () => parseDeclarationEnvelope(validWith("declaration_envelope", set("note", "x"))),
      "unknown field",
      "note",
    );
  });

  void test("messages — envelope refusals name the field", () => {
    assertRefused(
      () =>
        parseDeclarationEnvelope(
          validWith("declaration_envelope", set("signature", randomBytes(63).toString("base64"))),
        ),
      "declaration_envelope.signature",
      "64 bytes",
    );
    assertRefused(
      () => parseDeclarationEnvelope(validWith("declaration_envelope", set("payload", "not*base64"))),
      "declaration_envelope.payload",
    );
  });

  void test("messages — report refusals name the field", () => {
    assertRefused(
      () => parseReport(validWith("report", set("items.0.state", "done"))),
      "report.items[0].state: expected one of applied|failed",
    );
    assertRefused(
      () => parseReport(validWith("report", drop("reason"))),
      "report.reason",
      "required when the outcome is failed",
    );
    assertRefused(
      () => parseReport(validWith("report", set("outcome", "refused"), drop("reason"))),
      "outcome is refused",
    );
    assertRefused(() => parseReport(validWith("report", set("outcome", "partial"))), "report.outcome");
  });

  void test("messages — a report carries all three ordering fields or none", () => {
    const unordered = parseReport(
      validWith("report", drop("epoch"), drop("sequence"), drop("report_sequence")),
    );
    assert.equal(unordered.epoch, undefined);
    assertRefused(
      () => parseReport(validWith("report", drop("report_sequence"))),
      "report.report_sequence",
      "come together or not at all",
    );
    assertRefused(
      () => parseReport(validWith("report", set("sequence", undefined), drop("epoch"))),
      "report.epoch",
      "report.sequence",
    );
  });

  void test("messages — alive refusals name the field", () => {
    assert.equal(parseAlive({ kind: "alive", node: "web-1", sent_at: sentAt }).report_sequence, undefined);
    assertRefused(() => parseAlive(validWith("alive", set("report_sequence", -1))), "alive.report_sequence");
    assertRefused(() => parseAlive(validWith("alive", drop("node"))), "alive.node: required");
  });

  void test("messages — bytes that are not one UTF-8 JSON object under 1 MiB are refused with a reason", () => {
    assertRefused(() => parseAlive(Uint8Array.from([0x7b, 0xff, 0x7d])), "alive", "UTF-8");
    assertRefused(() => parseAlive('{"kind": "alive",'), "alive", "not valid JSON");
    assertRefused(() => parseAlive("[]"), "alive", "expected a JSON object, received array");
    assertRefused(() => parseAlive("null"), "expected a JSON object, received null");
    assertRefused(() => parseAlive(42), "expected a JSON object, received number");
    const huge = JSON.stringify({ ...valid.alive, padding: "x".repeat(maxMessageBytes) });
    assertRefused(() => parseAlive(huge), "at most 1048576");
    assertRefused(() => parseAlive(new TextEncoder().encode(huge)), "at most 1048576");
    assertRefused(() => parseMessage("gossip" as MessageKind, valid.alive), "unknown message kind");
  });

  void test("messages — a refusal never quotes the value it refused", () => {
    const secret = "s3cr3t-".repeat(10);
    assert.throws(
      () => parseEnrol(validWith("enrol", set("secret", secret))),
      (error: unknown) => error instanceof ContractError && !error.message.includes(secret),
    );
  });

  void test("messages — parseDeclarationBytes parses the exact signed bytes and takes bytes only", () => {
    const bytes = encodeMessage(parseDeclaration(valid.declaration));
    assert.deepEqual(parseDeclarationBytes(bytes), parseDeclaration(valid.declaration));
    assertRefused(
      () => parseDeclarationBytes(JSON.stringify(valid.declaration) as unknown as Uint8Array),
      "signed bytes",
    );
  });

  void test("messages — encodeMessage refuses what the contract refuses and is stable over key order", () => {
    const declaration = parseDeclaration(valid.declaration);
    const reordered = Object.fromEntries(Object.entries(declaration).reverse()) as typeof declaration;
    assert.deepEqual(encodeMessage(reordered), encodeMessage(declaration));
    assertRefused(
      () =>
        encodeMessage({
          ...declaration,
          items: [{ ...declaration.items[0]!, path: "relative" } as (typeof declaration.items)[number]],
        }),
      "declaration.items[0].path",
    );
  });
});

/** Every path into a JSON value, so a mutation can reach any field at any depth. */
function pathsOf(value: unknown, prefix: string[] = []): string[][] {
  if (typeof value !== "object" || value === null) return [prefix];
  // Object.keys rather than Array methods: a mutation may have given an array a strange prototype or constructor.
  const keys = Object.keys(value);
  return [
    prefix,
    ...keys.flatMap((key) => pathsOf((value as Record<string, unknown>)[key], [...prefix, key])),
  ];
}

type Mutation = { op: "drop" | "replace" | "inject"; at: number; key: string; garbage: unknown };

function mutate(message: Record<string, unknown>, mutation: Mutation): unknown {
  const copy = structuredClone(message);
  const paths = pathsOf(copy);
  const path = paths[mutation.at % paths.length]!;
  if (path.length === 0)
    return mutation.op === "replace" ? mutation.garbage : { ...copy, [mutation.key]: mutation.garbage };
  let parent: Record<string, unknown> = copy;
  for (const key of path.slice(0, -1)) parent = parent[key] as Record<string, unknown>;
  const last = path[path.length - 1]!;
  const target = parent[last];
  switch (mutation.op) {
    case "drop":
      delete parent[last];
      break;
    case "replace":
      parent[last] = mutation.garbage;
      break;
    case "inject":
      // Into an array, a new element (a named key would not survive JSON, and `length` cannot take garbage).
      if (Array.isArray(target)) target.push(mutation.garbage);
      else if (typeof target === "object" && target !== null)
        (target as Record<string, unknown>)[mutation.key] = mutation.garbage;
      else parent[last] = mutation.garbage;
      break;
  }
  return copy;
}

const mutation: fc.Arbitrary<Mutation> = fc.record({
  op: fc.constantFrom("drop", "replace", "inject"),
  at: fc.nat(),
  key: fc.oneof(fc.string(), fc.constantFrom("__proto__", "constructor", "kind", "node", "epoch", "items")),
  garbage: fc.oneof(fc.anything({ withNullPrototype: true, withObjectString: true }), fc.jsonValue()),
});

const runs = { numRuns: 400 };

void describe("link messages — properties", () => {
  for (const kind of messageKinds) {
    void test(`properties — ${kind}: arbitrary bytes are accepted or refused only with a ContractError`, () => {
      fc.assert(
        fc.property(fc.uint8Array({ maxLength: 2_048 }), (bytes) => acceptedOrContractError(kind, bytes)),
        runs,
      );
    });

    void test(`properties — ${kind}: arbitrary JSON values and strings are refused only with a ContractError`, () => {
      fc.assert(
        fc.property(fc.jsonValue(), fc.string(), (value, text) => {
          acceptedOrContractError(kind, value);
          acceptedOrContractError(kind, JSON.stringify(value));
          acceptedOrContractError(kind, text);
        }),
        runs,
      );
    });

    void test(`properties — ${kind}: a mutated valid message is accepted or refused only with a ContractError`, () => {
      fc.assert(
        fc.property(fc.array(mutation, { minLength: 1, maxLength: 3 }), (mutations) => {
          const mutated = mutations.reduce<unknown>(
            (message, change) => mutate(message as Record<string, unknown>, change),
            valid[kind],
          );
          acceptedOrContractError(kind, mutated);
          const text = JSON.stringify(mutated) as string | undefined;
          if (text !== undefined) acceptedOrContractError(kind, text);
        }),
        runs,
      );
    });
  }
});
