/**
 * Where a controller stands on the lease: a standby until the lease is free, then the holder; without an epoch —
 * urgently, once in the log, kept in the store — only when nobody holds the lease and it cannot be written; and
 * never without one while someone may hold it.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { NoEpochRecord, StandingOptions } from "../../src/lease/standing.js";
import { Standing } from "../../src/lease/standing.js";
import { createLogger } from "../../src/log.js";
import { MemoryLease, memoryEpochs } from "../support/memory-lease.js";

const timings = { renewEveryMs: 50, ttlMs: 400, marginMs: 100 };

function standingOn(lease: MemoryLease, overrides: Partial<StandingOptions> = {}) {
  const lines: string[] = [];
  const rows = new Map<string, { reason: string; since: string }>();
  const noEpoch: NoEpochRecord = {
    raise: (condition) => {
      rows.set(condition.controller, { reason: condition.reason, since: condition.since });
      return Promise.resolve();
    },
    clear: (controller) => {
      rows.delete(controller);
      return Promise.resolve();
    },
  };
  const standing = new Standing({
    backend: lease,
    epochs: memoryEpochs(),
    noEpoch,
    timings,
    holder: { id: "me", host: "here", pid: process.pid, taken_at: new Date().toISOString() },
    log: createLogger({ level: "info", pretty: false, write: (line) => void lines.push(line) }),
    noEpochLogEveryMs: 60_000,
    ...overrides,
  });
  const events = (name: string) => lines.filter((line) => line.includes(`"${name}"`));
  return { standing, rows, events };
}

describe("standing on the lease", () => {
  test("standing — a free lease is taken: the holder acts under its epoch, and gives it back at stop", async () => {
    const lease = new MemoryLease();
    const { standing } = standingOn(lease);
    assert.equal(await standing.obtain(), "holder");
    assert.equal(standing.epoch, lease.record?.revision);
    assert.equal(standing.gate(), true);
    assert.equal(standing.withoutEpoch, false);
    await standing.giveBack();
    assert.equal(lease.record, undefined);
    assert.equal(standing.gate(), false, "nothing acts after a stop");
  });

  test("standing — a standby waits, said once, and takes the lease as soon as the holder gives it back", async () => {
    const lease = new MemoryLease();
    lease.heldBy("other");
    const { standing, events } = standingOn(lease);
    const obtained = standing.obtain();
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(events("lease.standby").length, 1);
    assert.equal(lease.record?.holder.id, "other");
    await lease.release(lease.record?.revision ?? 0);
    assert.equal(await obtained, "holder");
    assert.equal(lease.record?.holder.id, "me");
    await standing.giveBack();
  });

  test("standing — a holder that stopped renewing is taken over when its holding ends, not a renewal period later", async () => {
    const lease = new MemoryLease();
    const end = Date.now() + 150;
    lease.heldBy("killed", end);
    const takenAt: number[] = [];
    const take = lease.take.bind(lease);
    lease.take = async (holder) => {
      const revision = await take(holder);
      if (revision !== undefined) takenAt.push(Date.now());
      return revision;
    };
    // A renewal period of a minute: a standby that only looked again each period would not have taken it yet.
    const { standing, events } = standingOn(lease, { timings: { ...timings, renewEveryMs: 60_000 } });
    assert.equal(await standing.obtain(), "holder");
    assert.equal(lease.record?.holder.id, "me");
    assert.ok((takenAt[0] ?? 0) >= end, "never taken before the holding's end");
    const [line] = events("lease.taken_over");
    const said = JSON.parse(line ?? "{}") as Record<string, unknown>;
    assert.equal(said.woken_by, "expiry");
    assert.equal(said.previous_holder, "killed");
    assert.equal(said.previous_expiry, new Date(end).toISOString());
    await standing.giveBack();
  });

  test("standing — a renewal wakes the standby, which then waits for the renewed holding's end", async () => {
    const lease = new MemoryLease();
    lease.heldBy("other", Date.now() + 30_000);
    const { standing, events } = standingOn(lease, { timings: { ...timings, renewEveryMs: 60_000 } });
    const obtained = standing.obtain();
    while (events("lease.standby").length === 0) await new Promise((resolve) => setTimeout(resolve, 5));
    // Renewed on a shorter life: only a standby that looked again after the renewal knows its end.
    const renewedEnd = Date.now() + 100;
    lease.heldBy("other", renewedEnd);
    assert.equal(await obtained, "holder");
    const said = JSON.parse(events("lease.taken_over")[0] ?? "{}") as Record<string, unknown>;
    assert.equal(said.woken_by, "expiry");
    assert.equal(said.previous_expiry, new Date(renewedEnd).toISOString());
    await standing.giveBack();
  });

  test("standing — a stop ends the wait of a standby", async () => {
    const lease = new MemoryLease();
    lease.heldBy("other");
    const { standing } = standingOn(lease);
    const obtained = standing.obtain();
    standing.stopActing();
    await lease.close();
    assert.equal(await obtained, "stopping");
  });

  test("standing — nobody holds it and it cannot be written: acting without an epoch, urgently, once; restored when it can", async () => {
    const lease = new MemoryLease();
    lease.refuseWrites = "stream is sealed";
    const { standing, rows, events } = standingOn(lease);
    assert.equal(await standing.obtain(), "no_epoch");
    assert.equal(standing.withoutEpoch, true);
    assert.equal(standing.gate(), true, "the mesh stays in touch");
    assert.equal(standing.epoch, undefined);
    assert.equal(rows.get("me")?.reason, "stream is sealed");
    await standing.retryLease();
    assert.equal(events("lease.no_epoch").length, 1, "logged once, not once per retry");

    lease.refuseWrites = undefined;
    await standing.retryLease();
    assert.equal(standing.withoutEpoch, false);
    assert.equal(standing.epoch, lease.record?.revision);
    assert.equal(rows.size, 0, "the condition is cleared in the store");
    assert.equal(events("lease.epoch_restored").length, 1);
    await standing.giveBack();
  });

  test("standing — without an epoch, another controller taking the lease ends this one's acting", async () => {
    const lease = new MemoryLease();
    lease.refuseWrites = "stream is sealed";
    const { standing } = standingOn(lease);
    assert.equal(await standing.obtain(), "no_epoch");
    lease.refuseWrites = undefined;
    lease.heldBy("other");
    await standing.retryLease();
    assert.match(await standing.ended, /another controller took the lease/);
    standing.stopActing();
    await standing.clearNoEpoch();
  });

  test("standing — a lease that cannot be written while it may be held is waited on, never acted without", async () => {
    const lease = new MemoryLease();
    lease.heldBy("other");
    lease.refuseWrites = "the store is read-only";
    const { standing, events } = standingOn(lease);
    const obtained = standing.obtain();
    await new Promise((resolve) => setTimeout(resolve, 150));
    assert.ok(events("lease.unwritable").length >= 1);
    assert.equal(standing.withoutEpoch, false);
    standing.stopActing();
    assert.equal(await obtained, "stopping");
  });

  test("standing — the gate closes by the clock when renewals stop, and that ends acting", async () => {
    let now = 0;
    const lease = new MemoryLease();
    const { standing } = standingOn(lease, { clock: () => now });
    assert.equal(await standing.obtain(), "holder");
    standing.holder.stopRenewing();
    now = timings.ttlMs - timings.marginMs;
    assert.equal(standing.gate(), false);
    assert.match(await standing.ended, /gate closed/);
    await standing.giveBack();
  });
});
