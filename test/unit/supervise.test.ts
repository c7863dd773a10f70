import assert from "node:assert/strict";
import { test } from "node:test";
import type { Supervised } from "../../src/control/supervise.js";
import { nextDelay, Supervisor } from "../../src/control/supervise.js";
import { createLogger } from "../../src/log.js";

const backoff = { firstMs: 1, mostMs: 8, stableAfterMs: 60_000 };

test("supervise — restart delays double up to the most and start again after a stable run", () => {
  const delays: number[] = [];
  let delay: number | undefined;
  for (let i = 0; i < 6; i++) {
    delay = nextDelay(backoff, delay, 10);
    delays.push(delay);
  }
  assert.deepEqual(delays, [1, 2, 4, 8, 8, 8]);
  assert.equal(nextDelay(backoff, 8, 60_000), 1);
});

/** Something to supervise: each start is counted, and ends when `end` is called (or fails to start when told). */
function subject(failStarts = 0) {
  const started: Array<{ end: (reason: string) => void; stopped: boolean }> = [];
  let failures = 0;
  const start = (): Promise<Supervised> => {
    if (failures < failStarts) {
      failures++;
      return Promise.reject(new Error(`start ${failures} failed`));
    }
    let end: (reason: string) => void = () => undefined;
    const ended = new Promise<string>((resolve) => (end = resolve));
    const one = { end, stopped: false };
    started.push(one);
    return Promise.resolve({
      ended,
      stop: () => {
        one.stopped = true;
        one.end("stopped");
        return Promise.resolve();
      },
    });
  };
  return { start, started };
}

async function until(what: string, check: () => boolean): Promise<void> {
  for (let i = 0; i < 2000 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
  assert.ok(check(), what);
}

test("supervise — what ends by itself is started again, told in the log, and stopped for good by stop()", async () => {
  const lines: string[] = [];
  const log = createLogger({ write: (line) => lines.push(line), pretty: false });
  const { start, started } = subject();
  const supervisor = new Supervisor({ name: "thing", start, log, backoff });
  await until("the first start", () => started.length === 1);
  started[0]?.end("it crashed");
  await until("a second start", () => started.length === 2);
  started[1]?.end("it crashed again");
  await until("a third start", () => started.length === 3);
  await supervisor.stop();
  assert.equal(started[2]?.stopped, true, "the running one is stopped");
  assert.equal(supervisor.restarts, 2);
  const events = lines.map((line) => JSON.parse(line) as { event: string; reason?: string });
  assert.deepEqual(
    events.filter((e) => e.event === "thing.ended").map((e) => e.reason),
    ["it crashed", "it crashed again"],
  );
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(started.length, 3, "nothing starts after stop()");
});

test("supervise — a start that fails is tried again, and what the caller started first is supervised too", async () => {
  const log = createLogger({ write: () => undefined, pretty: false });
  const { start, started } = subject(3);
  let endInitial: (reason: string) => void = () => undefined;
  const initial: Supervised = {
    ended: new Promise((resolve) => (endInitial = resolve)),
    stop: () => Promise.resolve(),
  };
  const supervisor = new Supervisor({ name: "thing", start, log, backoff, initial });
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(started.length, 0, "the initial one runs: nothing else is started");
  endInitial("gone");
  await until("a start after three failed ones", () => started.length === 1);
  assert.equal(supervisor.restarts, 4);
  await supervisor.stop();
});
