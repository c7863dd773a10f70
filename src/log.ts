/**
 * Structured logs: one JSON object a line on stderr, or a readable line when stderr is a terminal. The ordinary
 * case (an alive arriving, a report kept) is not logged at all; decisions and trouble are.
 */
export type LogLevel = "debug" | "info" | "warn" | "error";

export interface Logger {
  debug(event: string, fields?: Record<string, unknown>): void;
  info(event: string, fields?: Record<string, unknown>): void;
  warn(event: string, fields?: Record<string, unknown>): void;
  error(event: string, fields?: Record<string, unknown>): void;
}

const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export function createLogger(options: {
  write?: (line: string) => void;
  pretty?: boolean;
  level?: LogLevel;
  fields?: Record<string, unknown>;
}): Logger {
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const pretty = options.pretty ?? process.stderr.isTTY === true;
  const threshold = rank[options.level ?? "info"];
  const emit =
    (level: LogLevel) =>
    (event: string, fields: Record<string, unknown> = {}) => {
      if (rank[level] < threshold) return;
      const at = new Date().toISOString();
      const all = { ...options.fields, ...fields };
      if (pretty) {
        const rest = Object.entries(all)
          .map(
            ([key, value]) =>
              `${key}=${typeof value === "string" ? readable(value) : escapeLeft(String(JSON.stringify(value)))}`,
          )
          .join(" ");
        write(
          `${at.slice(11, 19)} ${level.toUpperCase().padEnd(5)} ${event}${rest === "" ? "" : ` ${rest}`}\n`,
        );
      } else {
        write(`${escapeLeft(JSON.stringify({ at, level, event, ...all }))}\n`);
      }
    };
  return { debug: emit("debug"), info: emit("info"), warn: emit("warn"), error: emit("error") };
}

/**
 * What a terminal acts on rather than shows, or what breaks or reorders what it shows: C0 and C1 controls, DEL, the
 * line and paragraph separators, and the bidirectional marks, embeddings, overrides and isolates.
 */
const unshown = "\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069";
/** A field's text shown bare: something, and nothing in it that reads as another field or hides what it is. */
const bare = new RegExp(`^[^\\s"=\\\\${unshown}]+$`, "u");
/** Those JSON leaves as they are: all but the C0 controls. */
const jsonLeaves = /[\u007f-\u009f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]/gu;

/**
 * A string field as a readable line shows it: bare when it is one word of ordinary characters, else as a JSON string
 * with every character above escaped. Text a node chose may hold anything: a line break would forge a line of its
 * own, ` node=db-9` a field, an escape sequence would act on the operator's terminal.
 */
function readable(value: string): string {
  return bare.test(value) ? value : escapeLeft(JSON.stringify(value));
}

/** JSON text with the characters above that JSON leaves as they are escaped too. */
function escapeLeft(json: string): string {
  return json.replace(jsonLeaves, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** The message of anything thrown, for a log field. */
export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * Warns at most once a window per key (a node, most often), saying how many were held back since it last did: what a
 * sender can make the log say stays a line a window however fast it sends. Keys quiet for a whole window are
 * forgotten once many are remembered (with what they held back: told only to a sender that comes back before), so
 * what is kept is bounded by the keys warned about within about two windows.
 */
export class WarningWindow {
  private readonly told = new Map<string, { at: number; heldBack: number }>();
  private sweptAt = Number.NEGATIVE_INFINITY;

  constructor(
    private readonly log: Logger,
    private readonly windowMs = 60_000,
    private readonly now: () => number = Date.now,
  ) {}

  warn(key: string, event: string, fields: Record<string, unknown>): void {
    const now = this.now();
    const last = this.told.get(key);
    if (last !== undefined && now - last.at < this.windowMs) {
      last.heldBack += 1;
      return;
    }
    // Looked over at most once a window, so a crowd of senders costs a pass a window, not one per new sender.
    if (this.told.size >= forgetFrom && now - this.sweptAt >= this.windowMs) {
      this.sweptAt = now;
      for (const [known, { at }] of this.told) if (now - at >= this.windowMs) this.told.delete(known);
    }
    this.told.set(key, { at: now, heldBack: 0 });
    this.log.warn(event, {
      ...fields,
      ...(last === undefined || last.heldBack === 0 ? {} : { held_back: last.heldBack }),
    });
  }
}

/** How many keys a `WarningWindow` remembers before it forgets the quiet ones. */
const forgetFrom = 1024;
