/**
 * Statements on the hot paths (ingest, `last_seen`) whose SQL is built once per shape. Building a statement with
 * Kysely costs more than running a small one, and a statement of a few hundred rows or a long `in` list costs far
 * more: so the SQL of each shape is built once, checked to bind exactly the values the caller lists in that order,
 * and from then on only bound.
 */
import type { Kysely, QueryResult } from "kysely";
import { CompiledQuery } from "kysely";
import { StoreError } from "../errors.js";
import type { Database } from "./schema.js";

/** How many shapes are kept; past that the oldest is dropped (and built again if it comes back). */
const shapesKept = 2000;

export class StatementTexts {
  private readonly texts = new Map<string, string>();

  /**
   * Runs the statement `build` makes, whose shape is named by `shape` (the query and anything that changes its SQL,
   * such as the number of rows or the length of a list) and whose bound values are `values`, in order.
   */
  async run<R>(
    db: Kysely<Database>,
    shape: string,
    values: readonly unknown[],
    build: () => { compile(): CompiledQuery<R> },
  ): Promise<QueryResult<R>> {
    let text = this.texts.get(shape);
    if (text === undefined) {
      const compiled = build().compile();
      // Checked when built: what is bound later in these places must be what the statement was built with.
      if (
        compiled.parameters.length !== values.length ||
        compiled.parameters.some((value, i) => value !== values[i])
      )
        throw new StoreError(`the statement ${shape} binds its values in an unexpected order`);
      text = compiled.sql;
      if (this.texts.size >= shapesKept) this.texts.delete(this.texts.keys().next().value as string);
      this.texts.set(shape, text);
    }
    return db.executeQuery<R>(CompiledQuery.raw(text, [...values]));
  }
}

/**
 * The values of rows, row after row and each in its own key order: what a many-row insert built from the same rows
 * binds. A plain loop: `flatMap` over `Object.values` makes two arrays a row, ten times the cost, on the paths that
 * write a batch of reports or a chunk of declarations.
 */
export function rowValues(rows: readonly object[]): unknown[] {
  const values: unknown[] = [];
  for (const row of rows) {
    for (const key in row) values.push((row as Record<string, unknown>)[key]);
  }
  return values;
}
