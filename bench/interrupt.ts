/**
 * A run interrupted (SIGINT, SIGTERM) stops what it started before it exits: its control planes (let go first if
 * stopped for a backlog), its broker (RabbitMQ back on its own descriptor limit, the bench's vhost deleted), its
 * temporary dirs. Each part names its stop while it runs; the signal runs every one named, and no results are written
 * after it: a cut-short run's figures are not the code's. A second signal leaves at once.
 */

import { errorText } from "../src/log.js";

const stops = new Set<() => Promise<void>>();
let interruptedBy: NodeJS.Signals | undefined;

/** `work` run at its first call; every call after gets the first's promise (a stop both an interrupt and a part's end ask for). */
export function once<T>(work: () => Promise<T>): () => Promise<T> {
  let running: Promise<T> | undefined;
  return () => (running ??= work());
}

/** Runs `stop` if the run is interrupted while `stop` is named; returns what un-names it. */
export function stopWhenInterrupted(stop: () => Promise<void>): () => boolean {
  stops.add(stop);
  return () => stops.delete(stop);
}

/** The signal that interrupted the run, if one did. */
export function interrupted(): NodeJS.Signals | undefined {
  return interruptedBy;
}

/** Makes SIGINT and SIGTERM stop what the run started, then exit 130 or 143. */
export function handleInterrupts(say: (line: string) => void): void {
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.on(signal, () => {
      const code = signal === "SIGINT" ? 130 : 143;
      if (interruptedBy !== undefined) {
        say(`bench: ${signal} again: leaving without stopping the rest`);
        process.exit(code);
      }
      interruptedBy = signal;
      say(`bench: ${signal}: stopping what the run started (${signal} again leaves at once)`);
      void Promise.allSettled([...stops].map((stop) => stop())).then((ends) => {
        for (const end of ends) {
          if (end.status === "rejected") say(`bench: stopping failed: ${errorText(end.reason)}`);
        }
        process.exit(code);
      });
    });
  }
}
