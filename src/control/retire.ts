/**
 * Retiring a node: its record stays (history, audit), its broker identity is refused from now on, and any token
 * still waiting for it is revoked — a token for a retired name must not even learn that it was valid.
 */
import { MeshError } from "../errors.js";
import type { Store } from "../store/index.js";
import { currentRevocations } from "./revocations.js";

/**
 * Retires the node in the store and returns the revocations the broker must now apply. `epoch`: the lease epoch the
 * retiring command acted under, kept with the audit line.
 */
export async function retireNode(
  store: Store,
  name: string,
  now: Date,
  epoch?: number,
): Promise<Map<string, Date>> {
  // One transaction: the node retired, its waiting tokens revoked and the audit line land together, so a failure
  // half way never leaves a retired node with a token that still lets a machine in under its name.
  await store.transaction(async (tx) => {
    const record = await tx.nodes.get(name);
    if (record === undefined) throw new MeshError("node_unknown", `no node named ${name}`);
    if (!(await tx.nodes.retire(name, now.toISOString()))) {
      throw new MeshError("node_retired", `node ${name} is already retired`);
    }
    const revokedTokens: string[] = [];
    for (const token of await tx.tokens.validFor(name, now)) {
      if (await tx.tokens.revoke(token.id, now)) revokedTokens.push(token.id);
    }
    await tx.events.record({
      at: now.toISOString(),
      kind: "node.retired",
      node: name,
      epoch: epoch ?? null,
      detail: { tokens_revoked: revokedTokens },
    });
  });
  return currentRevocations(store, now);
}
