/** The acting control plane's metrics read where it stands on the lease when scraped, and count the control queue. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { ControlMetrics } from "../../src/control/control-metrics.js";
import { createLogger } from "../../src/log.js";

test("control metrics — lease gauges read when scraped, counters rise", () => {
  let held = true;
  let epoch: number | undefined = 7;
  let withoutEpoch = false;
  const metrics = new ControlMetrics({
    held: () => held,
    epoch: () => epoch,
    withoutEpoch: () => withoutEpoch,
  });
  metrics.handled(3);
  metrics.handedBack();
  metrics.receiptsSent(2);
  let text = metrics.metrics.text();
  assert.match(text, /^mesh_lease_held 1$/m);
  assert.match(text, /^mesh_lease_epoch 7$/m);
  assert.match(text, /^mesh_lease_no_epoch 0$/m);
  assert.match(text, /^mesh_control_messages_total 3$/m);
  assert.match(text, /^mesh_control_messages_handed_back_total 1$/m);
  assert.match(text, /^mesh_receipts_sent_total 2$/m);
  [held, epoch, withoutEpoch] = [false, undefined, true];
  text = metrics.metrics.text();
  assert.match(text, /^mesh_lease_held 0$/m);
  assert.match(text, /^mesh_lease_epoch 0$/m);
  assert.match(text, /^mesh_lease_no_epoch 1$/m);
});

test("control metrics — served only where the options say", async () => {
  const metrics = new ControlMetrics({ held: () => true, epoch: () => 1, withoutEpoch: () => false });
  const log = createLogger({ level: "error" });
  assert.equal(await metrics.serve(undefined, log), undefined);
  const server = await metrics.serve({ host: "127.0.0.1", port: 0 }, log);
  try {
    const text = await (await fetch(server?.url ?? "")).text();
    assert.match(text, /^mesh_lease_held 1$/m);
  } finally {
    await server?.close();
  }
});
