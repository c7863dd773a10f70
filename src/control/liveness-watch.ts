/**
 * Watches liveness and logs each crossing of the out-of-touch threshold once, in each direction. The ordinary case
 * — a node that stays here — is never logged. A node heard again after a silence that crossed the threshold between
 * two checks (or while the control plane was deaf) went out of touch and came back all the same: both are told; so
 * are the return and the going again of one out of touch at both looks but heard between them.
 */
import type { Logger } from "../log.js";
import type { HearingRecord, Store } from "../store/index.js";
import { livenessOf } from "./liveness.js";
import type { Liveness } from "./liveness.js";

interface Known {
  liveness: Liveness;
  lastSeen: string | null;
}

export class LivenessWatch {
  private readonly known = new Map<string, Known>();
  private looking: Promise<void> | undefined;

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    private readonly outOfTouchAfterMs: number,
    private readonly now: () => Date,
    /** Whether the control plane hears now: while it is deaf, nothing is judged. */
    private readonly hears: () => boolean = () => true,
  ) {}

  /**
   * One look at the fleet. A look asked for while one is under way is that one: a second beside it could finish
   * after it on older readings and undo what it learnt.
   */
  check(): Promise<void> {
    return (this.looking ??= this.look().finally(() => (this.looking = undefined)));
  }

  private async look(): Promise<void> {
    if (!this.hears()) return;
    const now = this.now();
    const hearing = await this.store.hearing.read();
    // After a restart, the last crossing in the audit trail says where each node stood, so it is not told again:
    // read for the whole fleet at once, the first time only.
    const recorded = this.known.size === 0 ? await this.lastRecorded() : new Map<string, Liveness>();
    for (const node of await this.store.nodes.fleet()) {
      const reading = livenessOf(node.lastSeen, now, this.outOfTouchAfterMs, hearing);
      const was = this.known.get(node.name);
      const before = was?.liveness ?? recorded.get(node.name);
      this.known.set(node.name, { liveness: reading.liveness, lastSeen: node.lastSeen });
      if (before === "here" && reading.liveness === "here") {
        const silence = this.silenceCrossed(was?.lastSeen ?? null, node.lastSeen, hearing);
        if (silence === undefined) continue;
        await this.wentOut(node.name, silence, now);
        await this.cameBack(node.name, now);
      } else if (before === "out_of_touch" && reading.liveness === "out_of_touch") {
        // Heard since the last look, and silent past the threshold again: it came back and went again.
        if (was === undefined || was.lastSeen === node.lastSeen) continue;
        await this.cameBack(node.name, now);
        await this.wentOut(node.name, reading.outOfTouchForS, now);
      } else if (before === reading.liveness) {
        continue;
      } else if (reading.liveness === "out_of_touch") {
        await this.wentOut(node.name, reading.outOfTouchForS, now);
      } else if (reading.liveness === "here" && before === "out_of_touch") {
        await this.cameBack(node.name, now);
      }
    }
  }

  /**
   * When a node was heard at `from` and next at `to`, the seconds it was silent if that silence crossed the
   * threshold (judged, as always, over the time the control plane heard); undefined when it did not.
   */
  private silenceCrossed(
    from: string | null,
    to: string | null,
    hearing: HearingRecord | undefined,
  ): number | undefined {
    if (from === null || to === null || to === from) return undefined;
    // The wall-clock silence bounds the heard one: most nodes, heard every few seconds, stop here.
    if (Date.parse(to) - Date.parse(from) <= this.outOfTouchAfterMs) return undefined;
    const between = livenessOf(from, new Date(to), this.outOfTouchAfterMs, hearing);
    return between.liveness === "out_of_touch" ? (between.outOfTouchForS ?? undefined) : undefined;
  }

  private async wentOut(node: string, silentForS: number | null, now: Date): Promise<void> {
    this.log.warn("node.out_of_touch", { node, silent_for_s: silentForS });
    await this.record("node.out_of_touch", node, { silent_for_s: silentForS }, now);
  }

  private async cameBack(node: string, now: Date): Promise<void> {
    this.log.info("node.back_in_touch", { node });
    await this.record("node.back_in_touch", node, {}, now);
  }

  private async lastRecorded(): Promise<Map<string, Liveness>> {
    const crossings = await this.store.events.latestCrossings();
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
