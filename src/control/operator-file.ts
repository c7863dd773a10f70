/**
 * A file an operator writes (a plan, a declaration): YAML or JSON, checked whole against its contract, the first
 * problem named by the file and its place in it.
 */
import { parse as parseYaml } from "yaml";
import type { z } from "zod";
import { UsageError } from "../errors.js";

export function parseOperatorFile<Schema extends z.ZodType>(
  schema: Schema,
  text: string,
  fileName: string,
): z.infer<Schema> {
  const json = readAsJson(text);
  let value: unknown;
  if ("read" in json) {
    value = json.read;
  } else {
    try {
      value = parseYaml(text);
    } catch (error) {
      throw new UsageError(`${fileName} is neither YAML nor JSON: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new UsageError(`${fileName}: ${placeOf(issue?.path ?? [])}: ${issue?.message ?? "invalid"}`);
  }
  return parsed.data;
}

/** Where in the file, as the operator reads it: `files[1].path`. */
function placeOf(path: ReadonlyArray<PropertyKey>): string {
  return path
    .map((key, index) => (typeof key === "number" ? `[${key}]` : `${index === 0 ? "" : "."}${String(key)}`))
    .join("");
}

/**
 * A file written as JSON (a plan a program wrote, say), read by `JSON.parse` when that reads it as the YAML parser
 * would: only when writing back what it read gives the file's own text, spaces outside strings left aside. YAML reads
 * JSON alike but for what does not write back so (a key given twice, which YAML refuses and `JSON.parse` keeps the
 * last of; a number or an escape written otherwise than `JSON.stringify` writes it): that goes to the YAML parser, as
 * does anything `JSON.parse` refuses. `mesh plan diff` of the bench's plan of 100 units took 615 ms (22 KB on one line)
 * and 668 ms (41 KB indented) with the YAML parser, 456 and 477 ms so (medians of 12 runs, alternated).
 */
export function readAsJson(text: string): { read: unknown } | { notJson: string } {
  const first = /\S/.exec(text)?.[0];
  if (first !== "{" && first !== "[") return { notJson: "neither an object nor an array" };
  let read: unknown;
  try {
    read = JSON.parse(text);
  } catch (error) {
    // What JSON.parse cannot read goes to the YAML parser, which reads it or names what is wrong with it.
    if (error instanceof Error) return { notJson: error.message };
    throw error;
  }
  return JSON.stringify(read) === withoutSpaces(text)
    ? { read }
    : { notJson: "written otherwise than JSON.stringify writes it" };
}

/** JSON's text without the spaces between its tokens (a text `JSON.parse` read: its strings are well formed). */
function withoutSpaces(json: string): string {
  const kept: string[] = [];
  let from = 0;
  let inString = false;
  for (let at = 0; at < json.length; at++) {
    const code = json.charCodeAt(at);
    if (inString) {
      if (code === 0x5c) at++;
      else if (code === 0x22) inString = false;
    } else if (code === 0x22) {
      inString = true;
    } else if (code === 0x20 || code === 0x09 || code === 0x0a || code === 0x0d) {
      kept.push(json.slice(from, at));
      from = at + 1;
    }
  }
  kept.push(json.slice(from));
  return kept.join("");
}
