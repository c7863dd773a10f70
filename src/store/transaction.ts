/** Running statements together: in the caller's transaction when there is one, in a new one otherwise. */
import type { Kysely } from "kysely";
import type { Database } from "./schema.js";

export function inTransaction<T>(
  db: Kysely<Database>,
  work: (trx: Kysely<Database>) => Promise<T>,
): Promise<T> {
  return db.isTransaction ? work(db) : db.transaction().execute(work);
}

/** How many rows one statement takes at most: a statement binds only so many values (SQLite and PostgreSQL). */
export const rowsPerStatement = 500;

/** `items` in slices of `rowsPerStatement`. */
export function slices<T>(items: readonly T[]): T[][] {
  const out: T[][] = [];
  for (let start = 0; start < items.length; start += rowsPerStatement)
    out.push(items.slice(start, start + rowsPerStatement));
  return out;
}
