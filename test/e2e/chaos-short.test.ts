/**
 * The fault suite's short form (`npm run chaos -- --short`): a small lab fleet under `mesh up` through each fault —
 * the broker paused and killed, the control plane killed, PostgreSQL cut off, RabbitMQ's application stopped — and
 * for each, every node back, no report lost, nobody called out of touch for the mesh's own outage, and a
 * declaration after recovery held everywhere. The times are printed, never asserted: this machine may be busy.
 */
import assert from "node:assert/strict";
import { before, describe, test } from "node:test";
import { faultNames, parseChaosArgs } from "../../chaos/args.js";
import type { FaultResult } from "../../chaos/suite.js";
import { runChaos } from "../../chaos/suite.js";
import { formatChaosTable } from "../../chaos/table.js";

describe("chaos, the short form", () => {
  let results: FaultResult[] = [];

  before(
    async () => {
      results = await runChaos(parseChaosArgs(["--short"]), (line) => process.stderr.write(`${line}\n`));
      process.stderr.write(formatChaosTable(results));
    },
    // Five faults with pauses of 15 to 20 s and the recoveries after them, on a machine that may be busy.
    { timeout: 20 * 60_000 },
  );

  test("chaos — every fault was run", () => {
    assert.deepEqual(
      results.map((result) => result.fault),
      [...faultNames],
    );
  });

  for (const fault of faultNames) {
    test(`chaos — ${fault}: every node back, no report lost, no false out-of-touch, a declaration converges`, () => {
      const result = results.find((one) => one.fault === fault);
      assert.ok(result !== undefined, `${fault} was not run`);
      assert.deepEqual(result.failures, [], JSON.stringify(result, null, 2));
      assert.ok(result.all_here_s !== null, "every node was here again");
      assert.equal(result.reports_lost, 0);
      assert.equal(result.false_out_of_touch, 0);
      assert.deepEqual(result.out_of_touch_seen, []);
      assert.ok(result.convergence_s !== null, "the declaration after recovery reached every node");
    });
  }
});
