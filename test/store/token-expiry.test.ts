/**
 * The moment the control plane arms its token sweep for (RabbitMQ accounts do not expire by themselves): the
 * earliest expiry among tokens that still carry a usable broker identity, on SQLite and on PostgreSQL.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { Store } from "../../src/store/index.js";
import { storeBackends, freshStoreForSuite } from "../support/stores.js";

const t0 = new Date("2026-03-01T12:00:00.000Z");
const at = (ms: number) => new Date(t0.getTime() + ms);

for (const backend of storeBackends) {
  describe(`token expiry (${backend.name})`, () => {
    let store: Store;
    freshStoreForSuite(backend, { historyLimit: 5 }, (opened) => (store = opened));

    let issued = 0;
    const issue = async (node: string, expiresInMs: number, brokerUser: string | null = `U-${node}`) => {
      issued += 1;
      const id = `tok_${issued.toString(16).padStart(12, "0")}`;
      await store.tokens.issue({
        id,
        node,
        secretHash: "00",
        createdAt: t0.toISOString(),
        expiresAt: at(expiresInMs).toISOString(),
      });
      if (brokerUser !== null)
        await store.tokens.setBrokerCredential(id, JSON.stringify({ user: brokerUser }));
      return id;
    };

    test("token expiry — the next is the earliest among valid tokens with a broker identity; spent, revoked, expired and broker-less ones do not count", async () => {
      assert.equal(await store.tokens.nextExpiry(t0), undefined, "no token, no expiry");
      await issue("later-1", 90_000);
      const spent = await issue("spent-1", 10_000);
      const revoked = await issue("revoked-1", 20_000);
      await issue("no-broker-1", 30_000, null);
      await issue("next-1", 40_000);
      assert.equal(await store.tokens.spend(spent, at(1000)), true);
      assert.equal(await store.tokens.revoke(revoked, at(1000)), true);

      assert.equal(await store.tokens.nextExpiry(at(2000)), at(40_000).toISOString());
      // At the very moment of its expiry a token is expired: the next one is the one after it.
      assert.equal(await store.tokens.nextExpiry(at(40_000)), at(90_000).toISOString());
      assert.equal(await store.tokens.nextExpiry(at(90_000)), undefined);
    });
  });
}
