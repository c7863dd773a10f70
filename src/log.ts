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
          .map(([key, value]) => `${key}=${typeof value === "string" ? value : JSON.stringify(value)}`)
          .join(" ");
        write(
          `${at.slice(11, 19)} ${level.toUpperCase().padEnd(5)} ${event}${rest === "" ? "" : ` ${rest}`}\n`,
        );
      } else {
        write(`${JSON.stringify({ at, level, event, ...all })}\n`);
      }
    };
  return { debug: emit("debug"), info: emit("info"), warn: emit("warn"), error: emit("error") };
}

/** The message of anything thrown, for a log field. */
export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
