/**
 * The last guard of a command's deadline. The broker operations carry the deadline themselves and fail with a
 * `timeout` that the command's own error path reports (it knows what it did); this guard is for whatever nothing
 * else bounds. Once armed, when the deadline and a grace have passed while the command still runs, the process ends
 * with one line and exit 1; and once the command has ended, the process ends with its code, whatever it left open
 * (a socket a stopped server never answers) that would otherwise keep it alive.
 */
import { exitCodes } from "../errors.js";

/** After the deadline, how long the command's own error path has to speak before the guard does. */
export const deadlineGraceMs = 1000;

// One command runs per process, so one guard: armed by the command, told by runProgram when the command ends.
let guard: NodeJS.Timeout | undefined;

/**
 * Arms the guard, once per process (later calls keep the first). `line` is asked when the guard fires and says, in
 * one line, what was and was not done.
 */
export function guardDeadline(ms: number, line: () => string): void {
  if (guard !== undefined) return;
  guard = setTimeout(() => {
    process.stderr.write(`${line()}\n`);
    process.exit(exitCodes.failure);
  }, ms + deadlineGraceMs);
  // The guard itself never keeps the process alive: a command that ended and left nothing open exits at once.
  guard.unref();
}

/**
 * The command has ended with `code`. With a guard armed, the process ends as soon as what the command printed has
 * been written, without waiting for anything it left open.
 */
export function commandEnded(code: number): void {
  if (guard === undefined) return;
  clearTimeout(guard);
  process.stdout.write("", () => process.stderr.write("", () => process.exit(code)));
}
