import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { UsageError } from "../../src/errors.js";
import { percentile, spread } from "../../src/lab/figures.js";
import { compileLabOptions, labNodeName, ownConnectionsUpTo } from "../../src/lab/options.js";

describe("lab options and figures", () => {
  test("lab options — defaults: 15 s alives, own connections up to the threshold, shared above", () => {
    const small = compileLabOptions({ nodes: "20" });
    assert.equal(small.nodes, 20);
    assert.equal(small.aliveEveryMs, 15_000);
    assert.equal(small.connections, "own");
    assert.equal(compileLabOptions({ nodes: String(ownConnectionsUpTo + 1) }).connections, "shared");
    assert.equal(compileLabOptions({ nodes: "10000", connections: "own" }).connections, "own");
    assert.equal(compileLabOptions({ nodes: "3", connections: "shared" }).connections, "shared");
  });

  test("lab options — every bad value is a usage error naming its flag", () => {
    for (const nodes of ["0", "-1", "1.5", "1e3", "", "abc", "100001"]) {
      assert.throws(
        () => compileLabOptions({ nodes }),
        (error: unknown) => {
          assert.ok(error instanceof UsageError);
          assert.match(error.message, /^--nodes: /);
          return true;
        },
      );
    }
    assert.throws(() => compileLabOptions({ nodes: "3", groupSize: "0" }), /--group-size/);
    assert.throws(() => compileLabOptions({ nodes: "3", aliveEvery: "0s" }), /--alive-every/);
    assert.throws(() => compileLabOptions({ nodes: "3", prefix: "a_b" }), /--prefix/);
    // The widest name must stay a DNS label: 57 letters, '-', 5 digits is 63; one more is too long.
    assert.ok(compileLabOptions({ nodes: "10000", prefix: "a".repeat(57) }));
    assert.throws(() => compileLabOptions({ nodes: "10000", prefix: "a".repeat(58) }), /--prefix/);
  });

  test("lab options — node names are zero-padded to the widest so they sort in order", () => {
    assert.equal(labNodeName("lab", 7, 1000), "lab-0007");
    assert.equal(labNodeName("lab", 1000, 1000), "lab-1000");
    assert.equal(labNodeName("x", 1, 9), "x-1");
  });

  test("figures — percentiles by nearest rank", () => {
    const values = Array.from({ length: 100 }, (_, i) => 100 - i); // 100 … 1, unsorted on purpose
    assert.equal(percentile(values, 50), 50);
    assert.equal(percentile(values, 99), 99);
    assert.equal(percentile(values, 100), 100);
    assert.equal(percentile([7], 50), 7);
    assert.equal(percentile([], 50), undefined);
    assert.throws(() => percentile(values, 0), RangeError);
    assert.deepEqual(spread([3, 1, 2]), { count: 3, p50: 2, p99: 3, max: 3 });
    assert.equal(spread([]), undefined);
  });
});
