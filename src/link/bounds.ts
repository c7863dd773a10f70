/**
 * How much text a node can make the mesh carry, keep or log. Anything a node sends is hostile until checked: a
 * reason is bounded on the wire, and whatever the control plane stores from a node is bounded again where it lands.
 */

/**
 * The most UTF-8 bytes a reason (a report's, an item's, a receipt's) may hold, and the most the audit trail keeps
 * of any text a node chose: enough for a tool's error line and a path, too little for one node to fill a disk.
 */
export const reasonMaxBytes = 512;

const encoder = new TextEncoder();
const ellipsis = "…";

/** True when `text` fits in `maxBytes` of UTF-8. */
export function fitsBytes(text: string, maxBytes = reasonMaxBytes): boolean {
  return text.length <= maxBytes / 3 || encoder.encode(text).byteLength <= maxBytes;
}

/**
 * `text` cut to at most `maxBytes` of UTF-8, ending in "…" when it was cut. It never splits a character, so what
 * is kept is still text.
 */
export function boundText(text: string, maxBytes = reasonMaxBytes): string {
  if (fitsBytes(text, maxBytes)) return text;
  const room = maxBytes - encoder.encode(ellipsis).byteLength;
  let used = 0;
  let cut = 0;
  for (const char of text) {
    const size = encoder.encode(char).byteLength;
    if (used + size > room) break;
    used += size;
    cut += char.length;
  }
  return text.slice(0, cut) + ellipsis;
}
