/**
 * A command acts under the lease: under the holder's epoch while someone holds it, under a lease of its own (given
 * back after) when nobody does, and — when nobody holds it and it cannot be taken — refused or without an epoch, as
 * the command's policy says.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MeshError } from "../../src/errors.js";
import type { LeaseAccess } from "../../src/lease/acting.js";
import { underLease } from "../../src/lease/acting.js";
import { createLogger } from "../../src/log.js";
import { MemoryLease, memoryEpochs } from "../support/memory-lease.js";

const timings = { renewEveryMs: 300, ttlMs: 1500, marginMs: 300 };
const refuse = { nothingDone: "nothing was declared", withoutLease: "refuse" } as const;
const act = { nothingDone: "no token was issued", withoutLease: "act" } as const;

function access(lease: MemoryLease, lines: string[] = []): LeaseAccess {
  const log = createLogger({ level: "warn", pretty: false, write: (line) => void lines.push(line) });
  return { backend: lease, epochs: memoryEpochs(), timings, log };
}

describe("acting under the lease", () => {
  test("acting — under the holder's epoch while someone holds it; it stops acting once the lease moves on", async () => {
    const lease = new MemoryLease();
    lease.heldBy("controller-a");
    const held = lease.record?.revision;
    await underLease(access(lease), refuse, async ({ epoch, stillActing }) => {
      assert.equal(epoch, held);
      assert.equal(await stillActing(), true);
      lease.heldBy("controller-b");
      assert.equal(await stillActing(), false);
    });
    assert.equal(lease.record?.holder.id, "controller-b", "the holder's lease is not touched");
  });

  test("acting — when nobody holds it, under a lease of its own, given back when the work ends", async () => {
    const lease = new MemoryLease();
    const seen = await underLease(access(lease), refuse, async ({ epoch, stillActing }) => {
      assert.notEqual(epoch, undefined);
      assert.equal(lease.record?.revision, epoch, "the command holds the lease");
      assert.equal(await stillActing(), true);
      return epoch;
    });
    assert.equal(typeof seen, "number");
    assert.equal(lease.record, undefined, "given back");
  });

  test("acting — its own lease is given back when the work fails", async () => {
    const lease = new MemoryLease();
    await assert.rejects(
      underLease(access(lease), refuse, () => Promise.reject(new Error("the work failed"))),
      /the work failed/,
    );
    assert.equal(lease.record, undefined);
  });

  test("acting — nobody holds it and it cannot be taken: a command that needs an epoch is refused, nothing done", async () => {
    const lease = new MemoryLease();
    lease.refuseWrites = "stream is sealed";
    let ran = false;
    const failure = await underLease(access(lease), refuse, () => {
      ran = true;
      return Promise.resolve();
    }).catch((error: unknown) => error);
    assert.ok(failure instanceof MeshError);
    assert.equal(failure.code, "no_lease");
    assert.match(
      failure.message,
      /nobody holds the lease and this command could not take one \(stream is sealed\)/,
    );
    assert.match(failure.message, /nothing was declared$/);
    assert.equal(ran, false);
  });

  test("acting — nobody holds it and it cannot be taken: a command that may act does so without an epoch, and says so", async () => {
    const lease = new MemoryLease();
    lease.refuseWrites = "stream is sealed";
    const lines: string[] = [];
    const epoch = await underLease(access(lease, lines), act, (acting) => Promise.resolve(acting.epoch));
    assert.equal(epoch, undefined);
    assert.equal(lines.filter((line) => line.includes("lease.acting_without_epoch")).length, 1);
  });

  test("acting — no lease store to reach: without an epoch, or refused, by the policy", async () => {
    const log = createLogger({ level: "error" });
    const unreachable = { unreachable: "no broker is recorded for this mesh", log };
    assert.equal(await underLease(unreachable, act, (acting) => Promise.resolve(acting.epoch)), undefined);
    await assert.rejects(
      underLease(unreachable, refuse, () => Promise.resolve()),
      /no broker is recorded for this mesh\); nothing was declared/,
    );
  });

  test("acting — a lease that cannot be read is not taken for free: the command is refused", async () => {
    const lease = new MemoryLease();
    lease.refuseReads = "the bucket is away";
    for (const policy of [refuse, act]) {
      await assert.rejects(
        underLease(access(lease), policy, () => Promise.resolve()),
        (error: unknown) =>
          error instanceof MeshError && error.code === "no_lease" && /the bucket is away/.test(error.message),
      );
    }
  });
});
