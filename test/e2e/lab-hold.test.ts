/**
 * A held lab (`Lab.hold`, what the bench sends a roll-out to so that the simulated fleet does not share the cores
 * with it): what the broker sends waits (a shared connection stops reading it), and no node applies anything until
 * the lab is let go; then each applies what it was sent, in the order it was sent. A lab not held beside it, sent
 * the same declarations, shows that they went out meanwhile.
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

  test("lab held — two declarations sent to every node wait; let go, each node applies both, in order", async () => {
    const applied = new Map<string, number[]>();
    const labOf = (prefix: string, nodes: number) =>
      new Lab({
        nodes,
        prefix,
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
    const lab = labOf("held", 6);
    // Not held: the declarations reach it as they reach any node, so the held nodes' have been sent by then.
    const witness = labOf("witness", 1);
    const options = compileMeshOptions({ dataDir: data, flags: {}, env: {} });
    const store = await openStore(options.storeUrl, { historyLimit: options.historyLimit });
    try {
      const identities = openIdentities(data, { url: suite.broker.url });
      const fingerprint = loadOrCreateSigningKey(join(data, "keys")).fingerprint;
      try {
        for (const one of [lab, witness]) {
          const joins = await one.join(await one.issueTokens(store, identities, fingerprint, 600_000));
          assert.deepEqual(
            joins.filter((outcome) => outcome.error !== undefined),
            [],
          );
          await one.start();
        }
      } finally {
        await identities.close();
      }
      const [witnessNode] = witness.names;
      assert.ok(witnessNode !== undefined);

      lab.hold();
      for (const round of [1, 2]) {
        const file = join(dir.path, `held-${round}.yaml`);
        writeFileSync(file, `files:\n  - path: /etc/held\n    content: round ${round}\n`);
        const run = await cli(["declare", "--all", "-f", file]);
        assert.equal(run.code, 0, run.stderr);
      }
      // Both went out: the node not held applied them, and had its reports taken. The held nodes applied nothing.
      await eventually("the node not held to apply both declarations and have its reports taken", () =>
        applied.get(witnessNode)?.length === 2 && witness.status().reporting === 1 ? true : undefined,
      );
      assert.deepEqual(
        lab.names.filter((node) => applied.has(node)),
        [],
      );
      // Their connections read nothing meanwhile: no delivery reached a node to wait there.
      assert.equal(lab.heldNodes(), 0);

      lab.release();
      await eventually("every node to apply both declarations", () =>
        lab.names.every((node) => applied.get(node)?.length === 2) ? true : undefined,
      );
      for (const node of lab.names) assert.deepEqual(applied.get(node), [1, 2], node);
      assert.equal(lab.heldNodes(), 0);
    } finally {
      await lab.stop();
      await witness.stop();
      await store.close();
    }
  });
});
