/**
 * `--timeout`: how long a command that reaches the broker waits for it. Every wait for the broker (connecting, the
 * lease's operations, the flush after sending) is given the deadline and fails with a `timeout` that the command's
 * own error path reports; the process-wide guard (src/program/deadline.ts) ends whatever nothing else bounds. Both
 * say only what is true: "nothing was done" only while the command has written nothing.
 */
import { formatDuration } from "../config/duration.js";
import { MeshError } from "../errors.js";
import { guardDeadline } from "../program/deadline.js";

/** The deadline when `--timeout` is not given. */
export const defaultBrokerTimeoutMs = 10_000;

export class BrokerDeadline {
  /** Whether the command has begun to write what it came to write (the store, the broker). */
  private writing = false;
  /** What the command has not done while it has written nothing: "nothing was declared". */
  private nothingDone = "nothing was done";

  /** When the command first reached for the broker: the deadline counts from there. */
  private reachedAt: number | undefined;

  constructor(readonly ms: number) {}

  /** What is left of the deadline (all of it before the command reached for the broker). */
  remainingMs(): number {
    return this.reachedAt === undefined ? this.ms : Math.max(0, this.reachedAt + this.ms - Date.now());
  }

  /** The deadline as the operator would write it, with the flag that sets it. */
  get said(): string {
    return `within ${formatDuration(this.ms)} (--timeout)`;
  }

  /**
   * The command reaches for the broker: the guard is armed from here (not from the process's start, so that the
   * broker's first wait and the guard count from the same moment). `nothingDone` says what did not happen if the
   * deadline passes before the command writes.
   */
  reach(nothingDone?: string): void {
    if (nothingDone !== undefined && !this.writing) this.nothingDone = nothingDone;
    this.reachedAt ??= Date.now();
    guardDeadline(this.ms, () => `mesh: no answer from the broker ${this.said}; ${this.done()}`);
  }

  /** From here on a deadline cannot say that nothing was done. */
  beginsWriting(): void {
    this.writing = true;
  }

  /**
   * A broker's `timeout` before the command wrote anything, as the one line the command ends with; any other error
   * as it is.
   */
  explain(error: unknown): unknown {
    if (!(error instanceof MeshError) || error.code !== "timeout" || this.writing) return error;
    return new MeshError("timeout", `no answer from the broker ${this.said}; ${this.done()}`, {
      cause: error,
    });
  }

  private done(): string {
    return this.writing ? "it had begun to write, so part of it may have been done" : this.nothingDone;
  }
}
