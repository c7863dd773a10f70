/** The control plane's periods and the token retention come from the compiled options, each with its default. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, test } from "node:test";
import { compileMeshOptions, controlPeriods } from "../../src/config/options.js";
import { tempDir } from "../support/tmp.js";

const dir = tempDir("mesh-config-periods-");
after(() => dir.remove());

/** The periods of options compiled with this out-of-touch threshold, in a data dir of their own. */
const periodsWith = (dataDir: string, threshold: string) =>
  compileMeshOptions({ dataDir: join(dir.path, dataDir), flags: { out_of_touch_after: threshold }, env: {} })
    .periods;

test("config — liveness is checked every quarter of the threshold, between 250 ms and 5 s", () => {
  assert.equal(controlPeriods(45_000).livenessEveryMs, 5000);
  assert.equal(controlPeriods(4000).livenessEveryMs, 1000);
  assert.equal(controlPeriods(500).livenessEveryMs, 250);
  assert.equal(periodsWith("a", "2s").livenessEveryMs, 500);
});

test("config — receipts go out every twelfth of the threshold, between 250 ms and 1 s", () => {
  assert.equal(controlPeriods(45_000).receiptsEveryMs, 1000);
  assert.equal(controlPeriods(6000).receiptsEveryMs, 500);
  assert.equal(controlPeriods(1000).receiptsEveryMs, 250);
  assert.equal(periodsWith("e", "9s").receiptsEveryMs, 750);
});

test("config — the token retention is 7 days unless set", () => {
  const options = compileMeshOptions({ dataDir: join(dir.path, "b"), flags: {}, env: {} });
  assert.equal(options.tokenKeepForMs, 7 * 86_400_000);
  const set = compileMeshOptions({
    dataDir: join(dir.path, "c"),
    flags: {},
    env: { MESH_TOKEN_KEEP_FOR: "1d" },
  });
  assert.equal(set.tokenKeepForMs, 86_400_000);
  assert.throws(
    () =>
      compileMeshOptions({ dataDir: join(dir.path, "d"), flags: {}, env: { MESH_TOKEN_KEEP_FOR: "soon" } }),
    /MESH_TOKEN_KEEP_FOR/,
  );
});
