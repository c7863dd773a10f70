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
  let value: unknown;
  try {
    value = parseYaml(text);
  } catch (error) {
    throw new UsageError(`${fileName} is neither YAML nor JSON: ${(error as Error).message}`, {
      cause: error,
    });
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
