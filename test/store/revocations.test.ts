/**
 * Revocation sync reads only what it needs (tokens that ended and have not expired, retired nodes), and the
 * retention deletes tokens long expired without losing a revocation: a spent token's identity stays refused until
 * its own expiry. Retiring is one transaction. On SQLite and PostgreSQL alike.
 */
import assert from "node:assert/strict";
import { afterEach, describe, mock, test } from "node:test";
import { pruneTokens } from "../../src/control/retention.js";
import { retireNode } from "../../src/control/retire.js";
import { RevocationSync } from "../../src/control/revocation-sync.js";
import {
  currentRevocations,
  retiredNodes,
  revocationsPastGrace,
  tokensToKeep,
} from "../../src/control/revocations.js";
import { MeshError } from "../../src/errors.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { enrolled, freshStoreForSuite, storeBackends } from "../support/stores.js";

const t0 = new Date("2026-03-01T12:00:00.000Z");
const at = (ms: number) => new Date(t0.getTime() + ms);
const hour = 3_600_000;
const day = 24 * hour;
const log = createLogger({ level: "error" });

for (const backend of storeBackends) {
  describe(`revocations and token retention (${backend.name})`, () => {
    let store: Store;
    freshStoreForSuite(backend, { historyLimit: 5 }, (opened) => (store = opened));

    /** A token for `node`, issued at `issued` for `ttlMs`, with a broker identity `U-<id>` unless told not to. */
    const token = async (id: string, node: string, issued: Date, ttlMs: number, credential = true) => {
      await store.tokens.issue({
        id,
        node,
        secretHash: "00",
        createdAt: issued.toISOString(),
        expiresAt: new Date(issued.getTime() + ttlMs).toISOString(),
      });
      if (credential) await store.tokens.setBrokerCredential(id, JSON.stringify({ user: `U-${id}` }));
    };

    test("revocations — only tokens that ended and have not expired, retired nodes and earlier identities", async () => {
      await token("tok_valid00000", "r-1", t0, hour);
      await token("tok_spent00000", "r-1", t0, hour);
      await store.tokens.spend("tok_spent00000", at(60_000));
      await token("tok_revok00000", "r-1", t0, hour);
      await store.tokens.revoke("tok_revok00000", at(120_000));
      await token("tok_spentold00", "r-1", at(-2 * hour), hour);
      await store.tokens.spend("tok_spentold00", at(-2 * hour + 1000));
      await token("tok_nocred0000", "r-1", t0, hour, false);
      await store.tokens.spend("tok_nocred0000", at(1000));
      await enrolled(store, "r-2", t0);
      await retireNode(store, "r-2", at(180_000));
      await store.revokedIdentities.add("U-before", "r-3", at(240_000).toISOString());

      const now = at(300_000);
      assert.deepEqual((await store.tokens.endedIdentities(now)).map((t) => t.brokerCredential).sort(), [
        JSON.stringify({ user: "U-tok_revok00000" }),
        JSON.stringify({ user: "U-tok_spent00000" }),
      ]);
      assert.deepEqual(await retiredNodes(store), ["r-2"]);
      const revoked = await currentRevocations(store, now);
      assert.deepEqual([...revoked.keys()].sort(), [
        "U-before",
        "U-r-2",
        "U-tok_revok00000",
        "U-tok_spent00000",
      ]);
      assert.equal(revoked.get("U-tok_spent00000")?.toISOString(), at(60_000).toISOString());
      assert.equal(revoked.get("U-r-2")?.toISOString(), at(180_000).toISOString());
    });

    test("revocations — the token accounts kept: valid ones and those that ended within the grace", async () => {
      const node = "k-1";
      await token("tok_kvalid0000", node, t0, hour);
      await token("tok_kspentnew0", node, t0, hour);
      await store.tokens.spend("tok_kspentnew0", at(9000));
      await token("tok_kspentold0", node, t0, hour);
      await store.tokens.spend("tok_kspentold0", at(1000));
      await token("tok_krevnew000", node, t0, hour);
      await store.tokens.revoke("tok_krevnew000", at(9500));
      await token("tok_kexpired00", node, at(-2 * hour), hour);
      // Spent by a controller whose clock runs ahead: within a grace of this clock it stays, further ahead it goes.
      await token("tok_kahead0000", node, t0, hour);
      await store.tokens.spend("tok_kahead0000", at(11_500));
      await token("tok_kfarahead0", node, t0, hour);
      await store.tokens.spend("tok_kfarahead0", at(30 * 60_000));
      const keep = await tokensToKeep(store, at(10_000), 2000);
      const mine = [...keep].filter((id) => id.startsWith("tok_k")).sort();
      assert.deepEqual(mine, ["tok_kahead0000", "tok_krevnew000", "tok_kspentnew0", "tok_kvalid0000"]);
    });

    test("token retention — only tokens expired before the retention go; a spent token's revocation stays until its expiry", async () => {
      const node = "p-1";
      // Spent long ago, but its expiry is still ahead: its identity must stay refused.
      await token("tok_plong00000", node, at(-10 * day), 20 * day);
      await store.tokens.spend("tok_plong00000", at(-10 * day + 1000));
      // Expired 8 days ago (spent, revoked, unused): past a 7-day retention.
      for (const id of ["tok_pspent0000", "tok_prevok0000", "tok_punused000"]) {
        await token(id, node, at(-8 * day - hour), hour);
      }
      await store.tokens.spend("tok_pspent0000", at(-8 * day - 1000_000));
      await store.tokens.revoke("tok_prevok0000", at(-8 * day - 1000_000));
      // Expired a day ago: within the retention.
      await token("tok_precent000", node, at(-day - hour), hour);

      assert.equal(await pruneTokens(store, 7 * day, t0, log), 3);
      const left = (await store.tokens.list()).filter((t) => t.node === node).map((t) => t.id);
      assert.deepEqual(left.sort(), ["tok_plong00000", "tok_precent000"]);
      assert.ok(
        (await currentRevocations(store, t0)).has("U-tok_plong00000"),
        "still refused until its expiry",
      );
      assert.equal(await pruneTokens(store, 7 * day, t0, log), 0, "nothing twice");
    });

    test("retire — the node, its waiting tokens and the audit line in one go; the epoch acted under is kept", async () => {
      await token("tok_rwait00000", "ret-1", t0, hour);
      await token("tok_rother0000", "ret-2", t0, hour);
      await retireNode(store, "ret-1", at(1000), 42);
      assert.equal((await store.tokens.find("tok_rwait00000"))?.revokedAt, at(1000).toISOString());
      assert.equal(
        (await store.tokens.find("tok_rother0000"))?.revokedAt,
        null,
        "another node's token stays",
      );
      const [event] = await store.events.list({ limit: 1, node: "ret-1" });
      assert.equal(event?.kind, "node.retired");
      assert.equal(event?.epoch, 42);
      assert.deepEqual(event?.detail, { tokens_revoked: ["tok_rwait00000"] });

      const again = await retireNode(store, "ret-1", at(2000)).catch((error: unknown) => error);
      assert.ok(again instanceof MeshError && again.code === "node_retired");
      const unknown = await retireNode(store, "ret-none", at(2000)).catch((error: unknown) => error);
      assert.ok(unknown instanceof MeshError && unknown.code === "node_unknown");
      assert.equal(await store.nodes.get("ret-none"), undefined);
    });
  });
}

describe("revocation sync", () => {
  let store: Store;
  freshStoreForSuite(storeBackends[0]!, { historyLimit: 5 }, (opened) => (store = opened));
  afterEach(() => mock.timers.reset());

  test("revocation sync — a burst of enrolments shares one update, once the grace has passed", async () => {
    mock.timers.enable({ apis: ["setTimeout"] });
    await enrolled(store, "s-1", t0);
    await retireNode(store, "s-1", at(1000));
    const pushed: string[][] = [];
    const forgotten: string[] = [];
    const sync = new RevocationSync({
      store,
      identities: {
        revoke: (revoked) => {
          pushed.push([...revoked.keys()]);
          return Promise.resolve();
        },
        forget: (node) => {
          forgotten.push(node);
          return Promise.resolve();
        },
      },
      log,
      now: () => at(2000),
      debounceMs: 2000,
    });
    sync.soon();
    sync.soon();
    mock.timers.tick(1999);
    sync.soon();
    assert.equal(pushed.length, 0, "not before the grace");
    mock.timers.tick(1);
    await sync.stop();
    assert.deepEqual(pushed, [["U-s-1"]], "one update for the burst");
    assert.deepEqual(forgotten, ["s-1"]);
    sync.soon();
    mock.timers.tick(5000);
    assert.equal(pushed.length, 1, "none after stop");
  });

  test("revocation sync — a token spent late in the burst keeps its grace: left out of the burst's update, revoked by the next, a grace later", async () => {
    mock.timers.enable({ apis: ["setTimeout", "Date"], now: t0 });
    const spent = async (id: string, when: Date) => {
      await store.tokens.issue({
        id,
        node: "g-1",
        secretHash: "00",
        createdAt: t0.toISOString(),
        expiresAt: at(3_600_000).toISOString(),
      });
      await store.tokens.setBrokerCredential(id, JSON.stringify({ user: `U-${id}` }));
      await store.tokens.spend(id, when);
    };
    const pushed: string[][] = [];
    const sync = new RevocationSync({
      store,
      identities: {
        revoke: (revoked) => {
          pushed.push([...revoked.keys()].filter((user) => user.startsWith("U-tok_g")).sort());
          return Promise.resolve();
        },
        forget: () => Promise.resolve(),
      },
      log,
      now: () => new Date(),
      debounceMs: 2000,
    });
    // The first joiner's answer arms the update; the second is answered 1.5 s into the same burst.
    await spent("tok_gfirst0000", t0);
    sync.soon();
    mock.timers.tick(1500);
    await spent("tok_glate00000", at(1500));
    sync.soon();
    mock.timers.tick(500);
    await sync.settled();
    assert.deepEqual(
      pushed,
      [["U-tok_gfirst0000"]],
      "the late joiner's identity still stands, 0.5 s after its answer",
    );
    mock.timers.tick(1499);
    await sync.settled();
    assert.equal(pushed.length, 1, "not before its own grace has passed");
    // Its grace ended at 3.5 s; the next update is one grace after the last, at 4 s.
    mock.timers.tick(500);
    await sync.settled();
    assert.equal(pushed.length, 1, "not sooner than a grace after the update before");
    mock.timers.tick(1);
    await sync.settled();
    assert.deepEqual(pushed[1], ["U-tok_gfirst0000", "U-tok_glate00000"]);
    mock.timers.tick(10_000);
    await sync.stop();
    assert.equal(pushed.length, 2, "nothing held, nothing more");
  });

  test("revocations — a token spent by a controller whose clock runs ahead is held within a grace of this clock, not for the difference", async () => {
    // Hours after the other tests here: their tokens have expired by then, and say nothing.
    const base = 5 * hour;
    for (const [id, spentAt] of [
      ["tok_ahead0hour0", at(base + hour)],
      ["tok_ahead0sec00", at(base + 1500)],
    ] as const) {
      await store.tokens.issue({
        id,
        node: "a-1",
        secretHash: "00",
        createdAt: at(base).toISOString(),
        expiresAt: at(base + 2 * hour).toISOString(),
      });
      await store.tokens.setBrokerCredential(id, JSON.stringify({ user: `U-${id}` }));
      await store.tokens.spend(id, spentAt);
    }
    const now = await revocationsPastGrace(store, at(base), 2000);
    assert.equal(now.revoked.has("U-tok_ahead0hour0"), true, "an hour ahead: revoked at once");
    assert.equal(now.revoked.has("U-tok_ahead0sec00"), false, "1.5 s ahead: within a grace, held");
    assert.equal(now.heldUntil?.getTime(), at(base + 3500).getTime(), "held until its own grace has passed");
    const later = await revocationsPastGrace(store, at(base + 3500), 2000);
    assert.equal(later.revoked.has("U-tok_ahead0sec00"), true, "revoked once it has");
  });

  test("revocation sync — a long burst of joins gets one update per grace, each token revoked after its grace and within two", async () => {
    mock.timers.enable({ apis: ["setTimeout", "Date"], now: t0 });
    const graceMs = 2000;
    const spentAt = new Map<string, number>();
    const updates: Array<{ at: number; revoked: string[] }> = [];
    const sync = new RevocationSync({
      store,
      identities: {
        revoke: (revoked) => {
          updates.push({ at: Date.now(), revoked: [...revoked.keys()].filter((user) => spentAt.has(user)) });
          return Promise.resolve();
        },
        forget: () => Promise.resolve(),
      },
      log,
      now: () => new Date(),
      debounceMs: graceMs,
    });
    // A join answered every 25 ms for 10 s, each arming the update as an enrolment does.
    for (let join = 0; join < 400; join++) {
      const id = `tok_burst${String(join).padStart(5, "0")}`;
      await store.tokens.issue({
        id,
        node: `b-${join}`,
        secretHash: "00",
        createdAt: t0.toISOString(),
        expiresAt: at(hour).toISOString(),
      });
      await store.tokens.setBrokerCredential(id, JSON.stringify({ user: `U-${id}` }));
      await store.tokens.spend(id, new Date());
      spentAt.set(`U-${id}`, Date.now());
      sync.soon();
      mock.timers.tick(25);
      await sync.settled();
    }
    const burstEnded = Date.now();
    for (let waited = 0; waited < 3 * graceMs; waited += 100) {
      mock.timers.tick(100);
      await sync.settled();
    }
    await sync.stop();
    // 10 s of joins and what follows: an update per grace, not one per join.
    assert.ok(updates.length <= 10_000 / graceMs + 2, `${updates.length} updates for a burst of 10 s`);
    for (const update of updates) {
      for (const user of update.revoked) {
        const spent = spentAt.get(user) ?? Number.NaN;
        assert.ok(update.at - spent >= graceMs, `${user} revoked ${update.at - spent} ms after its spending`);
      }
    }
    const last = updates.at(-1);
    assert.equal(last?.revoked.length, spentAt.size, "every spent token revoked in the end");
    for (const user of spentAt.keys()) {
      const first = updates.find((update) => update.revoked.includes(user));
      const spent = spentAt.get(user) ?? Number.NaN;
      assert.ok(first !== undefined && first.at - spent <= 2 * graceMs, `${user} revoked within two graces`);
    }
    assert.ok((last?.at ?? 0) <= burstEnded + 2 * graceMs);
  });

  test("revocation sync — a start whose update fails is logged, not thrown, and made again, each wait twice the last, until it gets through", async () => {
    mock.timers.enable({ apis: ["setTimeout"] });
    await enrolled(store, "r-1", t0);
    await retireNode(store, "r-1", at(1000));
    type Line = { event: string; again_in_ms?: number; error?: string };
    const lines: Line[] = [];
    let failures = 3;
    const pushed: string[][] = [];
    const sync = new RevocationSync({
      store,
      identities: {
        revoke: (revoked) => {
          if (failures > 0) {
            failures -= 1;
            return Promise.reject(new Error("the management API gave no answer within 10000 ms"));
          }
          pushed.push([...revoked.keys()].filter((user) => user === "U-r-1"));
          return Promise.resolve();
        },
        forget: () => Promise.resolve(),
      },
      log: createLogger({ level: "error", write: (line) => void lines.push(JSON.parse(line) as Line) }),
      // Days after the other tests here: their tokens have expired, and none is held within a grace.
      now: () => at(10 * day),
      debounceMs: 2000,
    });
    await sync.start();
    assert.deepEqual(pushed, [], "the first update failed");
    const failed = () => lines.filter((line) => line.event === "broker.revocations_not_applied");
    assert.equal(failed().length, 1);
    assert.match(failed()[0]?.error ?? "", /no answer within 10000 ms/);
    for (const [wait, tries] of [
      [2000, 2],
      [4000, 3],
    ] as const) {
      assert.equal(failed().at(-1)?.again_in_ms, wait);
      mock.timers.tick(wait - 1);
      await sync.settled();
      assert.equal(failed().length, tries - 1, `not made again before ${wait} ms`);
      mock.timers.tick(1);
      await sync.settled();
      assert.equal(failed().length, tries, `made again after ${wait} ms`);
    }
    assert.equal(failed().at(-1)?.again_in_ms, 8000);
    mock.timers.tick(8000);
    await sync.settled();
    assert.deepEqual(pushed, [["U-r-1"]], "applied once the broker answered");
    mock.timers.tick(60_000);
    await sync.settled();
    assert.equal(pushed.length, 1, "nothing more once it got through");
    assert.equal(failed().length, 3);
    // A later failure (after a reconnection) waits the first wait again, and a stop ends the trying.
    failures = 1;
    sync.afterReconnect();
    // Outside the updates' chain: waited for turn by turn (the clock's timers are the test's).
    for (let turn = 0; failed().length < 4 && turn < 100_000; turn++)
      await new Promise((resolve) => setImmediate(resolve));
    assert.equal(failed().length, 4);
    assert.equal(failed().at(-1)?.again_in_ms, 2000, "the wait starts again from the grace");
    await sync.stop();
    mock.timers.tick(60_000);
    await sync.settled();
    assert.equal(pushed.length, 1, "nothing tried after the stop");
    assert.equal(failed().length, 4);
  });
});
