/**
 * A held lab (`Lab.hold`, what the bench sends a roll-out to so that the simulated fleet does not share the cores
 * with it): the broker still delivers to every node, and no node applies anything until the lab is let go; then
 * each applies what it was sent, in the order it was sent.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { openIdentities } from "../../src/bus/index.js";
import { compileMeshOptions } from "../../src/config/options.js";
import { loadOrCreateSigningKey } from "../../src/keys/index.js";
import { Lab } from "../../src/lab/lab.js";
import { createLogger } from "../../src/log.js";
import { openStore } from "../../src/store/index.js";
import { mesh } from "../support/cli.js";
import { eventually } from "../support/processes.js";
import { serveForSuite } from "../support/serve-suite.js";

describe("lab — a held fleet", () => {
  const suite = serveForSuite("mesh-lab-hold-");
  const { dir, data } = suite;
  const cli = (args: string[]) => mesh(["--data", data, ...args]);

  test("lab held — two declarations reach every node and wait; let go, each node applies both, in order", async () => {
    const applied = new Map<string, number[]>();
    const lab = new Lab({
      nodes: 6,
      prefix: "held",
      aliveEveryMs: 60_000,
      connections: "shared",
      groupSize: 3,
      joinConcurrency: 6,
      joinTimeoutMs: 60_000,
      dataDir: data,
      log: createLogger({ level: "warn" }),
      onEvent: (node, event) => {
        if (event.kind === "applied") applied.set(node, [...(applied.get(node) ?? []), event.sequence]);
      },
    });
    const options = compileMeshOptions({ dataDir: data, flags: {}, env: {} });
    const store = await openStore(options.storeUrl, { historyLimit: options.historyLimit });
    try {
      const identities = openIdentities(data, { url: suite.broker.url });
      const tokens = await lab
        .issueTokens(store, identities, loadOrCreateSigningKey(join(data, "keys")).fingerprint, 600_000)
        .finally(() => identities.close());
      const joins = await lab.join(tokens);
      assert.deepEqual(
        joins.filter((outcome) => outcome.error !== undefined),
        [],
      );
      await lab.start();

      lab.hold();
      for (const round of [1, 2]) {
        const file = join(dir.path, `held-${round}.yaml`);
        writeFileSync(file, `files:\n  - path: /etc/held\n    content: round ${round}\n`);
        const run = await cli(["declare", "--all", "-f", file]);
        assert.equal(run.code, 0, run.stderr);
      }
      // Every node has its first declaration in hand (the second waits behind it): none is applied.
      await eventually("every node to have a delivery waiting", () =>
        lab.heldNodes() === 6 ? true : undefined,
      );
      assert.deepEqual([...applied], []);

      lab.release();
      await eventually("every node to apply both declarations", () =>
        lab.names.every((node) => applied.get(node)?.length === 2) ? true : undefined,
      );
      for (const node of lab.names) assert.deepEqual(applied.get(node), [1, 2], node);
      assert.equal(lab.heldNodes(), 0);
    } finally {
      await lab.stop();
      await store.close();
    }
  });
});
