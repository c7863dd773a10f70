/**
 * RabbitMQ token accounts against the machine's broker, in a scratch vhost: the sweep deletes the accounts of
 * tokens that ended and never one issued while it runs.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { ControlIdentities } from "../../src/bus/index.js";
import { openIdentities } from "../../src/bus/index.js";
import { tokensToKeep } from "../../src/control/revocations.js";
import { issueToken } from "../../src/control/tokens.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { scratchVhost } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

describe("RabbitMQ token accounts", () => {
  const dir = tempDir("mesh-amqp-identities-");
  let scratch: ScratchVhost;
  let store: Store;
  let identities: ControlIdentities;
  before(async () => {
    scratch = await scratchVhost();
    store = await openStore(`sqlite:${join(dir.path, "mesh.db")}`, { historyLimit: 10 });
    identities = openIdentities(join(dir.path, "data"), { url: scratch.url });
  });
  after(async () => {
    await identities.close();
    await store.close();
    await scratch.drop();
    dir.remove();
  });

  const issue = (node: string, now = new Date()) =>
    issueToken(store, {
      node,
      ttlMs: 3_600_000,
      fingerprint: `SHA256:${"A".repeat(43)}`,
      now,
      broker: identities,
    });
  const tokenAccounts = async (node: string) =>
    (await scratch.api.users()).filter((user) => user.startsWith(`${scratch.users.prefix}.token.${node}.`));

  test("amqp sweep — an ended token's account goes; one issued while the sweep runs stays", async () => {
    const valid = await issue("sweep-valid");
    const ended = await issue("sweep-ended");
    assert.equal(await store.tokens.revoke(ended.id, new Date(Date.now() - 60_000)), true);
    assert.equal((await tokenAccounts("sweep-ended")).length, 1);

    // A token issued while the sweep runs, once the tokens to keep have been read from the store.
    let late: string | undefined;
    const swept = await identities.sweepTokens(async () => {
      const keep = await tokensToKeep(store, new Date(), 5000);
      late = (await issue("sweep-late")).id;
      return keep;
    });
    assert.equal(swept, 1);
    assert.equal((await tokenAccounts("sweep-ended")).length, 0, "the revoked token's account is deleted");
    assert.equal((await tokenAccounts("sweep-valid")).length, 1, `${valid.id} keeps its account`);
    assert.equal(
      (await tokenAccounts("sweep-late")).length,
      1,
      `${late ?? "the late token"} keeps its account`,
    );

    // The next sweep knows the late token and keeps it too.
    assert.equal(await identities.sweepTokens(() => tokensToKeep(store, new Date(), 5000)), 0);
    assert.equal((await tokenAccounts("sweep-late")).length, 1);
  });
});
