import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { BenchUsageError, parseBenchArgs } from "../../bench/args.js";
import { roundFloorMs } from "../../bench/mesh.js";
import { formatFigureTable, formatNumber, ratioOf } from "../../bench/table.js";

describe("bench arguments and table", () => {
  test("bench args — defaults: 1,000 nodes, every part, failover shortened inside the table", () => {
    const options = parseBenchArgs([]);
    assert.equal(options.nodes, 1000);
    assert.deepEqual(options.parts, [
      "enrolment",
      "steady",
      "fanout",
      "convergence",
      "plan",
      "ingest",
      "failover",
    ]);
    assert.equal(options.failover.shortened, true);
    assert.equal(options.failover.trials, 3);
    assert.equal(options.joinConcurrency, 20);
    assert.equal(options.rounds, 3);
    assert.equal(options.ingestTrials, 3);
  });

  test("bench args — ingest drains seven times on RabbitMQ unless told, whose drains swing the most", () => {
    assert.equal(parseBenchArgs(["--broker", "amqp"]).ingestTrials, 7);
    assert.equal(parseBenchArgs(["--broker", "amqp", "--ingest-trials", "3"]).ingestTrials, 3);
    assert.equal(parseBenchArgs(["--ingest-trials", "5"]).ingestTrials, 5);
    assert.throws(() => parseBenchArgs(["--ingest-trials", "0"]), /--ingest-trials: "0"/);
  });

  test("bench args — the ingest backlog is sent node by node unless told to send it in turns", () => {
    assert.equal(parseBenchArgs([]).ingestOrder, "node");
    assert.equal(parseBenchArgs(["--ingest-order", "turns"]).ingestOrder, "turns");
    assert.throws(
      () => parseBenchArgs(["--ingest-order", "random"]),
      (error: unknown) =>
        error instanceof BenchUsageError &&
        /--ingest-order: "random" is neither node nor turns/.test(error.message),
    );
  });

  test("bench args — --only keeps the table's order; failover alone runs its full trials", () => {
    assert.deepEqual(parseBenchArgs(["--only", "ingest,fanout"]).parts, ["fanout", "ingest"]);
    const alone = parseBenchArgs(["--only", "failover"]);
    assert.equal(alone.failover.shortened, false);
    assert.deepEqual([alone.failover.trials, alone.failover.ttl], [10, "15s"]);
    assert.equal(parseBenchArgs(["--trials", "5"]).failover.trials, 5);
    assert.equal(parseBenchArgs(["--nodes", "10000"]).nodes, 10000);
    assert.equal(parseBenchArgs(["--rounds", "5"]).rounds, 5);
  });

  test("bench args — bad values are refused with the flag's name", () => {
    assert.throws(() => parseBenchArgs(["--only", "ingest,speed"]), BenchUsageError);
    assert.throws(() => parseBenchArgs(["--nodes", "0"]), /--nodes: "0"/);
    assert.throws(() => parseBenchArgs(["--nodes", "ten"]), /--nodes: "ten"/);
    assert.throws(() => parseBenchArgs(["--bogus"]), BenchUsageError);
    assert.throws(() => parseBenchArgs(["--rounds", "0"]), /--rounds: "0"/);
  });

  test("bench table — each figure beside its baseline with their ratio", () => {
    assert.equal(formatNumber(12345.678), "12,346");
    assert.equal(formatNumber(12.345), "12.3");
    assert.equal(formatNumber(0.12345), "0.123");
    const figure = {
      part: "ingest",
      what: "rate",
      value: 500,
      unit: "msg/s",
      baseline: { value: 1000, what: "raw" },
    };
    assert.equal(ratioOf(figure), "0.50×");
    assert.equal(ratioOf({ ...figure, baseline: undefined }), "");
    const limited = {
      part: "fanout",
      what: "roll-out",
      value: 13_000,
      unit: "/s",
      limit: { value: 26_000, what: "signing, one core" },
      target: "≥ 0.5×",
    };
    assert.equal(ratioOf(limited, "limit"), "0.50×");
    assert.equal(ratioOf(limited), "");
    const table = formatFigureTable([
      figure,
      limited,
      { part: "steady", what: "RSS", value: 80, unit: "MiB" },
    ]);
    const lines = table.trimEnd().split("\n");
    assert.equal(lines.length, 4);
    assert.match(
      lines[0] ?? "",
      /^PART\s+FIGURE\s+VALUE\s+BASELINE\s+RATIO\s+LIMIT\s+OF LIMIT\s+TARGET\s+NOTE$/,
    );
    assert.match(lines[1] ?? "", /ingest\s+rate\s+500 msg\/s\s+1,000 msg\/s \(raw\)\s+0\.50×$/);
    assert.match(
      lines[2] ?? "",
      /fanout\s+roll-out\s+13,000 \/s\s+26,000 \/s \(signing, one core\)\s+0\.50×\s+≥ 0\.5×$/,
    );
    assert.match(lines[3] ?? "", /steady\s+RSS\s+80 MiB$/);
  });

  test("bench convergence — a round's floor is the fleet's and the broker's CPU over the cores, none without the broker's", () => {
    // 2.44 s of the fleet and 0.57 s of the broker on 2 cores: no round could end before 1.505 s.
    assert.equal(roundFloorMs({ declare: 0.45, serve: 1.69, fleet: 2.44, broker: 0.57 }, 2), 1505);
    assert.equal(roundFloorMs({ declare: 0.45, serve: 1.69, fleet: 2.44, broker: 0.57 }, 4), 752.5);
    // The mesh's own CPU moves nothing of it.
    assert.equal(roundFloorMs({ declare: 9, serve: 9, fleet: 1, broker: 1 }, 2), 1000);
    assert.equal(roundFloorMs({ declare: 0.45, serve: 1.69, fleet: 2.44, broker: null }, 2), undefined);
  });
});
