/**
 * Checkpoints of a SQLite store on a thread of their own. In WAL mode SQLite copies the log back into the database
 * file (a checkpoint, with a sync of the file) from whichever connection commits once the log has grown past
 * `wal_autocheckpoint` pages: in a control plane that was its own roll-outs' and report batches' commits, one of them
 * every few thousand rows taking milliseconds longer, on the thread that also signs, sends and acknowledges. A
 * long-running control plane has a second connection on a worker thread checkpoint instead, `checkpointEveryMs`
 * apart while the store is written and less often at rest (a passive checkpoint: it never waits for, nor holds up, a
 * reader or a writer); its own commits keep a checkpoint only as a bound, past `backstopPages`, should that thread
 * fall behind or stop.
 */
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/** How often the thread checkpoints while the store is written: the log holds about this long of the writing. */
export const checkpointEveryMs = 500;
/**
 * A checkpoint that found fewer frames than this in the log (a megabyte of 4 KiB pages) is followed by one
 * `restFactor` times later: at rest, a control plane's commits are a few pages a second (`last_seen`, its hearing),
 * and checkpointing them every half second, with its syncs, cost about 0.3 % of a core at 1,000 nodes.
 */
const busyFrames = 256;
const restFactor = 4;
/** SQLite's own default: what a store's commits go back to should the thread stop. */
export const autocheckpointPages = 1000;
/**
 * The commits' own checkpoint while the thread runs, as a bound on the log: ten times SQLite's default, about 40 MB
 * of 4 KiB pages, seconds of a fleet's reports.
 */
export const backstopPages = 10 * autocheckpointPages;
/**
 * The size the log file is cut back to once a checkpoint has emptied it: 64 MiB, above what the log reaches under
 * load (the backstop's 40 MB and a commit), so a busy store's log is not cut back and grown again at every burst.
 * Cut back to SQLite's default 4 MB, each roll-out to 10,000 nodes (about 36 MB of log) grew the file again, and
 * each restart of the log truncated it, on the thread that records. With this and the temporary tables in memory
 * (see `connect`), a harness of such a roll-out's commits spent a fifth to two fifths less CPU in them, and less
 * time waiting. Only a burst past it (the backstop not reached in time) leaves a file to cut back.
 */
export const logKeptBytes = 64 * 1024 * 1024;

/**
 * What the thread says: it cannot start (then it ends), a checkpoint failed (told once until one succeeds again), or
 * they succeed again. A failure is sent as text with the driver's error code: the driver's own error class arrives
 * here as a bare object, without its message.
 */
type ThreadSays =
  { kind: "cannot_start"; reason: string } | { kind: "failed"; reason: string } | { kind: "recovered" };

/**
 * The thread's code: CommonJS run by the worker, the driver loaded from where this process loaded it. It is a string
 * because each command is one bundled file: a thread of its own file would need a second bundle beside it. It
 * stops at any message.
 */
const threadCode = `
const { parentPort, workerData } = require("node:worker_threads");
const text = (error) => {
  const message = error instanceof Error ? error.message : String(error);
  const code = error !== null && typeof error === "object" ? error.code : undefined;
  return typeof code === "string" && code !== "" ? message + " (" + code + ")" : message;
};
let db;
try {
  const Database = require(workerData.driver);
  db = new Database(workerData.path, { fileMustExist: true });
  db.pragma("busy_timeout = 5000");
} catch (error) {
  parentPort.postMessage({ kind: "cannot_start", reason: text(error) });
  process.exit(1);
}
let failing = false;
let timer;
const look = () => {
  let frames = 0;
  try {
    frames = db.pragma("wal_checkpoint(PASSIVE)")[0].log;
    if (failing) parentPort.postMessage({ kind: "recovered" });
    failing = false;
  } catch (error) {
    if (!failing) parentPort.postMessage({ kind: "failed", reason: text(error) });
    failing = true;
  }
  timer = setTimeout(look, frames >= workerData.busyFrames ? workerData.everyMs : workerData.everyMs * workerData.restFactor);
};
timer = setTimeout(look, workerData.everyMs);
parentPort.on("message", () => {
  clearTimeout(timer);
  db.close();
  parentPort.close();
});
`;

export interface CheckpointEvents {
  /** A checkpoint failed (said once until one succeeds again), or the thread failed as it stopped. */
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
      workerData: { path, everyMs, busyFrames, restFactor, driver: driverPath() },
      // Nothing of this process's own flags (a loader a test runs under, say): the thread needs only the driver.
      execArgv: [],
    });
    // It never keeps a process alive on its own: a process that ends without closing its store leaves the log to
    // the store's next opening, which recovers it.
    this.worker.unref();
    /** Why the thread ended, when it said so or failed. */
    let failure: string | undefined;
    this.worker.on("message", (said: ThreadSays) => {
      switch (said.kind) {
        case "cannot_start":
          failure = said.reason;
          break;
        case "failed":
          events.failed(`a checkpoint of ${path} failed: ${said.reason}`);
          break;
        case "recovered":
          events.recovered();
          break;
        default: {
          const unknown: never = said;
          events.failed(`the checkpoint thread of ${path} said ${JSON.stringify(unknown)}`);
        }
      }
    });
    this.worker.on("error", (error: unknown) => {
      failure = error instanceof Error ? error.message : String(error);
    });
    this.ended = new Promise((resolve) => {
      this.worker.once("exit", (code) => {
        const why = failure ?? `exit code ${code}`;
        if (!this.stopping) events.gone(`the checkpoint thread of ${path} ended (${why})`);
        else if (failure !== undefined)
          events.failed(`the checkpoint thread of ${path} failed as it stopped: ${why}`);
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
