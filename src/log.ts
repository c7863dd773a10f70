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

/** Characters a terminal acts on rather than shows: C0 and C1 controls and DEL. */
// eslint-disable-next-line no-control-regex -- control characters are exactly what is looked for here
const control = /[\u0000-\u001f\u007f-\u009f]/;
/** Those of them JSON leaves as they are. */
const jsonLeaves = /[\u007f-\u009f]/g;

/**
 * A string field as a readable line shows it: as it is, unless it holds a control character (text a node chose may:
 * a line break would forge a log line of its own, an escape sequence would act on the operator's terminal), then
 * as a JSON string, every control written as its escape.
 */
function readable(value: string): string {
  return control.test(value) ? escapeLeft(JSON.stringify(value)) : value;
}

/** JSON text with the controls JSON leaves as they are escaped too, so no line of the log acts on a terminal. */
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
 * forgotten once many are remembered, so what is kept is bounded by the keys warned about within a window.
 */
export class WarningWindow {
  private readonly told = new Map<string, { at: number; heldBack: number }>();

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
    if (this.told.size >= forgetFrom) {
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
