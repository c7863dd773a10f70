/**
 * Watches liveness and logs each crossing of the out-of-touch threshold once, in each direction. The ordinary case
 * — a node that stays here — is never logged.
 */
import type { Logger } from "../log.js";
import type { Store } from "../store/index.js";
import { livenessOf } from "./liveness.js";
import type { Liveness } from "./liveness.js";

export class LivenessWatch {
  private readonly known = new Map<string, Liveness>();

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    private readonly outOfTouchAfterMs: number,
    private readonly now: () => Date,
    /** Whether the control plane hears now: while it is deaf, nothing is judged. */
    private readonly hears: () => boolean = () => true,
  ) {}

  async check(): Promise<void> {
    if (!this.hears()) return;
    const now = this.now();
    const hearing = await this.store.hearing.read();
    // After a restart, the last crossing in the audit trail says where each node stood, so it is not told again:
    // read for the whole fleet at once, the first time only.
    const recorded = this.known.size === 0 ? await this.lastRecorded() : new Map<string, Liveness>();
    for (const node of await this.store.nodes.fleet()) {
      const reading = livenessOf(node.lastSeen, now, this.outOfTouchAfterMs, hearing);
      const before = this.known.get(node.name) ?? recorded.get(node.name);
      this.known.set(node.name, reading.liveness);
      if (before === reading.liveness) continue;
      if (reading.liveness === "out_of_touch") {
        this.log.warn("node.out_of_touch", { node: node.name, silent_for_s: reading.outOfTouchForS });
        await this.record("node.out_of_touch", node.name, { silent_for_s: reading.outOfTouchForS }, now);
      } else if (reading.liveness === "here" && before === "out_of_touch") {
        this.log.info("node.back_in_touch", { node: node.name });
        await this.record("node.back_in_touch", node.name, {}, now);
      }
    }
  }

  private async lastRecorded(): Promise<Map<string, Liveness>> {
    const crossings = await this.store.events.latestOfKinds(["node.out_of_touch", "node.back_in_touch"]);
    return new Map(
      [...crossings].map(([node, kind]) => [node, kind === "node.out_of_touch" ? "out_of_touch" : "here"]),
    );
  }

  private async record(
    kind: string,
    node: string,
    detail: Record<string, unknown>,
    now: Date,
  ): Promise<void> {
    await this.store.events.record({ at: now.toISOString(), kind, node, epoch: null, detail });
  }
}
