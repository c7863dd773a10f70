/** The control plane's periodic work: a failing run is logged and the work runs again next period; stop is final. */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, mock, test } from "node:test";
import { Periodic } from "../../src/control/periodic.js";
import { createLogger } from "../../src/log.js";

describe("periodic work", () => {
  beforeEach(() => mock.timers.enable({ apis: ["setInterval"] }));
  afterEach(() => mock.timers.reset());
  const settle = async () => {
    for (let i = 0; i < 5; i++) await Promise.resolve();
  };

  test("periodic — a run that fails is logged as <what>.failed and the work runs again next period", async () => {
    const lines: string[] = [];
    const periodic = new Periodic(createLogger({ pretty: false, write: (line) => void lines.push(line) }));
    let runs = 0;
    periodic.every("liveness.check", 100, () => {
      runs++;
      return runs === 1 ? Promise.reject(new Error("store away")) : Promise.resolve();
    });
    mock.timers.tick(100);
    await settle();
    mock.timers.tick(100);
    await settle();
    assert.equal(runs, 2);
    assert.equal(lines.length, 1);
    assert.match(lines[0] ?? "", /"liveness\.check\.failed".*store away/);
    periodic.stop();
    mock.timers.tick(1000);
    await settle();
    assert.equal(runs, 2, "nothing after stop");
    periodic.every("late", 100, () => {
      runs++;
      return Promise.resolve();
    });
    mock.timers.tick(1000);
    assert.equal(runs, 2, "nothing is started after stop");
  });
});
