/**
 * The audit trail's retention. Every table that grows with what nodes send is bounded: accounts and declarations by
 * the per-node history, counters by node and name, and events — which grow with every decision — by age and count.
 */
import type { MeshOptions } from "../config/options.js";
import type { Logger } from "../log.js";
import type { Store } from "../store/index.js";

/**
 * How often the acting control plane prunes the trail. Refusals are told at most once a minute per node and kind,
 * so between two prunings a fleet adds a bounded number of rows; ten minutes keeps the trail near its limit
 * without a delete on every tick.
 */
export const pruneEventsEveryMs = 10 * 60_000;

/** Deletes the events older than the retention, and all but the newest it keeps; logs what went when any did. */
export async function pruneEvents(
  store: Store,
  retention: MeshOptions["events"],
  now: Date,
  log: Logger,
): Promise<number> {
  const before = new Date(now.getTime() - retention.keepForMs).toISOString();
  const deleted = await store.events.prune({ before, keepAtMost: retention.keepAtMost });
  if (deleted > 0) {
    log.info("events.pruned", { deleted, older_than: before, keep_at_most: retention.keepAtMost });
  }
  return deleted;
}
