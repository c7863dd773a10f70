import assert from "node:assert/strict";
import { test } from "node:test";
import { Metrics } from "../../src/control/metrics.js";

test("metrics — gauges are read when scraped, counters only rise, the text is Prometheus's", async () => {
  const metrics = new Metrics();
  let held = 0;
  metrics.gauge("mesh_lease_held", "1 while held", () => held);
  const handled = metrics.counter("mesh_control_messages_total", "messages taken");
  handled();
  handled(2);
  held = 1;
  assert.equal(
    metrics.text(),
    "# HELP mesh_lease_held 1 while held\n# TYPE mesh_lease_held gauge\nmesh_lease_held 1\n" +
      "# HELP mesh_control_messages_total messages taken\n# TYPE mesh_control_messages_total counter\n" +
      "mesh_control_messages_total 3\n",
  );
  assert.throws(() => metrics.gauge("mesh_lease_held", "again", () => 0), /defined twice/);

  const server = await metrics.listen("127.0.0.1", 0);
  try {
    const scraped = await fetch(server.url);
    assert.equal(scraped.status, 200);
    assert.match(await scraped.text(), /^mesh_control_messages_total 3$/m);
    const elsewhere = await fetch(server.url.replace("/metrics", "/other"));
    assert.equal(elsewhere.status, 404);
    await elsewhere.text();
  } finally {
    await server.close();
  }
});

test("metrics — a port already taken is a clear error", async () => {
  const first = await new Metrics().listen("127.0.0.1", 0);
  try {
    const port = Number(new URL(first.url).port);
    await assert.rejects(new Metrics().listen("127.0.0.1", port), /cannot serve metrics on 127\.0\.0\.1:\d+/);
  } finally {
    await first.close();
  }
});
