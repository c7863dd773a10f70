/**
 * Retiring a node: its record stays (history, audit), its broker identity is refused from now on, and any token
 * still waiting for it is revoked — a token for a retired name must not even learn that it was valid.
 */
import { MeshError } from "../errors.js";
import type { Store } from "../store/index.js";
import { tokenStatus } from "../store/index.js";
import { currentRevocations } from "./revocations.js";

/** Retires the node in the store and returns the revocations the broker must now apply. */
export async function retireNode(store: Store, name: string, now: Date): Promise<Map<string, Date>> {
  const record = await store.nodes.get(name);
  if (record === undefined) throw new MeshError("node_unknown", `no node named ${name}`);
  if (!(await store.nodes.retire(name, now.toISOString()))) {
    throw new MeshError("node_retired", `node ${name} is already retired`);
  }
  const revokedTokens: string[] = [];
  for (const token of await store.tokens.list()) {
    if (
      token.node === name &&
      tokenStatus(token, now) === "valid" &&
      (await store.tokens.revoke(token.id, now))
    ) {
      revokedTokens.push(token.id);
    }
  }
  await store.events.record({
    at: now.toISOString(),
    kind: "node.retired",
    node: name,
    epoch: null,
    detail: { tokens_revoked: revokedTokens },
  });
  return currentRevocations(store, now);
}
