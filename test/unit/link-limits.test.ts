/**
 * The broker limits table (src/link/limits.ts): what its numbers must keep true whatever they are tuned to. The
 * brokers' side of each is tried in test/attacks/broker-limits.test.ts.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { decode } from "@nats-io/jwt";
import { loadOrCreateAuthority, newUserKey, userJwt } from "../../src/bus/nats/authority.js";
import { maxMessageBytes, roles } from "../../src/link/index.js";
import {
  controlQueueBacklogBytes,
  identityLimits,
  largestBrokerMessage,
  messageLimit,
  reportBacklogBytes,
  reportDuplicateWindowMs,
  reportsKeptPerNode,
  subscriptionLimit,
} from "../../src/link/limits.js";
import { tempDir } from "../support/tmp.js";

describe("broker limits table", () => {
  test("limits — the contract's largest message passes every identity's limit, with room for headers", () => {
    assert.ok(largestBrokerMessage > maxMessageBytes);
    for (const role of roles) {
      const limit = messageLimit(role);
      assert.ok(limit === undefined || limit >= maxMessageBytes, role);
    }
  });

  test("limits — a node and a token get what the agent and the join use (one subscription), and a lab one per node", () => {
    assert.ok((subscriptionLimit("node", 1) ?? 0) >= 1);
    assert.ok((subscriptionLimit("token", 1) ?? 0) >= 1);
    for (const group of [1, 50, 400]) assert.ok((subscriptionLimit("lab", group) ?? 0) >= group);
    // Small: thousands of subscriptions on one connection are what the limit is there to refuse.
    assert.ok((subscriptionLimit("node", 1) ?? Infinity) <= 16);
    assert.equal(subscriptionLimit("control", 0), undefined);
    assert.equal(identityLimits.control.messageBytes, "unlimited");
  });

  test("limits — one node's flood cannot fill the report backlog alone, so it can push out only its own reports", () => {
    assert.ok(reportsKeptPerNode >= 1);
    assert.ok(reportsKeptPerNode * largestBrokerMessage < reportBacklogBytes);
    assert.ok(controlQueueBacklogBytes >= reportBacklogBytes);
    // nats-server 2.9.10 refuses a duplicate window under 100 ms (and reads 0 as its 2-minute default).
    assert.ok(reportDuplicateWindowMs >= 100);
  });

  test("limits — a minted user JWT carries its role's limits", async () => {
    const dir = tempDir("mesh-limits-unit-");
    try {
      const authority = loadOrCreateAuthority(dir.path);
      const claims = async (grant: Parameters<typeof userJwt>[1]) =>
        decode<{ subs: number; payload: number }>(await userJwt(authority, grant)).nats;
      const key = newUserKey().publicKey;
      const node = await claims({ name: "web-1", userPublicKey: key, role: "node", node: "web-1" });
      assert.equal(node.subs, subscriptionLimit("node", 1));
      assert.equal(node.payload, largestBrokerMessage);
      const group = ["lab-1", "lab-2", "lab-3"];
      const lab = await claims({ name: "lab", userPublicKey: key, role: "lab", node: group });
      assert.equal(lab.subs, subscriptionLimit("lab", group.length));
      const control = await claims({ name: "control", userPublicKey: key, role: "control" });
      assert.equal(control.subs, -1);
      assert.equal(control.payload, -1);
    } finally {
      dir.remove();
    }
  });
});
