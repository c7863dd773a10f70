/** How commands print: a JSON document with --json, an aligned table or plain lines otherwise. */
import { exitCodes } from "../errors.js";

export interface Output {
  json: boolean;
  line(text: string): void;
  document(value: unknown): void;
  table(headers: readonly string[], rows: ReadonlyArray<readonly string[]>): void;
}

export function stdoutOutput(json: boolean): Output {
  return {
    json,
    line: (text) => process.stdout.write(`${text}\n`),
    document: (value) => process.stdout.write(`${JSON.stringify(value, null, 2)}\n`),
    table: (headers, rows) => process.stdout.write(formatTable(headers, rows)),
  };
}

export function formatTable(headers: readonly string[], rows: ReadonlyArray<readonly string[]>): string {
  const widths = headers.map((header, column) =>
    Math.max(header.length, ...rows.map((row) => (row[column] ?? "").length)),
  );
  const render = (cells: readonly string[]) =>
    cells
      .map((cell, column) => cell.padEnd(widths[column] ?? 0))
      .join("  ")
      .trimEnd();
  return [render(headers), ...rows.map(render)].map((line) => `${line}\n`).join("");
}

/** Whether the listeners below are on already (once per process, whatever runs how many programs). */
let endsQuietly = false;

/**
 * Ends the process quietly when the reader of its output has gone (`mesh node list | head -1`): there is no one
 * left to tell anything, so no stack and no error line, and the exit code is the command's if it has one already.
 * Node ignores SIGPIPE, so a write to a closed pipe comes back as an EPIPE error on the stream; any other error on
 * stdout or stderr is thrown as before.
 */
export function endQuietlyOnBrokenPipe(): void {
  if (endsQuietly) return;
  endsQuietly = true;
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", (error: NodeJS.ErrnoException) => {
      if (error.code !== "EPIPE") throw error;
      process.exit(typeof process.exitCode === "number" ? process.exitCode : exitCodes.ok);
    });
  }
}
