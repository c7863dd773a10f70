/**
 * One contract, every lease store: a NATS key-value bucket on the machine's nats-server, and the SQL row on SQLite
 * and PostgreSQL. Short timings stand in for the production 5 s / 15 s / 3 s.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { NatsKvLease } from "../../src/bus/nats/lease-kv.js";
import { LeaseHolder } from "../../src/lease/holder.js";
import { Standing } from "../../src/lease/standing.js";
import type { HolderInfo, LeaseBackend, LeaseTimings } from "../../src/lease/lease.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { storeBackends } from "../support/stores.js";

const timings: LeaseTimings = { renewEveryMs: 300, ttlMs: 1500, marginMs: 300 };
const natsUrl = process.env.MESH_TEST_NATS ?? "nats://127.0.0.1:4222";
const holder = (id: string): HolderInfo => ({
  id,
  host: "test",
  pid: process.pid,
  taken_at: new Date().toISOString(),
});
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
async function eventuallyTrue(check: () => boolean): Promise<void> {
  for (let waited = 0; !check(); waited += 10) {
    if (waited > 5000) throw new Error("timed out");
    await sleep(10);
  }
}

interface Fixture {
  name: string;
  open(): Promise<{
    backend: () => Promise<LeaseBackend>;
    reset(): Promise<void>;
    store: Store;
    close(): Promise<void>;
  }>;
}

const fixtures: Fixture[] = [
  {
    name: "NATS key-value",
    async open() {
      const nc: NatsConnection = await connect({ servers: natsUrl });
      const bucket = `mesh-lease-test-${randomBytes(4).toString("hex")}`;
      const location = await storeBackends[0]!.fresh();
      const store = await openStore(location.url, { historyLimit: 5 });
      return {
        backend: () => NatsKvLease.open(nc, timings.ttlMs, bucket),
        reset: async () => {
          await (await jetstreamManager(nc)).streams.delete(`KV_${bucket}`);
        },
        store,
        close: async () => {
          await (await jetstreamManager(nc)).streams.delete(`KV_${bucket}`).catch((error: unknown) => {
            if (!/not found/i.test(String(error))) throw error;
            return false;
          });
          await nc.close();
          await store.close();
          await location.cleanup();
        },
      };
    },
  },
  ...storeBackends.map((storeBackend): Fixture => ({
    name: `SQL on ${storeBackend.name}`,
    async open() {
      let location = await storeBackend.fresh();
      let store = await openStore(location.url, { historyLimit: 5 });
      return {
        backend: () => Promise.resolve(store.lease(timings.ttlMs)),
        // A new, empty store: its lease revisions start from nothing, as a recreated bucket's do.
        reset: async () => {
          await store.close();
          await location.cleanup();
          location = await storeBackend.fresh();
          store = await openStore(location.url, { historyLimit: 5 });
        },
        get store() {
          return store;
        },
        close: async () => {
          await store.close();
          await location.cleanup();
        },
      };
    },
  })),
];

for (const fixture of fixtures) {
  describe(`lease (${fixture.name})`, () => {
    let f: Awaited<ReturnType<Fixture["open"]>>;
    before(async () => {
      f = await fixture.open();
    });
    after(async () => {
      await f.close();
    });

    /** Holder "a" over `backend`, renewing only when asked, its log lines kept in `lines`. */
    const holderA = (backend: LeaseBackend, lines: string[], clock?: () => number) =>
      new LeaseHolder({
        backend,
        epochs: f.store.epochs,
        timings: { ...timings, renewEveryMs: 60_000 },
        holder: holder("a"),
        log: createLogger({ write: (line) => lines.push(line), pretty: false }),
        ...(clock === undefined ? {} : { clock }),
      });

    test("lease — taken by create, refused to a second holder while held; the epoch is the revision", async () => {
      const lease = await f.backend();
      const epoch = await lease.take(holder("a"));
      assert.ok(epoch !== undefined && epoch >= 1);
      assert.equal(await lease.take(holder("b")), undefined);
      const current = await lease.read();
      assert.equal(current?.holder.id, "a");
      assert.equal(current?.revision, epoch);
      assert.equal(await lease.release(epoch), true);
    });

    test("lease — a standby's floor check never disturbs a holder that has not renewed yet", async () => {
      const lease = await f.backend();
      const epoch = await lease.take(holder("a"));
      assert.ok(epoch !== undefined);
      // The holder's epoch is the floor now, and it has not renewed: the key's revision is the floor itself.
      const standby = await f.backend();
      assert.equal(await standby.raiseAbove(epoch), false);
      assert.equal((await standby.read())?.holder.id, "a");
      assert.equal(await standby.take(holder("b")), undefined);
      assert.equal(await lease.release(epoch), true);
    });

    test("lease — renewal is compare-and-set on the last revision", async () => {
      const lease = await f.backend();
      const first = await lease.take(holder("a"));
      assert.ok(first !== undefined);
      const second = await lease.renew(holder("a"), first);
      assert.ok(second !== undefined && second > first);
      assert.equal(await lease.renew(holder("a"), first), undefined, "a stale revision is refused");
      assert.equal(await lease.release(first), false, "only the current revision gives the lease back");
      assert.equal(await lease.release(second), true);
      assert.equal(await lease.read(), undefined);
    });

    test("lease — an unrenewed lease ages out; another takes it and the old holder's renewal is refused", async () => {
      const lease = await f.backend();
      const old = await lease.take(holder("a"));
      assert.ok(old !== undefined);
      await sleep(timings.ttlMs + 700);
      const taken = await lease.take(holder("b"));
      assert.ok(taken !== undefined && taken > old);
      assert.equal(await lease.renew(holder("a"), old), undefined);
      assert.equal((await lease.read())?.holder.id, "b");
      assert.equal(await lease.release(taken), true);
    });

    test("lease — after its store is reset, the next epoch is above every earlier one (the floor)", async () => {
      const lease = await f.backend();
      const epoch = await lease.take(holder("a"));
      assert.ok(epoch !== undefined);
      await f.store.epochs.record(epoch + 40, "a", new Date().toISOString());
      await lease.release(epoch);
      await f.reset();
      const fresh = await f.backend();
      const floor = await f.store.epochs.floor();
      // The store behind the floor may itself be new (the SQL case): keep the floor we knew.
      const known = Math.max(floor, epoch + 40);
      assert.equal(await fresh.raiseAbove(known), true);
      const next = await fresh.take(holder("b"));
      assert.ok(next !== undefined && next > known, `epoch ${next} is above the floor ${known}`);
      assert.equal(await fresh.raiseAbove(known), false, "nothing to raise once above");
      assert.ok(next !== undefined && (await fresh.release(next)));
    });

    test("lease — a standby takes a lease left unrenewed when the holding ends by the store's record, not a renewal period later", async () => {
      const lease = await f.backend();
      const left = await lease.take({ ...holder("killed"), ttl_ms: timings.ttlMs });
      assert.ok(left !== undefined);
      const end = (await lease.read())?.expiresAt;
      assert.ok(end !== undefined, "the store tells when the holding ends");
      const lines: string[] = [];
      const standby = new Standing({
        backend: await f.backend(),
        epochs: f.store.epochs,
        noEpoch: { raise: () => Promise.resolve(), clear: () => Promise.resolve() },
        // A renewal period of a minute: a standby that only looked again each period would not have taken it yet.
        timings: { ...timings, renewEveryMs: 60_000 },
        holder: holder("standby"),
        log: createLogger({ write: (line) => lines.push(line), pretty: false }),
        noEpochLogEveryMs: 60_000,
      });
      assert.equal(await standby.obtain(), "holder");
      const taken = await lease.read();
      assert.equal(taken?.holder.id, "standby");
      assert.ok(taken.revision > left);
      // When the store wrote the take (its end less its life): never before the holding it replaced had ended.
      const takenAt = (taken.expiresAt ?? 0) - timings.ttlMs;
      assert.ok(takenAt >= end, `taken at ${takenAt}, the holding ended at ${end}`);
      const said = lines.find((line) => line.includes('"event":"lease.taken_over"'));
      assert.equal((JSON.parse(said ?? "{}") as { woken_by?: string }).woken_by, "expiry", lines.join("\n"));
      await standby.giveBack();
    });

    test("lease — the holder acts only until its last renewal + TTL − margin, and a refused renewal is a loss", async () => {
      let now = 0;
      const lines: string[] = [];
      const lease = await f.backend();
      const a = holderA(lease, lines, () => now);
      assert.equal(await a.tryTake(), true);
      assert.equal(
        await f.store.epochs.floor(),
        a.epoch,
        "the epoch taken is recorded, and is the new floor",
      );
      now = timings.ttlMs - timings.marginMs - 1;
      assert.equal(a.canAct(), true);
      now = timings.ttlMs - timings.marginMs;
      assert.equal(a.canAct(), false, "the gate closes on the clock, with nothing else said");

      await sleep(timings.ttlMs + 700);
      const b = await f.backend();
      assert.ok((await b.take(holder("b"))) !== undefined);
      await a.renew();
      assert.equal(await a.lost, "renewal refused");
      assert.ok(lines.some((line) => line.includes('"event":"lease.lost"')));
      const current = await b.read();
      assert.ok(current !== undefined && (await b.release(current.revision)));
    });

    test("lease — renewals run one at a time, and a release waits for the one in flight, so the lease is given back", async () => {
      const lease = await f.backend();
      // The store takes each renewal at once; its answer is held back until the test lets it through.
      const held: (() => void)[] = [];
      const letThrough = () => held.splice(0).forEach((answer) => answer());
      let renewalsWritten = 0;
      const slowAnswers: LeaseBackend = Object.assign(Object.create(lease) as LeaseBackend, {
        async renew(info: HolderInfo, revision: number) {
          const written = await lease.renew(info, revision);
          renewalsWritten += 1;
          await new Promise<void>((resolve) => held.push(resolve));
          return written;
        },
      });
      const lines: string[] = [];
      const a = holderA(slowAnswers, lines);
      assert.equal(await a.tryTake(), true);
      const first = a.renew();
      const second = a.renew();
      await eventuallyTrue(() => renewalsWritten >= 1);
      const released = a.release();
      await sleep(100);
      letThrough();
      assert.equal(
        renewalsWritten,
        1,
        "the second renewal joined the first instead of writing on its revision",
      );
      await Promise.all([first, second, released]);
      assert.ok(!lines.some((line) => line.includes('"lease.lost"')), lines.join("\n"));
      assert.ok(
        lines.some((line) => line.includes('"event":"lease.released"') && line.includes('"given_back":true')),
        lines.join("\n"),
      );
      assert.equal(await lease.read(), undefined, "nobody holds the lease once it is given back");
    });

    test("lease — a renewal the store never answers holds a release back for one lease life at most, and no renewal starts after a release", async () => {
      const lease = await f.backend();
      let renewals = 0;
      const silent: LeaseBackend = Object.assign(Object.create(lease) as LeaseBackend, {
        renew(): Promise<number | undefined> {
          renewals += 1;
          return new Promise<never>(() => undefined);
        },
      });
      const lines: string[] = [];
      const a = holderA(silent, lines);
      assert.equal(await a.tryTake(), true);
      void a.renew();
      const started = performance.now();
      // The renewal never answers: a release that waited for it without a bound would never end. It ends (within a
      // generous deadline, not a measurement), and not before one lease life has passed.
      let deadline: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        a.release().then(() => "released" as const),
        new Promise<"still waiting">(
          (resolve) => (deadline = setTimeout(() => resolve("still waiting"), 60_000)),
        ),
      ]).finally(() => clearTimeout(deadline));
      const waited = performance.now() - started;
      assert.equal(ended, "released", "the release stopped waiting for the unanswered renewal");
      assert.ok(
        waited >= timings.ttlMs - 50,
        `the release waited ${waited.toFixed(0)} ms, at least one lease life`,
      );
      assert.ok(
        lines.some((line) => line.includes('"event":"lease.renewal_unanswered"')),
        lines.join("\n"),
      );
      // Given back on the revision known (the renewal was never written), or already aged out where the store ages
      // entries out by the same life (a NATS bucket): either way the release is told, and the lease is free.
      assert.ok(
        lines.some((line) => line.includes('"event":"lease.released"')),
        lines.join("\n"),
      );
      await a.renew();
      assert.equal(renewals, 1, "a renewal asked for after the release does not start");
      assert.equal(await lease.read(), undefined);
    });
  });
}

test("lease (NATS key-value) — a bucket made on other timings is brought to the configured TTL, and a release after the old TTL still gives the lease back", async () => {
  const nc: NatsConnection = await connect({ servers: natsUrl });
  const bucket = `mesh-lease-test-${randomBytes(4).toString("hex")}`;
  const jsm = await jetstreamManager(nc);
  try {
    await NatsKvLease.open(nc, 500, bucket);
    const lease = await NatsKvLease.open(nc, 30_000, bucket);
    assert.equal((await jsm.streams.info(`KV_${bucket}`)).config.max_age, 30_000 * 1_000_000);
    const revision = await lease.take(holder("slow"));
    assert.ok(revision !== undefined);
    await sleep(900);
    assert.equal(await lease.release(revision), true, "the entry outlived the bucket's first TTL");
  } finally {
    await jsm.streams.delete(`KV_${bucket}`);
    await nc.close();
  }
});

test("lease (NATS key-value) — an entry left on a shorter life is free once that life is over, though the bucket now keeps entries longer", async () => {
  const nc: NatsConnection = await connect({ servers: natsUrl });
  const bucket = `mesh-lease-test-${randomBytes(4).toString("hex")}`;
  const jsm = await jetstreamManager(nc);
  try {
    const short = await NatsKvLease.open(nc, 500, bucket);
    // A holder on a 500 ms life takes the lease and stops without a word (killed).
    const left = await short.take({ ...holder("killed"), ttl_ms: 500 });
    assert.ok(left !== undefined);
    // The next controller runs on a 30 s life: the bucket keeps every entry that long from now on.
    const long = await NatsKvLease.open(nc, 30_000, bucket);
    assert.equal((await jsm.streams.info(`KV_${bucket}`)).config.max_age, 30_000 * 1_000_000);
    assert.equal(
      await long.take({ ...holder("early"), ttl_ms: 30_000 }),
      undefined,
      "held while its life lasts",
    );
    assert.equal((await long.read())?.holder.id, "killed");

    await sleep(800);
    assert.equal(await long.read(), undefined, "nobody holds a lease whose holder's life is over");
    const next = await long.take({ ...holder("next"), ttl_ms: 30_000 });
    assert.ok(next !== undefined && next > left, `taken at ${next} after ${left}`);
    assert.equal((await long.read())?.holder.id, "next");
    // A live holder's entry is never cleared: the one just taken stays, whoever asks.
    assert.equal(await short.take({ ...holder("late"), ttl_ms: 500 }), undefined);
    assert.ok(await long.release(next));
  } finally {
    await jsm.streams.delete(`KV_${bucket}`);
    await nc.close();
  }
});
