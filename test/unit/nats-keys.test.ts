/**
 * NATS keys derived by node:crypto: the same public nkeys and signatures as the client library's pure-JS pairs,
 * which take milliseconds per derivation.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { createAccount, createOperator, createUser, fromPublic, fromSeed } from "@nats-io/nkeys";
import { fastSigner, newUserKey } from "../../src/bus/nats/authority.js";

test("nats keys — the nkeys from node:crypto are the library's own, for users, accounts and operators", () => {
  for (const create of [createUser, createAccount, createOperator]) {
    for (let i = 0; i < 20; i++) {
      const pair = create();
      assert.equal(fastSigner(pair).getPublicKey(), pair.getPublicKey());
      assert.deepEqual(fastSigner(pair).getPrivateKey(), pair.getPrivateKey());
    }
  }
});

test("nats keys — a fresh user key's public half matches its seed; the fast signer's signatures verify", () => {
  for (let i = 0; i < 20; i++) {
    const key = newUserKey();
    assert.match(key.publicKey, /^U[A-Z2-7]{55}$/);
    assert.match(key.seed, /^SU[A-Z2-7]{56}$/);
    const fromItsSeed = fromSeed(new TextEncoder().encode(key.seed));
    assert.equal(key.publicKey, fromItsSeed.getPublicKey());
    const signed = new TextEncoder().encode(`nonce-${i}`);
    assert.ok(fromPublic(key.publicKey).verify(signed, fastSigner(fromItsSeed).sign(signed)));
  }
  const pair = createUser();
  const signer = fastSigner(pair);
  assert.equal(signer.getPublicKey(), pair.getPublicKey());
  assert.deepEqual(signer.getPrivateKey(), pair.getPrivateKey());
  const message = new TextEncoder().encode("nonce-1234");
  const signature = signer.sign(message);
  assert.ok(fromPublic(pair.getPublicKey()).verify(message, signature));
  assert.ok(!fromPublic(createUser().getPublicKey()).verify(message, signature), "another key's check fails");
});
