/**
 * What an operator declares (`mesh declare -f FILE`: files with a path, content and mode) checked against the wire
 * contract before anything is allocated or written. A declaration the node would refuse — a path with a `..`
 * segment, two files at one path, more bytes than a message may hold — is bad usage, found before a sequence number
 * is used up or a row is written, not a failure half-way through sending.
 */
import { UsageError } from "../errors.js";
import { itemsDigest } from "./digest.js";
import { ContractError } from "./errors.js";
import { itemsOfContents } from "./items.js";
import type { UnitContents } from "./plan.js";
import { encodeMessage } from "./parse.js";

/**
 * Throws a UsageError naming `fileName` and the first problem when the files would not make a declaration the wire
 * contract allows. The check encodes the declaration and its envelope as the largest they can be (the longest node
 * name, the largest epoch and sequence, a signature's size), so whatever node and sequence it is sent with fits.
 */
export function checkContents(contents: UnitContents, fileName: string): void {
  const items = itemsOfContents(contents);
  try {
    const bytes = encodeMessage({
      kind: "declaration",
      node: "n".repeat(63),
      epoch: Number.MAX_SAFE_INTEGER,
      sequence: Number.MAX_SAFE_INTEGER,
      issued_at: new Date(0).toISOString(),
      items,
      digest: itemsDigest(items),
    });
    encodeMessage({
      kind: "declaration_envelope",
      payload: Buffer.from(bytes).toString("base64"),
      signature: Buffer.alloc(64).toString("base64"),
      signer: `SHA256:${"A".repeat(43)}`,
    });
  } catch (error) {
    if (!(error instanceof ContractError)) throw error;
    // Item i is file i: the problem is named as the operator wrote it.
    // Item i is named as the operator wrote it: its kind's list and its place there.
    const places = [
      ...contents.groups.map((_, index) => ({ at: `groups[${index}]`, key: "name", kind: "group" })),
      ...contents.users.map((_, index) => ({ at: `users[${index}]`, key: "name", kind: "user" })),
      ...contents.files.map((_, index) => ({ at: `files[${index}]`, key: "path", kind: "file" })),
      ...contents.services.map((_, index) => ({ at: `services[${index}]`, key: "name", kind: "service" })),
    ];
    const reason = error.reason
      .replace(/^declaration\.items\[(\d+)\]\.id: repeats an earlier item's id/, (_, index: string) => {
        const place = places[Number(index)];
        return `${place?.at ?? `item ${index}`}.${place?.key ?? "id"}: repeats an earlier ${place?.kind ?? "item"}'s ${place?.key ?? "id"}`;
      })
      .replace(
        /^declaration\.items\[(\d+)\]/,
        (_, index: string) => places[Number(index)]?.at ?? `item ${index}`,
      )
      .replace(/^declaration(_envelope)?: is /, "the declaration, signed, would be ");
    throw new UsageError(`${fileName}: ${reason}`, { cause: error });
  }
}
