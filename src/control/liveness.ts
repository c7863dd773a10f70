/**
 * Liveness: which nodes are here, which are out of touch and for how long, and which never spoke. Each needs a
 * different response from a person, so the three are never folded together.
 */
export const livenessStates = ["here", "out_of_touch", "never_spoken"] as const;
export type Liveness = (typeof livenessStates)[number];

export interface LivenessReading {
  liveness: Liveness;
  /** Seconds since the node was last heard from, when it is out of touch; null otherwise. */
  outOfTouchForS: number | null;
}

export function livenessOf(lastSeen: string | null, now: Date, outOfTouchAfterMs: number): LivenessReading {
  if (lastSeen === null) return { liveness: "never_spoken", outOfTouchForS: null };
  const silentMs = now.getTime() - Date.parse(lastSeen);
  if (silentMs <= outOfTouchAfterMs) return { liveness: "here", outOfTouchForS: null };
  return { liveness: "out_of_touch", outOfTouchForS: Math.floor(silentMs / 1000) };
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
