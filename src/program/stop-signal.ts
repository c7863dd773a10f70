/**
 * The signals that ask a long-running command (`mesh up`, `mesh serve`, `mesh lab`, `mesh-host run`) to stop.
 */

/**
 * Resolves with the first signal that asks the process to stop: SIGINT, SIGTERM, or SIGHUP (its terminal closed). The
 * handlers stay: a signal that comes again while the process stops (`npm exec` passes the terminal's SIGINT on, so it
 * comes twice) would otherwise end it before it has stopped what it runs.
 */
export function stopSignal(): Promise<string> {
  return new Promise<string>((resolve) => {
    for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(signal, () => resolve(signal));
  });
}
