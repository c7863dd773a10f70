/**
 * Which broker identities must be refused now, derived from the store so every process computes the same set:
 * the identity of every token that was spent or revoked (until its own expiry makes the broker refuse it anyway),
 * the identity of every retired node, and every identity a node had before it enrolled again. Each is read by a
 * query of its own, not by loading every token and node: this runs at every start, reconnection and burst of joins.
 */
import { z } from "zod";
import { MeshError } from "../errors.js";
import { errorText } from "../log.js";
import type { Store } from "../store/index.js";

/** What the store keeps of a token's broker identity: its user, as written at issue time. */
const storedCredentialSchema = z.object({ user: z.string().min(1) });

export async function currentRevocations(store: Store, now: Date): Promise<Map<string, Date>> {
  return (await revocationsPastGrace(store, now, 0)).revoked;
}

/**
 * The current revocations less the identities of tokens spent within the last `graceMs`: their joiners may still
 * be reading the answer on the token's connection, which a revocation would close under them. `heldUntil` is when
 * the first of those left out is due (undefined when none was).
 */
export async function revocationsPastGrace(
  store: Store,
  now: Date,
  graceMs: number,
): Promise<{ revoked: Map<string, Date>; heldUntil: Date | undefined }> {
  const revoked = new Map<string, Date>();
  const graceFrom = now.getTime() - graceMs;
  let heldUntil: number | undefined;
  for (const token of await store.tokens.endedIdentities(now)) {
    const endedAt = new Date(token.endedAt);
    // Held only while its spending time is within a grace of this clock, either side: one written more than a grace
    // ahead (by a controller whose clock runs fast) is not held for the clocks' difference, it is revoked.
    const spentAt = endedAt.getTime();
    if (token.spent && spentAt > graceFrom && spentAt <= now.getTime() + graceMs) {
      heldUntil = Math.min(heldUntil ?? Number.POSITIVE_INFINITY, spentAt + graceMs);
      continue;
    }
    revoked.set(brokerUserOf(token.brokerCredential), endedAt);
  }
  for (const node of await store.nodes.retired()) {
    if (node.brokerUser !== null && node.retiredAt !== null) {
      revoked.set(node.brokerUser, new Date(node.retiredAt));
    }
  }
  for (const identity of await store.revokedIdentities.list()) {
    if (!revoked.has(identity.brokerUser)) revoked.set(identity.brokerUser, new Date(identity.since));
  }
  return { revoked, heldUntil: heldUntil === undefined ? undefined : new Date(heldUntil) };
}

/** The broker user kept for a token: `{"user": "..."}` as written at issue time. */
export function brokerUserOf(credential: string): string {
  let value: unknown;
  try {
    value = JSON.parse(credential);
  } catch (error) {
    throw new MeshError("store", `a token's broker credential is not JSON: ${errorText(error)}`, {
      cause: error,
    });
  }
  const parsed = storedCredentialSchema.safeParse(value);
  if (!parsed.success)
    throw new MeshError("store", `a token's broker credential names no user: ${credential}`);
  return parsed.data.user;
}

/**
 * The tokens whose broker accounts stay: every valid one, and those that ended within `graceMs` of `now`, either
 * side (the joiner may still be reading its reply; an end written further ahead came from a clock that runs fast,
 * as `revocationsPastGrace` takes it). By token id.
 */
export async function tokensToKeep(store: Store, now: Date, graceMs: number): Promise<Set<string>> {
  return new Set(
    await store.tokens.validOrEndedWithin(now, {
      since: new Date(now.getTime() - graceMs),
      by: new Date(now.getTime() + graceMs),
    }),
  );
}

/** Nodes that were retired: what the broker kept for them (a RabbitMQ queue) goes. */
export async function retiredNodes(store: Store): Promise<string[]> {
  return (await store.nodes.retired()).map((node) => node.name);
}
