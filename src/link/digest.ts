import { createHash } from "node:crypto";
import type { Declaration } from "./messages.js";

/** The digest of a declaration's items: what a report names to say which declaration it is about. */
export function itemsDigest(items: Declaration["items"]): string {
  return itemsTextDigest(JSON.stringify(items));
}

/** `itemsDigest` of the items whose JSON is `text`, for a caller that has it already. */
export function itemsTextDigest(text: string): string {
  return `sha256:${createHash("sha256").update(text).digest("hex")}`;
}

/** The digest of holding nothing: what a node reports before it has applied any declaration. */
export const emptyDigest = itemsDigest([]);
