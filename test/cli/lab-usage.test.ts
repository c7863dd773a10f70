import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { mesh } from "../support/cli.js";
import { tempDir } from "../support/tmp.js";

describe("mesh lab: bad usage exits 2 with one clear line and writes nothing", () => {
  const dir = tempDir("mesh-lab-usage-");
  after(() => dir.remove());

  const cases: ReadonlyArray<[string, string[], RegExp]> = [
    ["no --nodes", ["lab"], /required option '--nodes <n>' not specified/],
    ["--nodes 0", ["lab", "--nodes", "0"], /--nodes: "0" is not a whole number from 1 to 100000/],
    ["--nodes negative", ["lab", "--nodes=-5"], /--nodes: "-5" is not a whole number/],
    ["--nodes a fraction", ["lab", "--nodes", "1.5"], /--nodes: "1.5" is not a whole number/],
    ["--nodes a word", ["lab", "--nodes", "many"], /--nodes: "many" is not a whole number/],
    ["--nodes too many", ["lab", "--nodes", "100001"], /--nodes: "100001" is not a whole number/],
    ["a bad alive interval", ["lab", "--nodes", "3", "--alive-every", "often"], /--alive-every: "often"/],
    ["a bad connection mode", ["lab", "--nodes", "3", "--connections", "many"], /--connections: "many"/],
    ["a prefix that makes no node names", ["lab", "--nodes", "3", "--prefix", "Lab"], /--prefix: "Lab"/],
  ];

  for (const [what, args, expected] of cases) {
    test(`lab usage — ${what}`, async () => {
      const data = join(dir.path, what.replaceAll(" ", "-"));
      const run = await mesh(["--data", data, ...args]);
      assert.equal(run.code, 2, `${run.stdout}${run.stderr}`);
      assert.match(run.stderr, expected);
      assert.equal(run.stderr.trimEnd().split("\n").length, 1, `one line, got: ${run.stderr}`);
      assert.equal(run.stdout, "");
      assert.equal(existsSync(data), false, "nothing is written");
    });
  }
});
