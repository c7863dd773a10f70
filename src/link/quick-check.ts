/**
 * The control plane reads a report or an alive for nearly every message a node sends, and a node an envelope for every
 * declaration it takes; nearly all of them are the plain shape the mesh's own code writes. That shape is checked here
 * field by field, with the schema's own patterns and bounds, and the message built as the schema builds it (unknown
 * fields dropped). Anything else — a field out of its range, a type it does not expect, half an ordering — is not
 * decided here: the answer is `undefined`, and the schema reads the value, accepting or refusing it with its reasons. A
 * property test holds these to the schemas.
 *
 * Only plain data is given here (values JSON.parse made, or messages the code itself composed), whose fields are read
 * without side effects.
 */
import { fitsBytes } from "./bounds.js";
import type { Alive, DeclarationEnvelope, Report } from "./messages.js";
import {
  digestPattern,
  encodesBytes,
  fingerprintPattern,
  isCanonicalBase64,
  itemIdMaxChars,
  itemIdPattern,
  timestampPattern,
} from "./messages.js";
import { nodeNamePattern } from "./names.js";

type Fields = Record<string, unknown>;
type ReportItem = Report["items"][number];

function isFields(value: unknown): value is Fields {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** An integer ≥ 0 as the schema takes one (zod's int is a safe integer). */
export function isCount(value: unknown): value is number {
  return Number.isSafeInteger(value) && (value as number) >= 0;
}

/** A node name as the schema takes one. */
export function isNodeName(value: unknown): value is string {
  return typeof value === "string" && nodeNamePattern.test(value);
}

/** A timestamp as the schema takes one. */
export function isTimestamp(value: unknown): value is string {
  return typeof value === "string" && timestampPattern.test(value);
}

/** A reason, detail or drift: absent, or 1 to `reasonMaxBytes` bytes of text. */
function isOptionalText(value: unknown): value is string | undefined {
  return value === undefined || (typeof value === "string" && value.length > 0 && fitsBytes(value));
}

/** A report in the plain shape, as the schema would give it; undefined for anything the schema must decide. */
export function quickReport(value: unknown): Report | undefined {
  if (!isFields(value)) return undefined;
  const { kind, node, epoch, sequence, report_sequence, digest, outcome, reason, items, sent_at } = value;
  if (kind !== "report" || !isNodeName(node)) return undefined;
  // All three or none, each an integer ≥ 0 (half an ordering is the schema's to refuse, in its words).
  const ordered = epoch !== undefined || sequence !== undefined || report_sequence !== undefined;
  if (ordered && !(isCount(epoch) && isCount(sequence) && isCount(report_sequence))) return undefined;
  if (typeof digest !== "string" || !digestPattern.test(digest)) return undefined;
  if (outcome !== "applied" && outcome !== "failed" && outcome !== "refused") return undefined;
  if (!isOptionalText(reason) || (outcome !== "applied" && reason === undefined)) return undefined;
  if (!Array.isArray(items) || !isTimestamp(sent_at)) return undefined;
  const checkedItems: ReportItem[] = [];
  for (const item of items as unknown[]) {
    const checked = quickItem(item);
    if (checked === undefined) return undefined;
    checkedItems.push(checked);
  }
  // In schema order, as the schema builds it: a message written from it is the schema's bytes.
  return {
    kind,
    node,
    ...(ordered ? { epoch, sequence, report_sequence } : {}),
    digest,
    outcome,
    ...(reason === undefined ? {} : { reason }),
    items: checkedItems,
    sent_at,
  };
}

function quickItem(value: unknown): ReportItem | undefined {
  if (!isFields(value)) return undefined;
  const { id, state, reason, detail, drift } = value;
  if (typeof id !== "string" || id.length > itemIdMaxChars || !itemIdPattern.test(id)) return undefined;
  if (state !== "applied" && state !== "failed") return undefined;
  if (!isOptionalText(reason) || !isOptionalText(detail) || !isOptionalText(drift)) return undefined;
  const item: ReportItem = { id, state };
  if (reason !== undefined) item.reason = reason;
  if (detail !== undefined) item.detail = detail;
  if (drift !== undefined) item.drift = drift;
  return item;
}

/** An alive in the plain shape, as the schema would give it; undefined for anything the schema must decide. */
export function quickAlive(value: unknown): Alive | undefined {
  if (!isFields(value)) return undefined;
  const { kind, node, sent_at, report_sequence, holds } = value;
  if (kind !== "alive" || !isNodeName(node) || !isTimestamp(sent_at)) return undefined;
  if (report_sequence !== undefined && !isCount(report_sequence)) return undefined;
  const alive: Alive = { kind, node, sent_at };
  if (report_sequence !== undefined) alive.report_sequence = report_sequence;
  if (holds !== undefined) {
    if (!isFields(holds) || !isCount(holds.epoch) || !isCount(holds.sequence)) return undefined;
    alive.holds = { epoch: holds.epoch, sequence: holds.sequence };
  }
  return alive;
}

/** A declaration's envelope, as the schema would give it; undefined for anything the schema must decide. */
export function quickEnvelope(value: unknown): DeclarationEnvelope | undefined {
  if (!isFields(value)) return undefined;
  const { kind, payload, signature, signer } = value;
  // The schema is strict: a field it does not know is its to refuse, in its words.
  if (Object.keys(value).length !== 4 || kind !== "declaration_envelope") return undefined;
  if (typeof signer !== "string" || !fingerprintPattern.test(signer)) return undefined;
  if (typeof signature !== "string" || !encodesBytes(signature, "base64", 64)) return undefined;
  if (typeof payload !== "string" || !isCanonicalBase64(payload)) return undefined;
  return { kind, payload, signature, signer };
}
