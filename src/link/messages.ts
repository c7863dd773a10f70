import { z } from "zod";
import { fitsBytes, reasonMaxBytes } from "./bounds.js";
import { declaredItemSchema, itemIdOf } from "./items.js";
import { nodeNamePattern } from "./names.js";

/**
 * The schema of every message kind on the wire. Messages a node sends use zod's default of dropping unknown fields,
 * so a newer agent can add fields without being refused by an older control plane. The declaration and its envelope
 * are strict instead: they are signed, and a field the node would silently drop is a field it was told to obey.
 */

export const nodeName = z.string().regex(nodeNamePattern, {
  error: "expected a node name: 1–63 of a-z, 0-9 and '-', not starting or ending with '-'",
});

/** The pattern `timestamp` holds text to (zod's own for an ISO 8601 date and time with an offset). */
export const timestampPattern = z.regexes.datetime({ offset: true, local: false });

export const timestamp = z.iso.datetime({
  offset: true,
  error: "expected an ISO 8601 timestamp such as 2026-11-29T14:49:00Z",
});

/** A short piece of text from a machine or a person: a version, an OS name, a role. */
export const word = z.string().min(1).max(256);

/** Why something failed or was refused: a tool's error line, bounded so what a node says cannot fill a disk or a log. */
const reasonText = z
  .string()
  .min(1)
  .refine((text) => fitsBytes(text), { error: `expected at most ${reasonMaxBytes} bytes of UTF-8` });

/** True when `text` is the canonical base64 (or base64url, unpadded) spelling of exactly `length` bytes. */
export function encodesBytes(text: string, encoding: "base64" | "base64url", length: number): boolean {
  const expectedChars = encoding === "base64" ? 4 * Math.ceil(length / 3) : Math.ceil((length * 4) / 3);
  if (text.length !== expectedChars) return false;
  // Buffer skips characters outside the alphabet, so only a round trip proves the text is what it claims.
  const bytes = Buffer.from(text, encoding);
  return bytes.length === length && bytes.toString(encoding) === text;
}

function base64Bytes(length: number, what: string) {
  return z.string().refine((text) => encodesBytes(text, "base64", length), {
    error: `expected ${what}: base64 of ${length} bytes`,
  });
}

export function isCanonicalBase64(text: string): boolean {
  return text.length > 0 && text.length % 4 === 0 && Buffer.from(text, "base64").toString("base64") === text;
}

const ed25519PublicKey = base64Bytes(32, "a raw Ed25519 public key");

/** `SHA256:` and the unpadded base64 of a SHA-256 digest, as ssh-keygen prints a key's fingerprint. */
export const fingerprintPattern = /^SHA256:[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]$/;
const fingerprint = z.string().regex(fingerprintPattern, {
  error: 'expected a fingerprint: "SHA256:" and 43 characters of unpadded base64',
});

/** The name of one declaration: `sha256:` and lowercase hex, as the composer computes it. */
export const digestPattern = /^sha256:[0-9a-f]{64}$/;
const digest = z.string().regex(digestPattern, {
  error: 'expected a digest: "sha256:" and 64 lowercase hex digits',
});

const epoch = z.int().min(0);
const sequence = z.int().min(1);
export { epoch as declarationEpoch, sequence as declarationSequence };
/** In reports and alives, 0 means the node has applied no declaration yet. */
const heldSequence = z.int().min(0);
const reportSequence = z.int().min(0);

/** A declared item's identity, `<type>:<name>`, e.g. `file:/etc/motd`; reports name items by it. */
export const itemIdPattern = /^[a-z_]+:.+$/s;
export const itemIdMaxChars = 4_096;
const itemId = z
  .string()
  .max(itemIdMaxChars)
  .regex(itemIdPattern, { error: 'expected an item id "<type>:<name>", e.g. "file:/etc/motd"' });

/** Label keys exclude a leading '_' or '.' so no key can reach an object's prototype. */
export const labelKey = z.string().regex(/^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$/, {
  error:
    "expected a label key: 1–128 of A-Z, a-z, 0-9, '.', '_', '/' and '-', starting and ending alphanumeric",
});

/** `enrol`, node → control plane: what a joining node says once the broker let its token in. */
export const enrolSchema = z.object({
  kind: z.literal("enrol"),
  /** The name the node claims; the token's node record decides, and the reply says the real one. */
  node: nodeName,
  token_id: z.string().min(1).max(256),
  secret: z.string().refine((text) => encodesBytes(text, "base64url", 32), {
    error: "expected the token secret: unpadded base64url of 32 bytes",
  }),
  keys: z.object({
    signing: ed25519PublicKey,
    overlay: base64Bytes(32, "a WireGuard public key"),
    broker_user: z
      .string()
      .regex(/^U[A-Z2-7]{55}$/, {
        error: 'expected a NATS user public key: 56 characters of base32 starting "U"',
      })
      .optional(),
  }),
  profile: z.object({
    cpu: z.int().min(1),
    memory_mb: z.int().min(1),
    os: word,
    arch: word,
    labels: z.record(labelKey, z.string().max(1_024)).default({}),
    roles: z.array(word).default([]),
    drivers: z.array(word).default([]),
  }),
  agent_version: word,
  sent_at: timestamp,
});

/** The long-lived broker identity an enrolled node receives in the enrol reply, and keeps in its state. */
export const nodeCredentialSchema = z.discriminatedUnion("type", [
  z.object({
    type: z.literal("nats"),
    jwt: z.string().regex(/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/, { error: "expected a JWT" }),
  }),
  z.object({ type: z.literal("amqp"), username: word, password: z.string().min(1).max(1_024) }),
]);

/** `enrol_reply`, control plane → node: everything the node needs to come back on its own after any restart. */
export const enrolReplySchema = z.discriminatedUnion("accepted", [
  z.object({
    kind: z.literal("enrol_reply"),
    accepted: z.literal(true),
    /** The node's authoritative name, from the token's node record. */
    node: nodeName,
    queue: word,
    broker: z.object({
      url: z.url({
        protocol: /^(nats|tls|wss?|amqps?)$/,
        error: "expected a broker URL (nats, tls, ws, amqp)",
      }),
      credential: nodeCredentialSchema,
    }),
    signing_key: ed25519PublicKey,
    fingerprint,
    /**
     * For a node that enrolled before (its machine rebuilt, joining again under its name): what its last account said
     * it held, so it can tell what the mesh put there from what it did not.
     */
    recovery: z.object({ items: z.array(z.object({ id: itemId })).max(100_000) }).optional(),
  }),
  z.object({ kind: z.literal("enrol_reply"), accepted: z.literal(false), reason: reasonText }),
]);

/** `declaration`: what a node should hold. These are the signed bytes; the node parses them only once verified. */
export const declarationSchema = z
  .strictObject({
    kind: z.literal("declaration"),
    node: nodeName,
    /** The lease epoch under which it was composed. */
    epoch,
    /** Per node, rising with every declaration sent to it. */
    sequence,
    issued_at: timestamp,
    items: z.array(declaredItemSchema),
    /** The name reports give this declaration; the ordering rule falls back on it for agents that send no order. */
    digest,
  })
  .superRefine((declaration, context) => {
    // A report names items by id, so two items with one id would make the report ambiguous.
    const seen = new Set<string>();
    declaration.items.forEach((item, index) => {
      const expected = itemIdOf(item);
      if (item.id !== expected) {
        context.addIssue({
          code: "custom",
          path: ["items", index, "id"],
          message: `expected "${expected.slice(0, 200)}": a ${item.type} is named by its ${item.type === "file" || item.type === "directory" || item.type === "symlink" ? "path" : "name"}`,
        });
      }
      if (seen.has(item.id)) {
        context.addIssue({
          code: "custom",
          path: ["items", index, "id"],
          message: "repeats an earlier item's id",
        });
      }
      seen.add(item.id);
    });
  });

/** `declaration_envelope`, control plane → node: the declaration's exact bytes, unchanged, and their signature. */
export const declarationEnvelopeSchema = z.strictObject({
  kind: z.literal("declaration_envelope"),
  payload: z.string().refine(isCanonicalBase64, { error: "expected the declaration's bytes in base64" }),
  signature: base64Bytes(64, "an Ed25519 signature"),
  signer: fingerprint,
});

const orderingFields = ["epoch", "sequence", "report_sequence"] as const;

/** `report`, node → control plane: the node's own account of what it applied, failed or refused. */
export const reportSchema = z
  .object({
    kind: z.literal("report"),
    node: nodeName,
    epoch: epoch.optional(),
    sequence: heldSequence.optional(),
    report_sequence: reportSequence.optional(),
    /** The digest of the declaration this report is about. */
    digest,
    outcome: z.enum(["applied", "failed", "refused"]),
    reason: reasonText.optional(),
    items: z.array(
      z.object({
        id: itemId,
        state: z.enum(["applied", "failed"]),
        reason: reasonText.optional(),
        /** How an applied item stands, e.g. "running pid 812 since …, 2 restarts"; bounded like a reason. */
        detail: reasonText.optional(),
        /** What the agent found changed and put back, when it reports a repair of drift. */
        drift: reasonText.optional(),
      }),
    ),
    sent_at: timestamp,
  })
  .superRefine((report, context) => {
    // Half an ordering cannot be compared with anything: it is either a current agent's or an older agent's report.
    const present = orderingFields.filter((field) => report[field] !== undefined);
    if (present.length > 0 && present.length < orderingFields.length) {
      for (const field of orderingFields.filter((name) => !present.includes(name))) {
        context.addIssue({
          code: "custom",
          path: [field],
          message: `required when ${present.join(" and ")} ${present.length === 1 ? "is" : "are"} given: epoch, sequence and report_sequence come together or not at all`,
        });
      }
    }
    if (report.outcome !== "applied" && report.reason === undefined) {
      context.addIssue({
        code: "custom",
        path: ["reason"],
        message: `required when the outcome is ${report.outcome}`,
      });
    }
  });

/** `alive`, node → control plane: moves `last_seen` and nothing else; it is never kept as an account. */
export const aliveSchema = z.object({
  kind: z.literal("alive"),
  node: nodeName,
  sent_at: timestamp,
  report_sequence: reportSequence.optional(),
  /**
   * The declaration the node holds (sequence 0: none yet). A node that was away when it was declared says so
   * here, and the control plane sends it the latest one again.
   */
  holds: z.object({ epoch, sequence: heldSequence }).optional(),
});

/** Every message kind and its schema. */
/**
 * The control plane's word that it has taken a report (kept it, or refused it for its order): the node keeps its
 * newest report pending, and sends it again, until this arrives. Of the reports a node sent that are taken
 * together, the newest is answered (and the last to arrive, should that be another): an answer to any older one
 * would change nothing on the node. Broker-level acknowledgements are not used for node messages, because the
 * broker would send them to any reply subject the publisher names.
 */
export const receiptSchema = z.object({
  kind: z.literal("receipt"),
  node: nodeName,
  report_sequence: reportSequence,
  verdict: z.enum(["kept", "refused"]),
  reason: reasonText.optional(),
});

export const messageSchemas = {
  enrol: enrolSchema,
  enrol_reply: enrolReplySchema,
  declaration: declarationSchema,
  declaration_envelope: declarationEnvelopeSchema,
  report: reportSchema,
  alive: aliveSchema,
  receipt: receiptSchema,
} as const;

/** The name of a message kind, as carried in its `kind` field. */
export type MessageKind = keyof typeof messageSchemas;
/** All message kinds. */
export const messageKinds = Object.keys(messageSchemas) as MessageKind[];

/** The message of one kind, as parsed (defaults filled in). */
export type MessageOf<K extends MessageKind> = z.infer<(typeof messageSchemas)[K]>;

/** The broker identity an enrolled node lives with: a NATS user JWT (its seed stays on the node) or a RabbitMQ account. */
export type NodeCredential = z.infer<typeof nodeCredentialSchema>;
/** A joining node's enrolment. */
export type Enrol = MessageOf<"enrol">;
/** The control plane's answer to an enrolment: accepted with credentials, or refused with a reason. */
export type EnrolReply = MessageOf<"enrol_reply">;
/** What a node should hold, as signed. */
export type Declaration = MessageOf<"declaration">;
/** One item of a declaration. */
export type DeclaredItem = Declaration["items"][number];
/** A declaration's signed bytes and their signature. */
export type DeclarationEnvelope = MessageOf<"declaration_envelope">;
/** A node's account of applying a declaration. */
export type Report = MessageOf<"report">;
/** The control plane's word that it has taken a report. */
export type Receipt = MessageOf<"receipt">;
/** A node saying it is still there. */
export type Alive = MessageOf<"alive">;
/** Any message of the wire contract. */
export type Message = MessageOf<MessageKind>;
