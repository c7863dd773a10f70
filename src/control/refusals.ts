/**
 * What the control plane tells of the refusals of what nodes send. Every refusal is counted (the caller adds to the
 * node's counters); it is told — one log line and one event row — at most once a window (a minute) per node and
 * kind, with how many came since it was last told and the latest reason, cut to a bounded length. One node sending
 * garbage as fast as it can costs the log and the audit trail one line and one row a minute, not one per message.
 * What the ledger noted is only as good as the store's keeping of it: a caller whose transaction fails takes its
 * notes back (`TakeBack`), so a refusal told in an event the store never kept is told again, not passed over for
 * the rest of its window; and a refusal only counted by a caller whose transaction is still under way is counted
 * for telling once that transaction is kept, so a window's telling meanwhile does not tell it ahead of a failure that
 * would make it come again.
 */
import { boundText } from "../link/index.js";
import type { Logger } from "../log.js";
import type { MeshEvent } from "../store/index.js";

/** One refusal, as the caller saw it. */
export interface Refusal {
  /** The node the refused message named (the broker vouches for it), or "*" when it named none that is valid. */
  node: string;
  /** What was refused: `report`, `alive`, `enrol`, `token`; the event is `<kind>.refused`. */
  kind: string;
  /** Why, for a person. Cut to a bounded length before it is logged or kept. */
  reason: string;
  /** More of the decision, kept in the event (small values only: nothing here comes from the node unbounded). */
  detail?: Record<string, unknown>;
}

interface Window {
  node: string;
  kind: string;
  /** When this node and kind were last told (ms). */
  toldAt: number;
  /** Refusals since, not yet told. */
  untold: number;
  latest: Refusal;
  /** When the latest came (ms): a count settled late does not replace a later one. */
  latestAt: number;
}

/** Where a refusal's window is kept: one per node and kind. */
function windowKey(refusal: Refusal): string {
  return `${refusal.kind}\n${refusal.node}`;
}

/** The default window: a refusal of one kind from one node is told at most once a minute. */
export const refusalWindowMs = 60_000;

/**
 * What a caller noted while it wrote a transaction, undone should the transaction fail: each step changes back only
 * what is still as the note left it (another caller may have moved on since).
 */
export type TakeBack = Array<() => void>;

/** Undoes the steps, the last first. */
export function takeBack(steps: TakeBack): void {
  for (const step of steps.splice(0).reverse()) step();
}

/** Adds `by` to the count kept for `key`; a count back at zero is forgotten. */
export function addToCount<K>(counts: Map<K, number>, key: K, by: number): void {
  const count = (counts.get(key) ?? 0) + by;
  if (count > 0) counts.set(key, count);
  else counts.delete(key);
}

/** What a caller noted that counts only once its transaction is kept: each step run then, in the order noted. */
export type OnceKept = Array<() => void>;

/** Runs the steps of a transaction now kept, the first first. */
export function settleKept(steps: OnceKept): void {
  for (const step of steps.splice(0)) step();
}

export class RefusalLedger {
  private readonly windows = new Map<string, Window>();
  /**
   * How many refusals of each node and kind (by key) callers whose transactions are under way have counted: kept out
   * of their windows' counts (and so out of what a window's end tells) until their callers' steps in `kept` run.
   */
  private readonly pending = new Map<string, number>();

  constructor(
    private readonly log: Logger,
    private readonly windowMs = refusalWindowMs,
  ) {}

  /**
   * Notes one refusal at `at`. Returns the event to keep when this refusal is told now (the first of its node and
   * kind in a window), or undefined when it is only counted until the window ends. The step that takes the note
   * back goes into `undo`. Given `kept`, the steps a caller runs once its transaction is kept, a refusal only
   * counted is counted for telling by its step there, and until then by no window's end; its step in `undo` drops it.
   */
  note(refusal: Refusal, at: Date, undo?: TakeBack): MeshEvent | undefined;
  note(refusal: Refusal, at: Date, undo: TakeBack, kept: OnceKept): MeshEvent | undefined;
  note(refusal: Refusal, at: Date, undo?: TakeBack, kept?: OnceKept): MeshEvent | undefined {
    const key = windowKey(refusal);
    const now = at.getTime();
    const window = this.windows.get(key);
    if (window !== undefined && now - window.toldAt < this.windowMs) {
      if (kept !== undefined) {
        addToCount(this.pending, key, 1);
        const settle = () => addToCount(this.pending, key, -1);
        undo?.push(settle);
        kept.push(() => {
          settle();
          this.count(refusal, false, now);
        });
        return undefined;
      }
      window.untold += 1;
      window.latest = refusal;
      window.latestAt = now;
      undo?.push(() => {
        if (this.windows.get(key) === window && window.untold > 0) window.untold -= 1;
      });
      return undefined;
    }
    const refusals = 1 + (window?.untold ?? 0);
    const opened: Window = {
      node: refusal.node,
      kind: refusal.kind,
      toldAt: now,
      untold: 0,
      latest: refusal,
      latestAt: now,
    };
    this.windows.set(key, opened);
    // Not told after all: the window before stands again, with what was counted in this one since; with none
    // before, what was counted since is told at the next look (`due`).
    undo?.push(() => {
      const current = this.windows.get(key);
      // Forgotten as quiet since is as good as still standing: nothing took its place. Replaced by a later window
      // (this one's minute over), that window takes on what the one before had counted: told at its end.
      if (current !== undefined && current !== opened) {
        current.untold += window?.untold ?? 0;
        return;
      }
      if (window !== undefined) {
        window.untold += opened.untold;
        this.windows.set(key, window);
      } else if (opened.untold === 0) {
        this.windows.delete(key);
      } else {
        opened.toldAt = Number.NEGATIVE_INFINITY;
        this.windows.set(key, opened);
      }
    });
    return this.tell(refusal, refusals, at);
  }

  /**
   * Counts a refusal that came (its answer went) but whose telling the store did not keep, once that telling is taken
   * back: it is told with the next refusal of its node and kind, or at the next look (`due`), whichever comes first.
   */
  untold(refusal: Refusal): void {
    this.count(refusal, true);
  }

  /**
   * Counts a refusal in its window, to be told when the window ends; or `now`, at the next look. Without a window
   * (forgotten as quiet, or a first telling taken back, while the count was under way), at the next look: its window
   * has ended, or was never told. A refusal that came at `at` becomes the window's latest unless a later one is.
   */
  private count(refusal: Refusal, now: boolean, at?: number): void {
    const key = windowKey(refusal);
    // Changed in place: a take-back still to run knows its window by identity.
    const window = this.windows.get(key);
    if (window === undefined) {
      this.windows.set(key, {
        node: refusal.node,
        kind: refusal.kind,
        toldAt: Number.NEGATIVE_INFINITY,
        untold: 1,
        latest: refusal,
        latestAt: at ?? Number.NEGATIVE_INFINITY,
      });
      return;
    }
    window.untold += 1;
    if (at === undefined || at >= window.latestAt) {
      window.latest = refusal;
      if (at !== undefined) window.latestAt = at;
    }
    if (now) window.toldAt = Number.NEGATIVE_INFINITY;
  }

  /**
   * Tells the refusals held back in windows that have ended, and forgets the nodes that have been quiet for a
   * whole window (so what is remembered is bounded by the nodes refusing now; a count still under way is told at
   * the next look once kept). Returns the events to keep; the steps that take their telling back go into `undo`.
   */
  due(at: Date, undo?: TakeBack): MeshEvent[] {
    const now = at.getTime();
    const events: MeshEvent[] = [];
    for (const [key, window] of this.windows) {
      if (now - window.toldAt < this.windowMs) continue;
      if (window.untold === 0) {
        this.windows.delete(key);
        continue;
      }
      const { toldAt, untold } = window;
      events.push(this.tell(window.latest, untold, at));
      window.toldAt = now;
      window.untold = 0;
      undo?.push(() => {
        if (this.windows.get(key) !== window || window.toldAt !== now) return;
        window.toldAt = toldAt;
        window.untold += untold;
      });
    }
    return events;
  }

  /** How many counted refusals wait for their callers' transactions (for tests and metrics). */
  get pendingCount(): number {
    let count = 0;
    for (const waiting of this.pending.values()) count += waiting;
    return count;
  }

  private tell(refusal: Refusal, refusals: number, at: Date): MeshEvent {
    const reason = boundText(refusal.reason);
    this.log.warn(`${refusal.kind}.refused`, {
      node: refusal.node,
      reason,
      refusals,
      note: `counted; told at most once every ${Math.round(this.windowMs / 1000)} s per node and kind`,
    });
    return {
      at: at.toISOString(),
      kind: `${refusal.kind}.refused`,
      node: refusal.node === "*" ? null : refusal.node,
      epoch: null,
      detail: { ...refusal.detail, reason, refusals },
    };
  }
}
