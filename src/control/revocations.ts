/**
 * Which broker identities must be refused now, derived from the store so every process computes the same set:
 * the identity of every token that was spent or revoked (until its own expiry makes the broker refuse it anyway),
 * the identity of every retired node, and every identity a node had before it enrolled again. Each is read by a
 * query of its own, not by loading every token and node: this runs at every start, reconnection and burst of joins.
 */
import type { Store } from "../store/index.js";

export async function currentRevocations(store: Store, now: Date): Promise<Map<string, Date>> {
  const revoked = new Map<string, Date>();
  for (const token of await store.tokens.endedIdentities(now)) {
    revoked.set(brokerUserOf(token.brokerCredential), new Date(token.endedAt));
  }
  for (const node of await store.nodes.retired()) {
    if (node.brokerUser !== null && node.retiredAt !== null) {
      revoked.set(node.brokerUser, new Date(node.retiredAt));
    }
  }
  for (const identity of await store.revokedIdentities.list()) {
    if (!revoked.has(identity.brokerUser)) revoked.set(identity.brokerUser, new Date(identity.since));
  }
  return revoked;
}

/** The broker user kept for a token: `{"user": "..."}` as written at issue time. */
export function brokerUserOf(credential: string): string {
  const parsed = JSON.parse(credential) as { user?: unknown };
  if (typeof parsed.user !== "string")
    throw new Error(`a token's broker credential names no user: ${credential}`);
  return parsed.user;
}

/**
 * The tokens whose broker accounts stay: every valid one, and those that ended within `graceMs` (the joiner may
 * still be reading its reply). By token id.
 */
export async function tokensToKeep(store: Store, now: Date, graceMs: number): Promise<Set<string>> {
  return new Set(await store.tokens.validOrEndedSince(now, new Date(now.getTime() - graceMs)));
}

/** Nodes that were retired: what the broker kept for them (a RabbitMQ queue) goes. */
export async function retiredNodes(store: Store): Promise<string[]> {
  return (await store.nodes.retired()).map((node) => node.name);
}
