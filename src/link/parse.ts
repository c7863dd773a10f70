import { z } from "zod";

import { ContractError } from "./errors.js";
import type { DeclaredItem } from "./items.js";
import { declaredItemSchema, itemIdOf } from "./items.js";
import { isCount, isNodeName, isTimestamp, quickAlive, quickEnvelope, quickReport } from "./quick-check.js";
import {
  declarationEpoch,
  declarationSequence,
  digestPattern,
  messageKinds,
  messageSchemas,
  nodeName,
  timestamp,
} from "./messages.js";
import type {
  Alive,
  Receipt,
  Declaration,
  DeclarationEnvelope,
  Enrol,
  EnrolReply,
  Message,
  MessageKind,
  MessageOf,
  Report,
} from "./messages.js";

/** The largest message the mesh reads or sends. A declaration of many files fits; a flood does not. */
export const maxMessageBytes = 1024 * 1024;

/** How many problems a refusal names before it says how many more there were. */
const issuesShown = 5;

const utf8 = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();

/**
 * Parses a message of `kind`. Bytes and strings are read as UTF-8 JSON; anything else is taken as an already
 * decoded value. Throws ContractError, and only ContractError, with a reason naming the field and the problem.
 */
export function parseMessage<K extends MessageKind>(kind: K, input: unknown): MessageOf<K> {
  if (!messageKinds.includes(kind))
    throw new ContractError(`unknown message kind ${JSON.stringify(String(kind))}`);
  if (input instanceof Uint8Array || typeof input === "string")
    return checkJson(kind, readJson(kind, readText(kind, input)));
  return checkMessage(kind, input);
}

/**
 * The kinds read for nearly every message a node sends, and for every declaration a node takes, with a check for
 * their plain shape (`quick-check.ts`).
 */
const quickChecks: { [K in MessageKind]?: (value: unknown) => MessageOf<K> | undefined } = {
  report: quickReport,
  alive: quickAlive,
  declaration_envelope: quickEnvelope,
};

/** Checks a value JSON.parse made: its plain shape quickly where that is known, anything else by the schema. */
function checkJson<K extends MessageKind>(kind: K, value: unknown): MessageOf<K> {
  const quick = quickChecks[kind];
  return quick?.(value) ?? checkMessage(kind, value);
}

/** Checks a decoded value against the schema of `kind`. */
function checkMessage<K extends MessageKind>(kind: K, value: unknown): MessageOf<K> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ContractError(`${kind}: expected a JSON object, received ${typeName(value)}`);
  }
  // The fast path first; only a refusal is read again with the inputs kept, to say what each field held.
  const result = check(kind, value, false);
  if (result.success) return result.data as MessageOf<K>;
  const described = check(kind, value, true);
  throw new ContractError(describeIssues(kind, (described.success ? result : described).error.issues));
}

function check(
  kind: MessageKind,
  value: object,
  reportInput: boolean,
): ReturnType<(typeof messageSchemas)[MessageKind]["safeParse"]> {
  try {
    // Keeping each issue's input makes zod's check about twice as slow (measured on reports and alives), so it is
    // asked for only to describe a refusal.
    return reportInput
      ? messageSchemas[kind].safeParse(value, { reportInput: true })
      : messageSchemas[kind].safeParse(value);
  } catch (error) {
    // Only a value built in memory (a getter or proxy that throws) lands here; it is refused like any bad input.
    throw new ContractError(`${kind}: could not be read`, { cause: error });
  }
}

/** Parses an `enrol` message. */
export function parseEnrol(input: unknown): Enrol {
  return parseMessage("enrol", input);
}

/** Parses an `enrol_reply` message. */
export function parseEnrolReply(input: unknown): EnrolReply {
  return parseMessage("enrol_reply", input);
}

/** Parses a `declaration`. Nodes call parseDeclarationBytes instead, on bytes already verified. */
export function parseDeclaration(input: unknown): Declaration {
  return parseMessage("declaration", input);
}

/** Parses a `declaration_envelope` message. */
export function parseDeclarationEnvelope(input: unknown): DeclarationEnvelope {
  return parseMessage("declaration_envelope", input);
}

/** Parses a `report` message. */
export function parseReport(input: unknown): Report {
  return parseMessage("report", input);
}

/** Parses a report from its bytes, and gives back the text they spell, as the account keeps it. */
export function parseReportText(bytes: Uint8Array): { report: Report; text: string } {
  const text = readText("report", bytes);
  return { report: checkJson("report", readJson("report", text)), text };
}

/** Parses a `receipt` message. */
export function parseReceipt(input: unknown): Receipt {
  return parseMessage("receipt", input);
}

/** Parses an `alive` message. */
export function parseAlive(input: unknown): Alive {
  return parseMessage("alive", input);
}

/**
 * Parses a declaration from the exact bytes whose signature was verified. It takes bytes only: parsing anything
 * re-encoded would parse something other than what was signed.
 */
export function parseDeclarationBytes(bytes: Uint8Array): Declaration {
  if (!(bytes instanceof Uint8Array)) throw new ContractError("declaration: expected the signed bytes");
  return parseMessage("declaration", bytes);
}

/**
 * Encodes a message as UTF-8 JSON for sending. The message is checked against its schema first, so the mesh never
 * sends what it would itself refuse; the encoding lists fields in schema order, so equal messages give equal bytes.
 */
export function encodeMessage(message: Message): Uint8Array {
  // An agent writes a report or an alive for nearly every declaration and interval: the plain shape is checked field
  // by field, as the control plane reads it (`quick-check.ts`, held to the schema), and anything else by the schema.
  const checked =
    (message.kind === "report"
      ? quickReport(message)
      : message.kind === "alive"
        ? quickAlive(message)
        : undefined) ?? parseMessage(message.kind, message);
  return withinBound(message.kind, encoder.encode(JSON.stringify(checked)));
}

/**
 * The bytes of a receipt, as `encodeMessage` writes them. The control plane sends one for nearly every batch of a
 * node's reports it takes, and a receipt without a reason is three fields the code itself filled: those are checked
 * here, one by one, and the text written in schema order. Anything else (a reason, a field out of its range) goes
 * through the schema, which refuses it as it would.
 */
export function encodeReceipt(receipt: Receipt): Uint8Array {
  const { node, report_sequence: sequence, verdict } = receipt;
  if (
    receipt.reason !== undefined ||
    !isNodeName(node) ||
    !isCount(sequence) ||
    (verdict !== "kept" && verdict !== "refused")
  ) {
    return encodeMessage(receipt);
  }
  // A node name is only a-z, 0-9 and '-': nothing in it needs escaping.
  return encoder.encode(
    `{"kind":"receipt","node":"${node}","report_sequence":${sequence},"verdict":"${verdict}"}`,
  );
}

/** What sets one node's declaration apart from another's of the same composition. */
export interface DeclarationHeader {
  node: string;
  epoch: number;
  sequence: number;
  issued_at: string;
}

const declarationHeaderSchema = z.strictObject({
  node: nodeName,
  epoch: declarationEpoch,
  sequence: declarationSequence,
  issued_at: timestamp,
});

/**
 * Encodes the declarations of one composition to the bytes `encodeMessage` gives each (a function of the header),
 * and keeps the items' text they all carry (`itemsText`, known once one was encoded).
 */
export interface DeclarationEncoder {
  (header: DeclarationHeader): Uint8Array;
  readonly itemsText: string | undefined;
}

/**
 * Items already checked against the wire contract, each with the text it is encoded as. A roll-out's compositions
 * share their units' item objects, so with one of these for the roll-out each item is checked once, not once for
 * every composition that holds it (1,297 compositions of 8 items each, in the bench's plan at 10,000 nodes). Kept by
 * the object: an item is never changed once composed.
 */
export type CheckedItems = WeakMap<DeclaredItem, string>;

/**
 * Encodes the declarations of one composition — the same items and digest for many nodes, each under a header of
 * its own — to the bytes `encodeMessage` gives each. The first is checked whole, as `encodeMessage` checks it; its
 * items are then taken as checked, and each later header is checked alone. A fleet of one composition costs one
 * check of its items, not one per node. Given `checked`, the first is checked in parts: its header and digest, each
 * item not checked before by the item's schema, and the rules the declaration sets over its items (each id what the
 * item names, no id twice). Anything that does not pass, or that a check would change, is checked whole, which says
 * what is wrong.
 */
export function declarationEncoder(
  items: readonly DeclaredItem[],
  digest: string,
  checked?: CheckedItems,
): DeclarationEncoder {
  let itemsText: string | undefined;
  /** The bytes every declaration of the composition ends with: its items and digest, encoded once. */
  let tail = new Uint8Array();
  const encode = (header: DeclarationHeader) => {
    if (itemsText === undefined) {
      const inParts = checked === undefined ? undefined : itemsTextInParts(items, checked);
      if (inParts === undefined) {
        const whole = parseMessage("declaration", {
          kind: "declaration",
          ...header,
          items: [...items],
          digest,
        });
        itemsText = JSON.stringify(whole.items);
      } else {
        // The rest of the declaration is its header and digest, checked by hand as a node's header is; whichever
        // does not pass goes through the schema, which says what is wrong.
        if (typeof digest === "string" && digestPattern.test(digest)) checkHeader(header);
        else parseMessage("declaration", { kind: "declaration", ...header, items: [], digest });
        itemsText = inParts;
      }
      tail = encoder.encode(declarationTail(itemsText, digest));
    } else {
      checkHeader(header);
    }
    // The text's two parts encoded apart are its encoding: each part is whole characters.
    const head = encoder.encode(declarationHead(header));
    const bytes = new Uint8Array(head.byteLength + tail.byteLength);
    bytes.set(head);
    bytes.set(tail, head.byteLength);
    return withinBound("declaration", bytes);
  };
  return Object.defineProperty(encode, "itemsText", { get: () => itemsText }) as DeclarationEncoder;
}

/**
 * The items' text as a whole check would give it, from each item's own check (`checked` keeps them), and the rules
 * the declaration's schema sets over its items; undefined when any item does not pass or its check would change it,
 * or when an id is not the item's or comes twice.
 */
function itemsTextInParts(items: readonly DeclaredItem[], checked: CheckedItems): string | undefined {
  const texts: string[] = [];
  const ids = new Set<string>();
  for (const item of items) {
    let text = checked.get(item);
    if (text === undefined) {
      const result = declaredItemSchema.safeParse(item);
      if (!result.success) return undefined;
      text = JSON.stringify(result.data);
      if (text !== JSON.stringify(item)) return undefined;
      checked.set(item, text);
    }
    if (item.id !== itemIdOf(item) || ids.has(item.id)) return undefined;
    ids.add(item.id);
    texts.push(text);
  }
  return `[${texts.join(",")}]`;
}

/**
 * Checks a declaration's header as its schema does. A fleet's headers, one per node, are checked by hand (the same
 * rules); one that does not pass goes through the schema, which names what is wrong.
 */
function checkHeader(header: DeclarationHeader): void {
  if (
    Object.keys(header).length === 4 &&
    isNodeName(header.node) &&
    isCount(header.epoch) &&
    isCount(header.sequence) &&
    header.sequence >= 1 &&
    isTimestamp(header.issued_at)
  )
    return;
  const result = declarationHeaderSchema.safeParse(header);
  if (!result.success) throw new ContractError(describeIssues("declaration", result.error.issues));
}

/** A declaration's text from its parts, in schema order, as JSON.stringify writes the checked declaration. */
function declarationText(header: DeclarationHeader, itemsText: string, digest: string): string {
  return declarationHead(header) + declarationTail(itemsText, digest);
}

/** The part of a declaration's text that is the node's own: up to its items. */
function declarationHead(header: DeclarationHeader): string {
  return (
    `{"kind":"declaration","node":${JSON.stringify(header.node)},"epoch":${JSON.stringify(header.epoch)},` +
    `"sequence":${JSON.stringify(header.sequence)},"issued_at":${JSON.stringify(header.issued_at)},`
  );
}

/** The part of a declaration's text its composition's nodes share: its items and digest. */
function declarationTail(itemsText: string, digest: string): string {
  return `"items":${itemsText},"digest":${JSON.stringify(digest)}}`;
}

/** What a store keeps of a sealed declaration: its header, its composition's items text, and its seal. */
export interface KeptDeclaration {
  header: DeclarationHeader;
  /** The items exactly as the declaration carried them (`DeclarationEncoder.itemsText`). */
  itemsText: string;
  digest: string;
  signature: string;
  signer: string;
}

/**
 * The text of a sealed declaration rebuilt from what was kept of it: byte for byte the envelope that was sent, since
 * the declaration's bytes are a function of its parts (`declarationText`). Nothing is trusted that a node would not
 * check again: the node verifies the signature over these bytes before it reads them.
 */
export function keptDeclarationText(kept: KeptDeclaration): string {
  checkHeader(kept.header);
  const bytes = withinBound(
    "declaration",
    encoder.encode(declarationText(kept.header, kept.itemsText, kept.digest)),
  );
  return envelopeText({
    kind: "declaration_envelope",
    payload: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64"),
    signature: kept.signature,
    signer: kept.signer,
  });
}

/**
 * The text of a sealed declaration, as `encodeMessage` writes it. Every field is right by how `sealDeclaration`
 * makes it (base64 of the bytes signed, a 64-byte signature, the signer checked against the key), so only the
 * size is checked here: a fleet's envelopes are not read back through their schema one by one.
 */
export function envelopeText(envelope: DeclarationEnvelope): string {
  const text = JSON.stringify({
    kind: envelope.kind,
    payload: envelope.payload,
    signature: envelope.signature,
    signer: envelope.signer,
  });
  if (text.length > maxMessageBytes) withinBound("declaration_envelope", encoder.encode(text));
  return text;
}

/**
 * How `envelopeText` writes an envelope of `signer` around its payload and its signature: the text before the
 * payload, between it and the signature, and after it. Taken from `envelopeText` itself, so a fleet's envelopes
 * written from it (on the signing threads) are the same text byte for byte.
 */
export function envelopeWrapping(signer: string): { head: string; mid: string; tail: string } {
  const payload = "<payload>";
  const signature = "<signature>";
  const text = envelopeText({ kind: "declaration_envelope", payload, signature, signer });
  const [head, rest, ...more] = text.split(payload);
  const [mid, tail, ...after] = rest?.split(signature) ?? [];
  if (head === undefined || mid === undefined || tail === undefined || more.length > 0 || after.length > 0)
    throw new ContractError(
      `declaration_envelope: the signer ${JSON.stringify(signer)} cannot be written around`,
    );
  return { head, mid, tail };
}

/** An envelope's bytes, if they are within the size every message keeps to. */
export function envelopeWithinBound(bytes: Uint8Array): Uint8Array {
  return withinBound("declaration_envelope", bytes);
}

/** The bytes, if a message of `kind` may be that long. */
function withinBound(kind: MessageKind, bytes: Uint8Array): Uint8Array {
  if (bytes.byteLength > maxMessageBytes) {
    throw new ContractError(`${kind}: is ${bytes.byteLength} bytes, at most ${maxMessageBytes} are allowed`);
  }
  return bytes;
}

/** The UTF-8 text of a message, within the size every message keeps to. */
function readText(kind: MessageKind, input: Uint8Array | string): string {
  const size = typeof input === "string" ? Buffer.byteLength(input, "utf8") : input.byteLength;
  if (size > maxMessageBytes) {
    throw new ContractError(`${kind}: is ${size} bytes, at most ${maxMessageBytes} are allowed`);
  }
  if (typeof input === "string") return input;
  try {
    return utf8.decode(input);
  } catch (error) {
    throw new ContractError(`${kind}: is not valid UTF-8`, { cause: error });
  }
}

function readJson(kind: MessageKind, text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    // The parser's own message quotes the input, which may hold a secret; the reason stays generic.
    throw new ContractError(`${kind}: is not valid JSON`, { cause: error });
  }
}

function describeIssues(kind: MessageKind, issues: readonly z.core.$ZodIssue[]): string {
  const described = issues
    .slice(0, issuesShown)
    .map((issue) => `${renderPath(kind, issue.path)}: ${describe(issue)}`);
  const more = issues.length - issuesShown;
  return more > 0 ? `${described.join("; ")} (and ${more} more)` : described.join("; ");
}

/** Renders a path as a person would write it: `report.items[0].state`. */
function renderPath(kind: MessageKind, path: readonly PropertyKey[]): string {
  return path.reduce<string>((rendered, key) => {
    if (typeof key === "number") return `${rendered}[${key}]`;
    const name = String(key);
    if (/^[A-Za-z_][A-Za-z0-9_]{0,63}$/.test(name)) return `${rendered}.${name}`;
    return `${rendered}[${JSON.stringify(name.length > 64 ? `${name.slice(0, 64)}…` : name)}]`;
  }, kind);
}

/** Says what is wrong in the mesh's words. It names types and rules, never the offending value, which may be secret. */
function describe(issue: z.core.$ZodIssue): string {
  switch (issue.code) {
    case "invalid_type":
      if (issue.input === undefined) return "required";
      return `expected ${issue.expected === "int" ? "an integer" : issue.expected}, received ${typeName(issue.input)}`;
    case "invalid_value":
      return issue.values.length === 1
        ? `expected ${String(issue.values[0])}`
        : `expected one of ${issue.values.map(String).join("|")}`;
    case "invalid_union":
      if (issue.discriminator !== undefined && "options" in issue && issue.options !== undefined) {
        return issue.input === undefined
          ? "required"
          : `expected one of ${issue.options.map(String).join("|")}`;
      }
      return "matches none of the allowed shapes";
    case "unrecognized_keys": {
      const names = issue.keys.slice(0, issuesShown).map((key) => JSON.stringify(key.slice(0, 64)));
      return `unknown field${issue.keys.length === 1 ? "" : "s"} ${names.join(", ")}${issue.keys.length > issuesShown ? ", …" : ""}`;
    }
    case "too_small":
      return describeBound("at least", issue.origin, issue.minimum, issue.inclusive !== false);
    case "too_big":
      return describeBound("at most", issue.origin, issue.maximum, issue.inclusive !== false);
    case "invalid_key": {
      const first = issue.issues[0];
      return first === undefined ? "invalid key" : `invalid key: ${describe(first)}`;
    }
    case "invalid_element":
    case "invalid_format":
    case "not_multiple_of":
    case "custom":
      return issue.message;
    default: {
      const unexpected: never = issue;
      return (unexpected as { message: string }).message;
    }
  }
}

function describeBound(
  direction: string,
  origin: string,
  bound: number | bigint,
  inclusive: boolean,
): string {
  const limit = inclusive
    ? String(bound)
    : `${direction === "at least" ? "more than" : "less than"} ${bound}`;
  const shown = inclusive ? `${direction} ${limit}` : limit;
  switch (origin) {
    case "string":
      return bound === 1 && direction === "at least" ? "must not be empty" : `must be ${shown} characters`;
    case "array":
      return `must hold ${shown} items`;
    default:
      return `must be ${shown}`;
  }
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}
