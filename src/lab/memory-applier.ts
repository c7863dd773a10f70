/**
 * The lab's applier: keeps each simulated node's declared files in memory. Everything before it is the agent's
 * real path — the signature verified over the bytes received, the node and the order checked — and what it reports
 * is what it did: every declared file held, a path declared twice refused, files no longer declared dropped.
 */
import { posix } from "node:path";
import type { Applier } from "../host/agent.js";
import type { ItemResult } from "../host/appliers.js";
import type { DeclaredItem } from "../link/index.js";

export class MemoryApplier implements Applier {
  /** The files this node holds: path → content and mode. */
  readonly files = new Map<string, { content: string; mode: string }>();

  apply(items: readonly DeclaredItem[]): Promise<ItemResult[]> {
    const declared = new Map<string, { content: string; mode: string }>();
    const results: ItemResult[] = [];
    for (const item of items) {
      if (item.type !== "file") {
        results.push({
          id: item.id,
          state: "failed",
          reason: `the lab holds files only, not ${item.type} items`,
        });
        continue;
      }
      const path = posix.normalize(item.path);
      if (declared.has(path)) {
        results.push({ id: item.id, state: "failed", reason: `${path} is declared by more than one item` });
        continue;
      }
      const content = item.content ?? Buffer.from(item.content_base64 ?? "", "base64").toString("utf8");
      declared.set(path, { content, mode: item.mode ?? "0644" });
      results.push({ id: item.id, state: "applied" });
    }
    this.files.clear();
    for (const [path, file] of declared) this.files.set(path, file);
    return Promise.resolve(results);
  }
}
