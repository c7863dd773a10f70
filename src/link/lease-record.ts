/**
 * The lease holder record as it is kept where the lease lives (the NATS bucket's `holder` key, the store's
 * `controller_lease` row): read back through this schema, so a damaged or foreign record is an error naming where it
 * was read, never a holder with missing fields. Fields a newer controller adds are ignored, not refused.
 */
import { z } from "zod";
import { MeshError } from "../errors.js";

export const holderRecordSchema = z.object({
  id: z.string().min(1),
  host: z.string(),
  pid: z.int().min(0),
  taken_at: z.string().min(1),
  epoch: z.int().min(0).optional(),
  renewed_at: z.string().optional(),
  ttl_ms: z.number().positive().optional(),
});

/** A lease holder record as read back. */
export type HolderRecord = z.infer<typeof holderRecordSchema>;

/** Reads a holder record from its stored text; `where` names the lease's place for the error. */
export function parseHolderRecord(text: string, where: string): HolderRecord {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new MeshError("lease", `the lease holder record in ${where} is not JSON`, { cause: error });
  }
  const result = holderRecordSchema.safeParse(value);
  if (!result.success) {
    const issue = result.error.issues[0];
    const field = issue === undefined || issue.path.length === 0 ? "" : `${issue.path.join(".")}: `;
    throw new MeshError(
      "lease",
      `the lease holder record in ${where} is damaged: ${field}${issue?.message ?? "invalid"}`,
    );
  }
  return result.data;
}
