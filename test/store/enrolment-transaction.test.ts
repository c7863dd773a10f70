/**
 * Enrolment writes its rows together: the node's record, the identity it had before (now refused) and the audit
 * line commit as one, so a failure half way leaves the store as it was — never a node enrolled whose old identity
 * still works, nor an old identity refused for a node that did not enrol. On SQLite and PostgreSQL alike.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, describe, test } from "node:test";
import type { BrokerIdentities } from "../../src/bus/index.js";
import type { EnrolmentContext } from "../../src/control/enrolment.js";
import { answerEnrolment } from "../../src/control/enrolment.js";
import { RefusalLedger } from "../../src/control/refusals.js";
import { issueToken, spendToken } from "../../src/control/tokens.js";
import { TokenRefused } from "../../src/errors.js";
import { loadOrCreateSigningKey } from "../../src/keys/index.js";
import { decodeToken, encodeMessage } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { storeBackends, freshStoreForSuite } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";

const log = createLogger({ write: () => undefined });
const fingerprint = `SHA256:${"B".repeat(43)}`;

/** The store, but its audit trail refuses to record events of `kind`, inside its transactions and out. */
function failingEvents(store: Store, kind = "node.enrolled"): Store {
  const failing = (tx: Store): Store => {
    const events = Object.create(tx.events) as Store["events"];
    events.record = (event) =>
      event.kind === kind ? Promise.reject(new Error("the disk is full")) : tx.events.record(event);
    return Object.assign(Object.create(tx) as Store, { events });
  };
  return Object.assign(failing(store), {
    transaction: <T>(work: (tx: Store) => Promise<T>) => store.transaction((tx) => work(failing(tx))),
  });
}

for (const backend of storeBackends) {
  describe(`enrolment in one transaction (${backend.name})`, () => {
    const dir = tempDir("mesh-enrol-tx-");
    let store: Store;
    freshStoreForSuite(backend, { historyLimit: 5 }, (opened) => (store = opened));
    after(() => {
      dir.remove();
    });

    let users = 0;
    const broker: BrokerIdentities = {
      url: "nats://127.0.0.1:4222",
      forToken: () => Promise.reject(new Error("not used")),
      forNode: () => Promise.resolve({ user: `U-${++users}`, credential: { type: "nats", jwt: "a.b.c" } }),
      revoke: () => Promise.resolve(),
      close: () => Promise.resolve(),
    };

    async function enrol(on: Store, node: string): Promise<{ accepted: boolean; reason?: string }> {
      const issued = await issueToken(store, { node, ttlMs: 3_600_000, fingerprint, now: new Date() });
      const token = decodeToken(issued.token);
      const context: EnrolmentContext = {
        store: on,
        broker,
        signing: loadOrCreateSigningKey(dir.path),
        log,
        refusals: new RefusalLedger(log),
        now: () => new Date(),
        resendLatest: () => Promise.resolve(),
        revokeSoon: () => undefined,
        tokenSpent: () => undefined,
        enrolled: () => undefined,
      };
      const body = encodeMessage({
        kind: "enrol",
        node,
        token_id: token.id,
        secret: token.secret,
        keys: { signing: randomBytes(32).toString("base64"), overlay: randomBytes(32).toString("base64") },
        profile: { cpu: 1, memory_mb: 512, os: "linux", arch: "x86_64", labels: {}, roles: [], drivers: [] },
        agent_version: "test",
        sent_at: new Date().toISOString(),
      });
      const answer = await answerEnrolment(context, { node, body });
      return JSON.parse(new TextDecoder().decode(answer.reply)) as { accepted: boolean; reason?: string };
    }

    test("enrolment — a refusal whose event the store did not keep is told at the next one, not a minute later", async () => {
      const refusals = new RefusalLedger(log);
      const malformed = (on: Store) =>
        answerEnrolment(
          {
            store: on,
            broker,
            signing: loadOrCreateSigningKey(dir.path),
            log,
            refusals,
            now: () => new Date(),
            resendLatest: () => Promise.resolve(),
            revokeSoon: () => undefined,
            tokenSpent: () => undefined,
            enrolled: () => undefined,
          },
          { node: "tx-bad", body: new TextEncoder().encode("{nope") },
        );
      const told = async () =>
        (await store.events.list({ limit: 10, node: "tx-bad" })).filter(
          (event) => event.kind === "enrol.refused",
        );
      await assert.rejects(malformed(failingEvents(store, "enrol.refused")), /the disk is full/);
      assert.deepEqual(await told(), []);
      assert.deepEqual(await store.counters.of("tx-bad"), {}, "nor counted: the transaction did not commit");
      const answer = JSON.parse(new TextDecoder().decode((await malformed(store)).reply)) as {
        accepted: boolean;
      };
      assert.equal(answer.accepted, false);
      assert.deepEqual(
        (await told()).map((event) => event.detail.refusals),
        [1],
        "told when it came again, as the refusal it is",
      );
      assert.deepEqual(await store.counters.of("tx-bad"), { enrol_refused: 1 });
    });

    test("enrolment — a token refusal whose event the store did not keep is told at the next one", async () => {
      const refusals = new RefusalLedger(log);
      const presented = { id: "tok_000000000000", secret: "wrong", node: "tx-thief" };
      const told = async () =>
        (await store.events.list({ limit: 10, node: "tx-thief" })).filter(
          (event) => event.kind === "token.refused",
        );
      await assert.rejects(
        spendToken(failingEvents(store, "token.refused"), presented, new Date(), refusals),
        /the disk is full/,
      );
      assert.deepEqual(await told(), []);
      await assert.rejects(spendToken(store, presented, new Date(), refusals), TokenRefused);
      assert.deepEqual(
        (await told()).map((event) => event.detail.reason),
        ["unknown"],
        "told when it came again",
      );
    });

    test("enrolment — a failure half way leaves the node as it was", async () => {
      const answer = await enrol(failingEvents(store), "tx-1");
      assert.equal(answer.accepted, false);
      assert.match(answer.reason ?? "", /enrolment failed on the control plane/);
      const record = await store.nodes.get("tx-1");
      assert.equal(record?.state, "invited", "not enrolled without its audit line");
      assert.equal(record?.brokerUser, null);
    });

    test("enrolment — enrolling again: the old identity is refused only if the new enrolment lands", async () => {
      assert.equal((await enrol(store, "tx-2")).accepted, true);
      const first = (await store.nodes.get("tx-2"))?.brokerUser;
      assert.ok(first !== null && first !== undefined);

      assert.equal((await enrol(failingEvents(store), "tx-2")).accepted, false);
      assert.equal((await store.nodes.get("tx-2"))?.brokerUser, first, "still its identity");
      assert.equal(await store.revokedIdentities.nodeOf(first), undefined, "and not refused");

      assert.equal((await enrol(store, "tx-2")).accepted, true);
      assert.notEqual((await store.nodes.get("tx-2"))?.brokerUser, first);
      assert.equal(await store.revokedIdentities.nodeOf(first), "tx-2", "refused once replaced");
    });
  });
}
