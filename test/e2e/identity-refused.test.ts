/**
 * A node whose identity the broker refuses — retired while its agent runs, or starting again after it was retired —
 * ends `mesh-host run` with exit 3 (`identity_refused`), apart from every failure a restart may cure, so the systemd
 * unit's RestartPreventExitStatus= stops it knocking. On both brokers, each test with a fleet of its own.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { exitCodes } from "../../src/errors.js";
import type { BrokerName } from "../support/fleets.js";
import { exitWithin, fleetForTest } from "../support/fleets.js";
import { eventually } from "../support/processes.js";

for (const broker of ["nats", "amqp"] as const satisfies readonly BrokerName[]) {
  describe(`a refused identity (${broker})`, () => {
    test(`identity refused (${broker}) — a node retired while its agent runs ends it with exit 3, and so does its next start`, async (t) => {
      const fleet = await fleetForTest(t, broker);
      const state = join(fleet.dir, "gone-3");
      const root = join(fleet.dir, "gone-3-root");
      mkdirSync(root);
      const joined = await fleet.host(["join", await fleet.issue("gone-3"), "--state", state]);
      assert.equal(joined.code, 0, joined.stderr);
      const agent = fleet.runAgent(state, root, t);
      await eventually("gone-3 to be here", async () =>
        (await fleet.show("gone-3")).liveness === "here" ? true : undefined,
      );

      const retired = await fleet.cli(["node", "retire", "gone-3"]);
      assert.equal(retired.code, 0, retired.stderr);
      assert.equal(await exitWithin(agent), exitCodes.identityRefused, agent.stderr());
      assert.match(
        agent.stderr(),
        /refused this identity.*node gone-3 was retired, or joined again elsewhere/,
      );

      // The machine reboots and the agent starts again: the broker refuses it at the first connection.
      const restarted = fleet.runAgent(state, root, t);
      assert.equal(await exitWithin(restarted), exitCodes.identityRefused, restarted.stderr());
      assert.match(restarted.stderr(), /refused this identity/);
      assert.equal(fleet.up.child.exitCode, null, "the control plane carries on");
    });
  });
}
