/**
 * The retention. Every table that grows with what nodes send or operators issue is bounded: accounts and
 * declarations by the per-node history (and the compositions' items by the declarations that refer to them),
 * counters by node and name, events — which grow with every decision — by age and count, and tokens by how long ago
 * they expired.
 */
import type { MeshOptions } from "../config/options.js";
import type { Logger } from "../log.js";
import type { Store } from "../store/index.js";
import { itemsKeptUnusedMs } from "../store/index.js";

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

/**
 * Deletes the tokens that expired more than `keepForMs` ago. Only expired ones go: until its expiry a spent or
 * revoked token's broker identity must stay refused, and the store is where every process reads that from.
 */
export async function pruneTokens(store: Store, keepForMs: number, now: Date, log: Logger): Promise<number> {
  const before = new Date(now.getTime() - keepForMs);
  const deleted = await store.tokens.prune(before);
  if (deleted > 0) log.info("tokens.pruned", { deleted, expired_before: before.toISOString() });
  return deleted;
}

/**
 * Deletes the compositions' items no kept declaration refers to any more (their declarations fell out of the
 * nodes' histories) once unused for `itemsKeptUnusedMs`.
 */
export async function pruneDeclarationItems(store: Store, now: Date, log: Logger): Promise<number> {
  const before = new Date(now.getTime() - itemsKeptUnusedMs).toISOString();
  const deleted = await store.declarations.pruneItems(before);
  if (deleted > 0) log.info("declaration_items.pruned", { deleted, unused_since: before });
  return deleted;
}

/** One run of the whole retention, as the acting control plane does it every `periods.pruneEveryMs`. */
export async function applyRetention(
  store: Store,
  options: Pick<MeshOptions, "events" | "tokenKeepForMs">,
  now: Date,
  log: Logger,
): Promise<void> {
  await pruneEvents(store, options.events, now, log);
  await pruneTokens(store, options.tokenKeepForMs, now, log);
  await pruneDeclarationItems(store, now, log);
}
