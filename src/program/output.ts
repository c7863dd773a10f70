/** How commands print: a JSON document with --json, an aligned table or plain lines otherwise. */

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
