/**
 * Liveness: which nodes are here, which are out of touch and for how long, and which never spoke. Each needs a
 * different response from a person, so the three are never folded together.
 *
 * Silence is judged only over time the control plane could hear. A node becomes out of touch when, since it was
 * last heard, the control plane heard without a break for longer than the threshold: a broker it could not reach,
 * a store it could not write or no controller running at all is the control plane's deafness, not the node's
 * silence, and after it each node has a full threshold to be heard again. A node already out of touch before a
 * deafness stays so.
 */
import type { HearingRecord } from "../store/index.js";

export const livenessStates = ["here", "out_of_touch", "never_spoken"] as const;
export type Liveness = (typeof livenessStates)[number];

export interface LivenessReading {
  liveness: Liveness;
  /** Seconds since the node was last heard from, when it is out of touch; null otherwise. */
  outOfTouchForS: number | null;
}

/**
 * A node's liveness at `now`. Without a hearing record (no control plane has acted on this store) silence is
 * measured against `now`, as if someone had always listened.
 */
export function livenessOf(
  lastSeen: string | null,
  now: Date,
  outOfTouchAfterMs: number,
  hearing?: HearingRecord,
): LivenessReading {
  if (lastSeen === null) return { liveness: "never_spoken", outOfTouchForS: null };
  const seen = Date.parse(lastSeen);
  const silentMs = now.getTime() - seen;
  const listened = hearing === undefined ? silentMs : longestListened(seen, now.getTime(), hearing);
  if (listened <= outOfTouchAfterMs) return { liveness: "here", outOfTouchForS: null };
  return { liveness: "out_of_touch", outOfTouchForS: Math.floor(silentMs / 1000) };
}

/**
 * The longest stretch of unbroken hearing after `seen` (ms): the stretches lie between the gaps, the last one ends
 * when the control plane last knew it heard (never after `now`), and the first has no known start.
 */
export function longestListened(seen: number, now: number, hearing: HearingRecord): number {
  const end = Math.min(now, Date.parse(hearing.heardAt));
  const gaps = hearing.gaps
    .map((gap) => ({ from: Date.parse(gap.from), to: Date.parse(gap.to) }))
    .sort((a, b) => a.to - b.to);
  let longest = 0;
  let start = Number.NEGATIVE_INFINITY;
  const stretch = (from: number, to: number) => {
    const listened = Math.min(to, end) - Math.max(from, seen);
    if (listened > longest) longest = listened;
  };
  for (const gap of gaps) {
    stretch(start, gap.from);
    start = gap.to;
  }
  stretch(Math.max(start, Date.parse(hearing.since)), end);
  return longest;
}

/** How a person reads a liveness: `here`, `out of touch 4m`, `never spoken`. */
export function describeLiveness(reading: LivenessReading): string {
  switch (reading.liveness) {
    case "here":
      return "here";
    case "never_spoken":
      return "never spoken";
    case "out_of_touch":
      return `out of touch ${shortDuration(reading.outOfTouchForS ?? 0)}`;
    default: {
      const unknown: never = reading.liveness;
      return unknown;
    }
  }
}

/** The largest whole unit: 59s, 4m, 3h, 2d. */
export function shortDuration(seconds: number): string {
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86_400) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86_400)}d`;
}

/**
 * When the control plane last heard, for a person reading liveness: what they read is judged up to then. A moment
 * heard within a few seconds is "now".
 */
export function describeHearing(hearing: HearingRecord | undefined, now: Date): string {
  if (hearing === undefined)
    return "the control plane has not listened yet: liveness is judged by the clock alone";
  const agoS = Math.max(0, Math.floor((now.getTime() - Date.parse(hearing.heardAt)) / 1000));
  if (agoS < 5) return `the control plane hears the broker (since ${hearing.since})`;
  return `the control plane last heard the broker ${shortDuration(agoS)} ago (${hearing.heardAt}); nobody is called out of touch for the time since`;
}
