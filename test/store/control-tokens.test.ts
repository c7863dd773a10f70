import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { hashSecret, issueToken, revokeToken, spendToken } from "../../src/control/tokens.js";
import { TokenRefused } from "../../src/errors.js";
import { decodeToken } from "../../src/link/index.js";
import type { Store } from "../../src/store/index.js";
import { storeBackends, freshStoreForSuite } from "../support/stores.js";

const fingerprint = `SHA256:${"B".repeat(43)}`;
const t0 = new Date("2026-03-01T12:00:00.000Z");
const later = (ms: number) => new Date(t0.getTime() + ms);

for (const backend of storeBackends) {
  describe(`tokens (${backend.name})`, () => {
    let store: Store;
    freshStoreForSuite(backend, { historyLimit: 5 }, (opened) => (store = opened));

    const issue = async (node: string, ttlMs = 3_600_000) => {
      const issued = await issueToken(store, { node, ttlMs, fingerprint, now: t0 });
      return { issued, content: decodeToken(issued.token) };
    };

    test("tokens — the secret is 256 random bits, shown once, stored only as its hash", async () => {
      const { issued, content } = await issue("sec-1");
      assert.equal(Buffer.from(content.secret, "base64url").length, 32);
      assert.equal(content.fingerprint, fingerprint);
      const row = await store.tokens.find(issued.id);
      assert.equal(row?.secretHash, hashSecret(content.secret));
      assert.ok(!JSON.stringify(row).includes(content.secret));
      const other = await issue("sec-1");
      assert.notEqual(other.content.secret, content.secret);
    });

    test("tokens — a valid token is spent once for its own node", async () => {
      const { content } = await issue("ok-1");
      const spent = await spendToken(
        store,
        { id: content.id, secret: content.secret, node: "ok-1" },
        later(1000),
      );
      assert.equal(spent.node, "ok-1");
      const events = await store.events.list({ limit: 50, node: "ok-1" });
      assert.deepEqual(
        events.map((e) => e.kind),
        ["token.issued", "token.spent"],
      );
    });

    test("tokens — every refusal reads the same; the real reason goes only to the audit trail", async () => {
      const refusals: Array<[string, () => Promise<unknown>]> = [];
      const unknown = await issue("ref-1");
      refusals.push([
        "unknown",
        () =>
          spendToken(
            store,
            { id: "tok_000000000000", secret: unknown.content.secret, node: "ref-1" },
            later(1),
          ),
      ]);
      refusals.push([
        "unknown",
        () => spendToken(store, { id: unknown.content.id, secret: "A".repeat(43), node: "ref-1" }, later(1)), // wrong secret
      ]);
      const spent = await issue("ref-2");
      await spendToken(
        store,
        { id: spent.content.id, secret: spent.content.secret, node: "ref-2" },
        later(1),
      );
      refusals.push([
        "spent",
        () =>
          spendToken(store, { id: spent.content.id, secret: spent.content.secret, node: "ref-2" }, later(2)),
      ]);
      const expired = await issue("ref-3", 60_000);
      refusals.push([
        "expired",
        () =>
          spendToken(
            store,
            { id: expired.content.id, secret: expired.content.secret, node: "ref-3" },
            later(60_000),
          ),
      ]);
      const revoked = await issue("ref-4");
      assert.equal(await revokeToken(store, revoked.content.id, later(1)), "revoked");
      refusals.push([
        "revoked",
        () =>
          spendToken(
            store,
            { id: revoked.content.id, secret: revoked.content.secret, node: "ref-4" },
            later(2),
          ),
      ]);
      const wrongNode = await issue("ref-5");
      refusals.push([
        "wrong_node",
        () =>
          spendToken(
            store,
            { id: wrongNode.content.id, secret: wrongNode.content.secret, node: "ref-6" },
            later(1),
          ),
      ]);

      const texts = new Set<string>();
      for (const [reason, attempt] of refusals) {
        const error = await attempt().then(
          () => assert.fail(`a ${reason} token was accepted`),
          (e: unknown) => e,
        );
        assert.ok(error instanceof TokenRefused, String(error));
        assert.equal(error.reason, reason);
        texts.add(error.message);
      }
      assert.deepEqual([...texts], [TokenRefused.text]);

      const audit = (await store.events.list({ limit: 100 })).filter((e) => e.kind === "token.refused");
      assert.deepEqual(
        audit.map((e) => e.detail.reason),
        refusals.map(([reason]) => reason),
      );
      // The wrong-node attempt did not use the token up.
      const stillValid = await store.tokens.find(wrongNode.content.id);
      assert.equal(stillValid?.spentAt, null);
    });

    test("tokens — revoking reports unknown ids and tokens that already ended", async () => {
      const { content } = await issue("rev-1");
      assert.equal(await revokeToken(store, "tok_aaaaaaaaaaaa", later(1)), "unknown");
      assert.equal(await revokeToken(store, content.id, later(1)), "revoked");
      assert.equal(await revokeToken(store, content.id, later(2)), "already_ended");
    });

    test("tokens — a name that is not a DNS label is refused before anything is written", async () => {
      await assert.rejects(
        issueToken(store, { node: "Bad_Name", ttlMs: 1000, fingerprint, now: t0 }),
        /node name/,
      );
      assert.equal(await store.nodes.get("Bad_Name"), undefined);
    });
  });
}
