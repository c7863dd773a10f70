/**
 * Enrolments are answered side by side, but one node's one after another, and not at all while the lease's gate is
 * closed: the joiner is told to try again.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { EnrolAnswer, EnrolRequest } from "../../src/bus/index.js";
import type { EnrolmentContext } from "../../src/control/enrolment.js";
import { Enrolments, handingOver } from "../../src/control/enrolments.js";

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
});
