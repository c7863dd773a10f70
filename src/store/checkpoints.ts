/**
 * Checkpoints of a SQLite store on a thread of their own. In WAL mode SQLite copies the log back into the database
 * file (a checkpoint, with a sync of the file) from whichever connection commits once the log has grown past
 * `wal_autocheckpoint` pages: in a control plane that was its own roll-outs' and report batches' commits, one of them
 * every few thousand rows taking milliseconds longer, on the thread that also signs, sends and acknowledges. A
 * long-running control plane has a second connection on a worker thread checkpoint instead, `checkpointEveryMs`
 * apart (a passive checkpoint: it never waits for, nor holds up, a reader or a writer); its own commits keep a
 * checkpoint only as a bound, past `backstopPages`, should that thread fall behind or stop.
 */
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/** How often the thread checkpoints: the log holds about this long of the control plane's writing. */
export const checkpointEveryMs = 500;
/** SQLite's own default: what a store's commits go back to should the thread stop. */
export const autocheckpointPages = 1000;
/**
 * The commits' own checkpoint while the thread runs, as a bound on the log: ten times SQLite's default, about 40 MB
 * of 4 KiB pages, seconds of a fleet's reports.
 */
export const backstopPages = 10 * autocheckpointPages;

/**
 * What the thread says: it cannot start (then it ends), a checkpoint failed (told once until one succeeds again), or
 * they succeed again.
 */
type ThreadSays = { cannotStart: string } | { failed: string } | { recovered: true };

/**
 * The thread's code: CommonJS run by the worker, the driver loaded from where this process loaded it. Errors are
 * said as text: the driver's own error class loses its message on the way to this thread.
 */
const threadCode = `
const { parentPort, workerData } = require("node:worker_threads");
const text = (error) => (error instanceof Error ? error.message : String(error));
let db;
try {
  const Database = require(workerData.driver);
  db = new Database(workerData.path, { fileMustExist: true });
  db.pragma("busy_timeout = 5000");
} catch (error) {
  parentPort.postMessage({ cannotStart: text(error) });
  process.exit(1);
}
let failing = false;
const timer = setInterval(() => {
  try {
    db.pragma("wal_checkpoint(PASSIVE)");
    if (failing) parentPort.postMessage({ recovered: true });
    failing = false;
  } catch (error) {
    if (!failing) parentPort.postMessage({ failed: text(error) });
    failing = true;
  }
}, workerData.everyMs);
parentPort.on("message", () => {
  clearInterval(timer);
  db.close();
  parentPort.close();
});
`;

export interface CheckpointEvents {
  /** A checkpoint failed: said once until checkpoints succeed again. */
  failed: (reason: string) => void;
  /** Checkpoints succeed again after a failure. */
  recovered: () => void;
  /** The thread is gone (it could not start, or ended without being stopped): the commits must checkpoint again. */
  gone: (reason: string) => void;
}

export class Checkpointer {
  private readonly worker: Worker;
  private readonly ended: Promise<void>;
  private stopping = false;

  constructor(path: string, events: CheckpointEvents, everyMs = checkpointEveryMs) {
    this.worker = new Worker(threadCode, {
      eval: true,
      workerData: { path, everyMs, driver: driverPath() },
    });
    // It never keeps a process alive on its own: a process that is done ends, and its commits have checkpointed.
    this.worker.unref();
    /** Why the thread ended, when it said so or failed. */
    let failure: string | undefined;
    this.worker.on("message", (said: ThreadSays) => {
      if ("cannotStart" in said) failure = said.cannotStart;
      else if ("failed" in said) events.failed(`a checkpoint of ${path} failed: ${said.failed}`);
      else events.recovered();
    });
    this.worker.on("error", (error: unknown) => {
      failure = error instanceof Error ? error.message : String(error);
    });
    this.ended = new Promise((resolve) => {
      this.worker.once("exit", (code) => {
        if (!this.stopping)
          events.gone(`the checkpoint thread of ${path} ended (${failure ?? `exit code ${code}`})`);
        resolve();
      });
    });
  }

  /** Ends the thread after the checkpoint under way, if any, and closes its connection. */
  async stop(): Promise<void> {
    this.stopping = true;
    // Held on to while it ends: a process closing its store waits for the thread, whatever else is left.
    this.worker.ref();
    this.worker.postMessage("stop");
    await this.ended;
  }
}

/** Where this process loads the SQLite driver from, for the thread to load the same one. */
function driverPath(): string {
  // A bundle is CommonJS and has `require`; the modules tsc writes are ES modules and have `import.meta.url`.
  const resolver = typeof require === "function" ? require : createRequire(import.meta.url);
  return resolver.resolve("better-sqlite3");
}
