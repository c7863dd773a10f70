import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import type { FleetNode } from "../../src/control/allot.js";
import { allocate, hostRange, inNetwork, overlayItems } from "../../src/control/overlay.js";
import { outlookOf } from "../../src/control/plans.js";
import { planSchema } from "../../src/link/index.js";

const key = (n: number) => Buffer.alloc(32, n).toString("base64");
const node = (name: string, drivers: string[], labels: Record<string, string> = {}): FleetNode => ({
  name,
  profile: { cpu: 2, memory_mb: 2048, labels, drivers },
});

test("overlay — addresses: the lowest free hosts, never the network or broadcast address, never one taken", () => {
  assert.deepEqual(hostRange("10.99.0.0/30"), {
    first: toNumber("10.99.0.1"),
    last: toNumber("10.99.0.2"),
    prefix: 30,
  });
  const { given, short } = allocate("10.99.0.0/29", new Set(["10.99.0.1", "10.99.0.3"]), [
    "a",
    "b",
    "c",
    "d",
    "e",
  ]);
  assert.deepEqual(Object.fromEntries(given), {
    a: "10.99.0.2",
    b: "10.99.0.4",
    c: "10.99.0.5",
    d: "10.99.0.6",
  });
  assert.deepEqual(short, ["e"], "a /29 has six hosts, two were taken");
  assert.equal(inNetwork("10.99.0.6", "10.99.0.0/29"), true);
  assert.equal(inNetwork("10.99.0.7", "10.99.0.0/29"), false, "the broadcast address");
  assert.equal(inNetwork("10.98.0.6", "10.99.0.0/29"), false);
});

test("overlay — property: addresses given over time are all distinct and inside the network", () => {
  fc.assert(
    fc.property(fc.array(fc.integer({ min: 1, max: 20 }), { minLength: 1, maxLength: 10 }), (waves) => {
      const taken = new Set<string>();
      let names = 0;
      for (const size of waves) {
        const wanting = Array.from({ length: size }, () => `n-${names++}`);
        const { given } = allocate("10.99.0.0/24", taken, wanting);
        for (const address of given.values()) {
          assert.equal(taken.has(address), false);
          assert.equal(inNetwork(address, "10.99.0.0/24"), true);
          taken.add(address);
        }
      }
    }),
  );
});

test("overlay — each member holds every other member as a peer, with its key, address and endpoint", () => {
  const overlay = { cidr: "10.99.0.0/24", port: 51820, interface: "mesh0" };
  const items = overlayItems(overlay, [
    { node: "b", address: "10.99.0.2", publicKey: key(2), endpoint: "192.0.2.2:51820" },
    { node: "a", address: "10.99.0.1", publicKey: key(1), endpoint: undefined },
  ]);
  assert.deepEqual(items.get("a"), {
    id: "overlay:mesh0",
    type: "overlay",
    interface: "mesh0",
    address: "10.99.0.1/24",
    listen_port: 51820,
    peers: [{ node: "b", public_key: key(2), allowed_ips: ["10.99.0.2/32"], endpoint: "192.0.2.2:51820" }],
  });
  assert.deepEqual(items.get("b")?.type === "overlay" ? items.get("b") : undefined, {
    id: "overlay:mesh0",
    type: "overlay",
    interface: "mesh0",
    address: "10.99.0.2/24",
    listen_port: 51820,
    peers: [{ node: "a", public_key: key(1), allowed_ips: ["10.99.0.1/32"] }],
  });
});

test("overlay — in a plan: only nodes whose agent can apply it; one without an address yet waits, as a condition", () => {
  const plan = planSchema.parse({ units: [], overlay: { cidr: "10.99.0.0/24" } });
  const fleet = {
    nodes: [
      node("a", ["file", "overlay"], { "overlay-endpoint": "192.0.2.1:51820" }),
      node("b", ["file", "overlay"]),
      node("c", ["file"]),
      node("d", ["file", "overlay"]),
    ],
    away: new Map(),
    overlayKeys: new Map([
      ["a", key(1)],
      ["b", key(2)],
      ["c", key(3)],
      ["d", key(4)],
    ]),
    addresses: new Map([
      ["a", "10.99.0.1"],
      ["b", "10.99.0.2"],
    ]),
  };
  const outlook = outlookOf(plan, fleet);
  const itemOf = (name: string) =>
    outlook.compositions.get(name)?.items.find((item) => item.type === "overlay");
  const a = itemOf("a");
  assert.ok(a?.type === "overlay");
  assert.deepEqual(
    a.peers.map((peer) => peer.node),
    ["b"],
  );
  assert.equal(itemOf("c"), undefined, "no overlay driver");
  assert.equal(itemOf("d"), undefined, "no address yet");
  assert.deepEqual(outlook.compositions.get("a")?.units, ["overlay"]);
  assert.deepEqual(
    outlook.conditions.map((condition) => condition.reason),
    ["overlay: 1 node(s) have no address in 10.99.0.0/24 yet (d)"],
  );
});

function toNumber(address: string): number {
  return address.split(".").reduce((sum, part) => sum * 256 + Number(part), 0);
}
