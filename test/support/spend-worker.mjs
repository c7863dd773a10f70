/**
 * One contender in the token race: opens its own store connection, waits at the start line, spends the token
 * and reports whether it won. It runs the built code (npm test builds first), as a worker thread cannot load
 * TypeScript without compiling the whole graph again.
 */
import { parentPort, workerData } from "node:worker_threads";
import { spendToken } from "../../dist/control/tokens.js";
import { openStore } from "../../dist/store/index.js";

const store = await openStore(workerData.url, { historyLimit: 10 });
const startLine = new Int32Array(workerData.startLine);
Atomics.add(startLine, 1, 1);
Atomics.wait(startLine, 0, 0);
let outcome;
try {
  await spendToken(
    store,
    { id: workerData.id, secret: workerData.secret, node: workerData.node },
    new Date(),
  );
  outcome = "won";
} catch (error) {
  if (error?.code !== "token_refused") throw error;
  outcome = `refused:${error.reason}`;
} finally {
  await store.close();
}
parentPort.postMessage(outcome);
