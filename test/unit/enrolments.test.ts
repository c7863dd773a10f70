/**
 * Enrolments are answered side by side, but one node's one after another, and not at all while the lease's gate is
 * closed: the joiner is told to try again. What waits is bounded: beyond a few questions of one node, or so many
 * bytes of all, a question is answered at once that the control plane is busy.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import type { EnrolAnswer, EnrolRequest } from "../../src/bus/index.js";
import type { EnrolmentContext } from "../../src/control/enrolment.js";
import { Enrolments } from "../../src/control/enrolments.js";
import { busyWithAll, busyWithNode, handingOver } from "../../src/link/index.js";
import { RefusalLedger } from "../../src/control/refusals.js";
import { createLogger } from "../../src/log.js";
import { openStore } from "../../src/store/index.js";
import { tempDir } from "../support/tmp.js";

const request = (node: string): EnrolRequest => ({ node, body: new Uint8Array() });
const reply = (text: string): EnrolAnswer => ({ reply: new TextEncoder().encode(text) });
const context = {} as EnrolmentContext;

describe("enrolments", () => {
  test("enrolments — one node's are answered one after another, other nodes' side by side", async () => {
    const log: string[] = [];
    const release = new Map<string, () => void>();
    const answerOne = async (_context: EnrolmentContext, { node }: EnrolRequest) => {
      const index = log.filter((line) => line.startsWith(`start ${node}`)).length;
      const name = `${node}#${index}`;
      log.push(`start ${name}`);
      await new Promise<void>((resolve) => release.set(name, resolve));
      log.push(`end ${name}`);
      return reply(name);
    };
    const enrolments = new Enrolments(context, () => true, answerOne);
    const first = enrolments.answer(request("web-1"));
    const second = enrolments.answer(request("web-1"));
    const other = enrolments.answer(request("db-1"));
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(log, ["start web-1#0", "start db-1#0"], "the second of web-1 waits; db-1 does not");
    release.get("db-1#0")?.();
    release.get("web-1#0")?.();
    await first;
    await new Promise((resolve) => setImmediate(resolve));
    assert.ok(log.includes("start web-1#1"), "the second starts once the first ended");
    release.get("web-1#1")?.();
    assert.equal(new TextDecoder().decode((await second).reply), "web-1#1");
    assert.equal(new TextDecoder().decode((await other).reply), "db-1#0");
    assert.equal(enrolments.underWay, 0, "nothing is kept once answered");
  });

  test("enrolments — a failed answer does not hold the node's next one", async () => {
    let calls = 0;
    const answerOne = () => {
      calls++;
      return calls === 1 ? Promise.reject(new Error("store away")) : Promise.resolve(reply("ok"));
    };
    const enrolments = new Enrolments(context, () => true, answerOne);
    const first = enrolments.answer(request("web-1"));
    const second = enrolments.answer(request("web-1"));
    await assert.rejects(first, /store away/);
    assert.equal(new TextDecoder().decode((await second).reply), "ok");
  });

  test("enrolments — while the gate is closed, the joiner is told the control plane is handing over", async () => {
    let called = false;
    const enrolments = new Enrolments(
      context,
      () => false,
      () => {
        called = true;
        return Promise.resolve(reply("no"));
      },
    );
    const answer = await enrolments.answer(request("web-1"));
    const parsed = JSON.parse(new TextDecoder().decode(answer.reply)) as {
      accepted: boolean;
      reason: string;
    };
    assert.equal(parsed.accepted, false);
    assert.equal(parsed.reason, handingOver);
    assert.equal(called, false);
  });

  test("enrolments — beyond a few questions of one node, or so many bytes of all, the joiner is told the control plane is busy", async () => {
    const dir = tempDir("mesh-enrolments-");
    const store = await openStore(`sqlite:${join(dir.path, "mesh.db")}`, { historyLimit: 50 });
    const lines: string[] = [];
    const log = createLogger({ write: (line) => lines.push(line), pretty: false });
    const limited = { ...context, store, log, refusals: new RefusalLedger(log), now: () => new Date() };
    try {
      const release: Array<() => void> = [];
      let answered = 0;
      const answerOne = async () => {
        answered += 1;
        await new Promise<void>((resolve) => release.push(resolve));
        return reply("ok");
      };
      const enrolments = new Enrolments(limited, () => true, answerOne, { perNode: 2, bytes: 1000 });
      const sized = (node: string, bytes: number): EnrolRequest => ({ node, body: new Uint8Array(bytes) });
      const reasonOf = async (answer: Promise<EnrolAnswer>) =>
        (JSON.parse(new TextDecoder().decode((await answer).reply)) as { reason?: string }).reason;

      const first = enrolments.answer(sized("web-1", 100));
      const second = enrolments.answer(sized("web-1", 100));
      assert.equal(
        await reasonOf(enrolments.answer(sized("web-1", 100))),
        busyWithNode,
        "a third of web-1 waits not",
      );
      assert.equal(await reasonOf(enrolments.answer(sized("web-1", 100))), busyWithNode);
      assert.equal(
        await reasonOf(enrolments.answer(sized("db-1", 801))),
        busyWithAll,
        "800 bytes held, 1,000 at most",
      );
      const third = enrolments.answer(sized("db-1", 800));
      await new Promise((resolve) => setImmediate(resolve));
      assert.equal(answered, 2, "the busy ones were never read; web-1's second waits for its first");
      for (const done of release.splice(0)) done();
      assert.equal(new TextDecoder().decode((await first).reply), "ok");
      await new Promise((resolve) => setImmediate(resolve));
      for (const done of release.splice(0)) done();
      assert.equal(new TextDecoder().decode((await second).reply), "ok");
      assert.equal(new TextDecoder().decode((await third).reply), "ok");
      // Once answered, what they held is free again.
      const again = enrolments.answer(sized("web-1", 900));
      await new Promise((resolve) => setImmediate(resolve));
      for (const done of release.splice(0)) done();
      assert.equal(new TextDecoder().decode((await again).reply), "ok");
      assert.equal(enrolments.underWay, 0);
      await enrolments.kept();
      // Told as refusals are: once a minute per node, and kept as events; not counted in the store one by one.
      const told = lines.filter((line) => line.includes('"event":"enrol.refused"'));
      assert.equal(told.length, 2, told.join("\n"));
      assert.ok(told.some((line) => line.includes('"node":"web-1"') && line.includes(busyWithNode)));
      assert.ok(told.some((line) => line.includes('"node":"db-1"') && line.includes(busyWithAll)));
      assert.equal(
        (await store.events.list({ limit: 10 })).filter((e) => e.kind === "enrol.refused").length,
        2,
      );
      assert.deepEqual(await store.counters.of("web-1"), {});
    } finally {
      await store.close();
      dir.remove();
    }
  });

  test("enrolments — a busy refusal whose event the store did not keep is told at the next one", async () => {
    const dir = tempDir("mesh-enrolments-");
    const path = join(dir.path, "mesh.db");
    const store = await openStore(`sqlite:${path}`, { historyLimit: 50 });
    const raw = new SqliteDatabase(path);
    const lines: string[] = [];
    const log = createLogger({ write: (line) => lines.push(line), pretty: false });
    const limited = { ...context, store, log, refusals: new RefusalLedger(log), now: () => new Date() };
    try {
      let release: () => void = () => undefined;
      const enrolments = new Enrolments(
        limited,
        () => true,
        () => new Promise<EnrolAnswer>((resolve) => (release = () => resolve(reply("ok")))),
        { perNode: 1, bytes: 1000 },
      );
      const first = enrolments.answer(request("web-1"));
      raw.exec(
        "CREATE TRIGGER refuse_events BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'the disk is full (test)'); END",
      );
      await enrolments.answer(request("web-1"));
      await enrolments.kept();
      assert.ok(
        lines.some(
          (line) => line.includes('"event":"enrol.refusal_not_kept"') && line.includes("the disk is full"),
        ),
        "the event not kept is told",
      );
      raw.exec("DROP TRIGGER refuse_events");
      await enrolments.answer(request("web-1"));
      await enrolments.kept();
      const kept = (await store.events.list({ limit: 10 })).filter((e) => e.kind === "enrol.refused");
      assert.deepEqual(
        kept.map((event) => event.detail.refusals),
        [2],
        "told by the next busy refusal, within the minute of the one not kept, and with it",
      );
      release();
      assert.equal(new TextDecoder().decode((await first).reply), "ok");
    } finally {
      raw.close();
      await store.close();
      dir.remove();
    }
  });
});
