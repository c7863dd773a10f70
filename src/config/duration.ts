/** Durations as people write them: `500ms`, `45s`, `15m`, `1h`, `2d`, or a sum such as `1h30m`. */
import { UsageError } from "../errors.js";

const unitMs = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
const whole = /^(?:\d+(?:ms|s|m|h|d))+$/;
const part = /(\d+)(ms|s|m|h|d)/g;

/** Parses a positive duration into milliseconds. `what` names the setting in the error. */
export function parseDuration(text: string, what: string): number {
  const trimmed = text.trim();
  if (!whole.test(trimmed)) {
    throw new UsageError(`${what}: "${text}" is not a duration (use e.g. 90s, 15m, 1h, 1h30m)`);
  }
  let total = 0;
  for (const [, amount, unit] of trimmed.matchAll(part)) {
    total += Number(amount) * unitMs[unit as keyof typeof unitMs];
  }
  if (!Number.isSafeInteger(total) || total <= 0) {
    throw new UsageError(`${what}: "${text}" must be longer than zero`);
  }
  return total;
}

/** Milliseconds written back as people write them (`10s`, `1m30s`, `1500ms` → `1s500ms`), for messages. */
export function formatDuration(ms: number): string {
  let rest = ms;
  const parts: string[] = [];
  for (const unit of ["d", "h", "m", "s", "ms"] as const) {
    const amount = Math.floor(rest / unitMs[unit]);
    if (amount > 0) parts.push(`${amount}${unit}`);
    rest -= amount * unitMs[unit];
  }
  return parts.length === 0 ? "0ms" : parts.join("");
}
