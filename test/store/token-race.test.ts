import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Worker } from "node:worker_threads";
import { issueToken } from "../../src/control/tokens.js";
import { decodeToken } from "../../src/link/index.js";
import { openStore } from "../../src/store/index.js";
import { storeBackends } from "../support/stores.js";

const contenders = 24;
const fingerprint = `SHA256:${"A".repeat(43)}`;

for (const backend of storeBackends) {
  describe(`token race (${backend.name})`, () => {
    test(`token race — ${contenders} concurrent spends of one token on separate connections: exactly one wins`, async () => {
      const location = await backend.fresh();
      try {
        const store = await openStore(location.url, { historyLimit: 10 });
        const issued = await issueToken(store, {
          node: "race-1",
          ttlMs: 60_000,
          fingerprint,
          now: new Date(),
        });
        await store.close();
        const { id, secret } = decodeToken(issued.token);

        // Slot 0 is the start signal, slot 1 counts contenders ready with an open connection.
        const startLine = new SharedArrayBuffer(8);
        const flags = new Int32Array(startLine);
        const workers = Array.from(
          { length: contenders },
          () =>
            new Worker(new URL("../support/spend-worker.mjs", import.meta.url), {
              workerData: {
                url: location.url,
                id,
                secret,
                node: "race-1",
                startLine,
              },
            }),
        );
        const outcomes = workers.map(
          (worker) =>
            new Promise<string>((resolve, reject) => {
              worker.once("message", (message: string) => resolve(message));
              worker.once("error", reject);
              worker.once("exit", (code) =>
                reject(new Error(`a contender ended (${code}) without an outcome`)),
              );
            }),
        );
        // A contender that fails before the start line (its store would not open) ends the race at once, with its
        // error: the others, waiting at the line, would otherwise wait for it until the test's time ran out.
        let failure: { error: unknown } | undefined;
        for (const outcome of outcomes) outcome.catch((error: unknown) => (failure ??= { error }));
        while (Atomics.load(flags, 1) < contenders && failure === undefined)
          await new Promise((r) => setTimeout(r, 10));
        Atomics.store(flags, 0, 1);
        Atomics.notify(flags, 0);
        if (failure !== undefined) {
          await Promise.all(workers.map((worker) => worker.terminate()));
          throw failure.error;
        }
        const results = await Promise.all(outcomes);

        assert.equal(results.filter((r) => r === "won").length, 1, results.join(", "));
        assert.deepEqual(
          new Set(results.filter((r) => r !== "won")),
          new Set(["refused:spent"]),
          "every loser is refused because the token is spent",
        );
        const after = await openStore(location.url, { historyLimit: 10 });
        try {
          assert.notEqual((await after.tokens.find(id))?.spentAt, null);
          const spentEvents = (await after.events.list({ limit: 100 })).filter(
            (e) => e.kind === "token.spent",
          );
          assert.equal(spentEvents.length, 1);
        } finally {
          await after.close();
        }
      } finally {
        await location.cleanup();
      }
    });
  });
}
