/**
 * What an operator declares (`mesh declare -f FILE`: files with a path, content and mode) checked against the wire
 * contract before anything is allocated or written. A declaration the node would refuse — a path with a `..`
 * segment, two files at one path, more bytes than a message may hold — is bad usage, found before a sequence number
 * is used up or a row is written, not a failure half-way through sending.
 */
import { UsageError } from "../errors.js";
import { itemsDigest } from "./digest.js";
import { ContractError } from "./errors.js";
import type { DeclaredItem } from "./messages.js";
import { encodeMessage } from "./parse.js";

/** One file as an operator declares it. */
export interface DeclaredFileInput {
  path: string;
  content: string;
  mode?: string | undefined;
}

/** The declaration items of the declared files, in their order: one file item each, named by its path. */
export function fileItemsOf(files: readonly DeclaredFileInput[]): DeclaredItem[] {
  return files.map((file) => ({
    id: `file:${file.path}`,
    type: "file" as const,
    path: file.path,
    content: file.content,
    ...(file.mode === undefined ? {} : { mode: file.mode }),
  }));
}

/**
 * Throws a UsageError naming `fileName` and the first problem when the files would not make a declaration the wire
 * contract allows. The check encodes the declaration and its envelope as the largest they can be (the longest node
 * name, the largest epoch and sequence, a signature's size), so whatever node and sequence it is sent with fits.
 */
export function checkDeclaredFiles(files: readonly DeclaredFileInput[], fileName: string): void {
  const items = fileItemsOf(files);
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
    const reason = error.reason
      .replace(
        /^declaration\.items\[(\d+)\]\.id: repeats an earlier item's id/,
        "files[$1].path: repeats an earlier file's path",
      )
      .replace(/^declaration\.items/, "files")
      .replace(/^declaration(_envelope)?: is /, "the declaration, signed, would be ");
    throw new UsageError(`${fileName}: ${reason}`, { cause: error });
  }
}
