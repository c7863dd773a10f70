/**
 * Store locations: `sqlite:PATH` (a file; the default is one in the data dir) or `postgres://…`. A PostgreSQL URL
 * may name a schema with `?schema=NAME`, so several meshes (or test runs) can share one database.
 */
import { resolve } from "node:path";
import { UsageError } from "../errors.js";

export type Dialect = "sqlite" | "postgres";

export type StoreLocation =
  | { dialect: "sqlite"; path: string }
  | { dialect: "postgres"; connectionString: string; schema: string | undefined };

const schemaName = /^[a-z_][a-z0-9_]{0,62}$/;

export function parseStoreUrl(url: string): StoreLocation {
  if (url.startsWith("sqlite:")) {
    const path = url.slice("sqlite:".length).replace(/^\/\/(?=\/)/, "");
    if (path === "") throw new UsageError(`store URL "${url}" names no file: use sqlite:PATH`);
    return { dialect: "sqlite", path: path === ":memory:" ? path : resolve(path) };
  }
  if (url.startsWith("postgres://") || url.startsWith("postgresql://")) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch (error) {
      throw new UsageError(`store URL "${redact(url)}" is not a valid URL`, { cause: error });
    }
    const schema = parsed.searchParams.get("schema") ?? undefined;
    if (schema !== undefined && !schemaName.test(schema)) {
      throw new UsageError(`store URL schema "${schema}" must be a lowercase SQL identifier`);
    }
    parsed.searchParams.delete("schema");
    return { dialect: "postgres", connectionString: parsed.toString(), schema };
  }
  throw new UsageError(`store URL "${redact(url)}" is neither sqlite:PATH nor postgres://…`);
}

/** A URL as it may be printed: without its password. */
export function redact(url: string): string {
  return url.replace(/(\/\/[^:/@]+:)[^@/]*@/, "$1***@");
}
