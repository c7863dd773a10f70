/**
 * `mesh serve` on an operator-mode nats-server of its own, for one suite: both started on a fresh data dir before its
 * tests, and after them stopped (the suite's own processes first, by `stopFirst`) and the dir removed.
 */
import { join } from "node:path";
import { after, before } from "node:test";
import type { OperatorBroker } from "./operator-broker.js";
import { startOperatorBroker } from "./operator-broker.js";
import type { Running } from "./processes.js";
import { eventually, startBin } from "./processes.js";
import { tempDir } from "./tmp.js";

export interface ServedSuite {
  readonly dir: { path: string; remove(): void };
  /** The mesh's data dir, inside `dir`. */
  readonly data: string;
  /** Once the suite's `before` has run. */
  readonly broker: OperatorBroker;
  /** Once the suite's `before` has run. */
  readonly serve: Running;
}

export function serveForSuite(
  prefix: string,
  stopFirst: () => Promise<void> = () => Promise.resolve(),
): ServedSuite {
  const dir = tempDir(prefix);
  const data = join(dir.path, "data");
  let broker: OperatorBroker | undefined;
  let serve: Running | undefined;
  before(async () => {
    const started = await startOperatorBroker(data, dir.path);
    broker = started;
    const serving = startBin("mesh", ["--data", data, "serve", "--broker", started.url]);
    serve = serving;
    await eventually("serve to start", () => (/control\.serving/.test(serving.stderr()) ? true : undefined));
  });
  after(async () => {
    await stopFirst();
    await serve?.stop();
    await broker?.stop();
    dir.remove();
  });
  return {
    dir,
    data,
    get broker() {
      if (broker === undefined) throw new Error("the suite's broker is not started yet");
      return broker;
    },
    get serve() {
      if (serve === undefined) throw new Error("the suite's mesh serve is not started yet");
      return serve;
    },
  };
}
