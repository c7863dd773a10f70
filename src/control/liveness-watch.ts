/**
 * Watches liveness and logs each crossing of the out-of-touch threshold once, in each direction. The ordinary case
 * — a node that stays here — is never logged. A node heard again after a silence that crossed the threshold between
 * two checks (or while the control plane was deaf) went out of touch and came back all the same: both are told; so
 * are the return and the going again of one out of touch at both looks but heard between them, if what was heard
 * puts it within the threshold of the earlier look (old messages taken late say nothing new). A look's crossings go
 * into the audit trail together, and are logged once they are in it.
 */
import type { Logger } from "../log.js";
import type { HearingRecord, Store } from "../store/index.js";
import { livenessOf } from "./liveness.js";
import type { Liveness } from "./liveness.js";

interface Known {
  liveness: Liveness;
  lastSeen: string | null;
  /** When the look that found it so was made (ms); unknown for where a restarted watch read it stood. */
  lookedAt?: number;
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
    const crossings: Crossing[] = [];
    /** Where each node that crossed stood before this look: where it stands again should its crossings not be kept. */
    const stoodBefore = new Map<string, Known | undefined>();
    const crossed = (
      node: string,
      before: Liveness | undefined,
      was: Known | undefined,
      ...told: Crossing[]
    ) => {
      stoodBefore.set(
        node,
        before === undefined
          ? undefined
          : { liveness: before, lastSeen: was?.lastSeen ?? null, lookedAt: was?.lookedAt },
      );
      crossings.push(...told);
    };
    for (const node of await this.store.nodes.fleet()) {
      const reading = livenessOf(node.lastSeen, now, this.outOfTouchAfterMs, hearing);
      const was = this.known.get(node.name);
      const before = was?.liveness ?? recorded.get(node.name);
      this.known.set(node.name, {
        liveness: reading.liveness,
        lastSeen: node.lastSeen,
        lookedAt: now.getTime(),
      });
      if (before === "here" && reading.liveness === "here") {
        const silence = this.silenceCrossed(was?.lastSeen ?? null, node.lastSeen, hearing);
        if (silence === undefined) continue;
        crossed(node.name, before, was, wentOut(node.name, silence), cameBack(node.name));
      } else if (before === "out_of_touch" && reading.liveness === "out_of_touch") {
        // Heard since the last look, and silent past the threshold again: it came back and went again. Unless what
        // was heard was past the threshold already at that look (a backlog taken after the broker or this control
        // plane was away): then it never was back, and telling so at each look would tell a whole fleet twice.
        if (was === undefined || was.lastSeen === node.lastSeen) continue;
        if (!this.hereAt(node.lastSeen, was.lookedAt, hearing)) continue;
        crossed(node.name, before, was, cameBack(node.name), wentOut(node.name, reading.outOfTouchForS));
      } else if (before === reading.liveness) {
        continue;
      } else if (reading.liveness === "out_of_touch") {
        crossed(node.name, before, was, wentOut(node.name, reading.outOfTouchForS));
      } else if (reading.liveness === "here" && before === "out_of_touch") {
        crossed(node.name, before, was, cameBack(node.name));
      }
    }
    if (crossings.length === 0) return;
    // One transaction for the whole look: a fleet that went out of touch together (the broker was away) is a few
    // statements, where a commit per crossing held the store from the reports coming in behind it.
    const at = now.toISOString();
    try {
      await this.store.events.recordMany(
        crossings.map(({ kind, node, detail }) => ({ at, kind, node, epoch: null, detail })),
      );
    } catch (error) {
      // Not in the audit trail, so not known: the next look finds the same crossings and tells them.
      for (const [node, stood] of stoodBefore) {
        if (stood === undefined) this.known.delete(node);
        else this.known.set(node, stood);
      }
      throw error;
    }
    for (const { kind, node, detail } of crossings) {
      if (kind === "node.out_of_touch") this.log.warn(kind, { node, ...detail });
      else this.log.info(kind, { node });
    }
  }

  /** Whether a node last heard at `lastSeen` was here at `at` (ms), or at any time when `at` is unknown. */
  private hereAt(
    lastSeen: string | null,
    at: number | undefined,
    hearing: HearingRecord | undefined,
  ): boolean {
    if (at === undefined) return true;
    return livenessOf(lastSeen, new Date(at), this.outOfTouchAfterMs, hearing).liveness === "here";
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

  private async lastRecorded(): Promise<Map<string, Liveness>> {
    const crossings = await this.store.events.latestCrossings();
    return new Map(
      [...crossings].map(([node, kind]) => [node, kind === "node.out_of_touch" ? "out_of_touch" : "here"]),
    );
  }
}

/** A crossing of the threshold, as the audit trail keeps it. */
interface Crossing {
  kind: "node.out_of_touch" | "node.back_in_touch";
  node: string;
  detail: Record<string, unknown>;
}

function wentOut(node: string, silentForS: number | null): Crossing {
  return { kind: "node.out_of_touch", node, detail: { silent_for_s: silentForS } };
}

function cameBack(node: string): Crossing {
  return { kind: "node.back_in_touch", node, detail: {} };
}
