/**
 * The control plane's hearing on a real store (SQLite and PostgreSQL): stretches and the gaps between them are kept
 * (and bounded), and the hearing duty says each loss once and its end once, records the gap, and holds the control
 * queue while the store takes no writes.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Hearing } from "../../src/control/hearing.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { hearingGapsKept } from "../../src/store/hearing.js";
import { storeBackends, freshStoreForSuite } from "../support/stores.js";

const at = (second: number) => new Date(Date.UTC(2026, 5, 1, 12, 0, 0) + second * 1000).toISOString();

async function until(what: string, check: () => boolean): Promise<void> {
  for (let i = 0; i < 3000 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 10));
  assert.ok(check(), what);
}

for (const backend of storeBackends) {
  describe(`hearing (${backend.name})`, () => {
    let store: Store;
    freshStoreForSuite(backend, { historyLimit: 10 }, (opened) => (store = opened));

    test("store — a stretch begun after the last moment heard leaves a gap; moments heard move only forward", async () => {
      assert.equal(await store.hearing.read(), undefined);
      assert.equal(await store.hearing.begin(at(0)), undefined, "the first stretch has no gap before it");
      await store.hearing.heard(at(10), at(0));
      await store.hearing.heard(at(5), at(0));
      // A write for a stretch that is no longer the current one changes nothing.
      await store.hearing.heard(at(20), at(-100));
      assert.deepEqual(await store.hearing.read(), { heardAt: at(10), since: at(0), gaps: [] });
      assert.deepEqual(await store.hearing.begin(at(40)), { from: at(10), to: at(40) });
      await store.hearing.heard(at(41), at(40));
      assert.deepEqual(await store.hearing.read(), {
        heardAt: at(41),
        since: at(40),
        gaps: [{ from: at(10), to: at(40) }],
      });
    });

    test("store — the gaps kept are bounded, newest kept", async () => {
      const start = 1000;
      for (let i = 0; i < hearingGapsKept + 5; i++) await store.hearing.begin(at(start + i * 2));
      const read = await store.hearing.read();
      assert.equal(read?.gaps.length, hearingGapsKept);
      assert.equal(read.gaps[0]?.to, at(start + (hearingGapsKept + 4) * 2), "the newest gap first");
    });

    test("hearing — deafness and a store outage are each said once, and their ends once; the queue waits for the store", async () => {
      const lines: string[] = [];
      const log = createLogger({ write: (line) => lines.push(line), pretty: false });
      let brokerAnswers = true;
      let storeDown = false;
      const unreachable = () => Promise.reject(new Error("connect ECONNREFUSED 127.0.0.1:5432"));
      // The real store, cut off while `storeDown` holds (as a network cut would).
      const cut: Pick<Store, "hearing"> = {
        hearing: {
          begin: (moment: string) => (storeDown ? unreachable() : store.hearing.begin(moment)),
          heard: (moment: string, since: string) =>
            storeDown ? unreachable() : store.hearing.heard(moment, since),
          read: () => (storeDown ? unreachable() : store.hearing.read()),
        } as Store["hearing"],
      };
      // A broker that stops answering does not fail: its answer never comes.
      const backlog = () => (brokerAnswers ? Promise.resolve(7) : new Promise<number>(() => undefined));
      const hearing = new Hearing({
        store: cut,
        backlog,
        log,
        now: () => new Date(),
        everyMs: 10,
        answerWithinMs: 30,
      });
      const events = (name: string) =>
        lines.map((line) => JSON.parse(line) as Record<string, unknown>).filter((e) => e.event === name);
      await hearing.start();
      const begun = (await store.hearing.read())?.since;
      assert.ok(hearing.hears);

      // A stretch begun at start (after the earlier tests' rows) may have been said already: the new one is counted.
      const beginsBefore = events("control.hearing_begins").length;
      brokerAnswers = false;
      await until("deafness to be seen", () => !hearing.hears);
      await new Promise((resolve) => setTimeout(resolve, 150));
      brokerAnswers = true;
      await until("hearing again", () => hearing.hears);
      assert.equal(events("control.deaf").length, 1);
      assert.equal(events("control.hearing_again").length, 1);
      await until("a new stretch in the store", () => events("control.hearing_begins").length > beginsBefore);
      const afterDeafness = await store.hearing.read();
      assert.ok(afterDeafness !== undefined);
      assert.notEqual(afterDeafness.since, begun, "the deaf time is a gap");
      assert.ok(afterDeafness.gaps.some((gap) => gap.to === afterDeafness.since));

      storeDown = true;
      assert.equal(await hearing.storeFailed(new Error("write failed"), 3), true, "the store is found down");
      assert.equal(await hearing.storeFailed(new Error("write failed"), 2), true);
      let resumed = false;
      void hearing.storeWritable().then(() => (resumed = true));
      await new Promise((resolve) => setTimeout(resolve, 100));
      assert.equal(resumed, false, "the queue waits while the store is down");
      storeDown = false;
      await until("the queue to go on", () => resumed);
      hearing.stop();
      assert.equal(events("store.unreachable").length, 1);
      const back = events("store.back");
      assert.equal(back.length, 1);
      assert.equal(back[0]?.handed_back, 5);
      assert.equal(back[0]?.waiting, 7);
      assert.equal(await hearing.storeFailed(new Error("a bug, not the store"), 1), false);
    });
  });
}
