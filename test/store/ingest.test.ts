/**
 * The ingest rules on a real store (SQLite and PostgreSQL). The deliveries are built here as the broker adapter
 * would hand them over; these rules never send anything, so the bus given to them refuses to be used.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { sql } from "kysely";
import type { ControlBus, ControlDelivery, DeliveryOutcome } from "../../src/bus/index.js";
import type { IngestContext } from "../../src/control/ingest.js";
import { Ingest } from "../../src/control/ingest.js";
import { RefusalLedger } from "../../src/control/refusals.js";
import { createLogger } from "../../src/log.js";
import { emptyDigest, encodeMessage } from "../../src/link/index.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { reportOfNothing } from "../support/reports.js";
import { enrolled, keptParts, rawStoreDb, storeBackends } from "../support/stores.js";

/** What ingest sends back: receipts only, in these cases; anything else it tried to send fails the test. */
const receipts: Array<{ node: string; receipt: unknown }> = [];
const receiptOnlyBus: ControlBus = busDoing("publishReceipt", (node: string, body: Uint8Array) => {
  receipts.push({ node, receipt: JSON.parse(new TextDecoder().decode(body)) });
  return Promise.resolve();
});

for (const backend of storeBackends) {
  describe(`ingest (${backend.name})`, () => {
    let location: { url: string; cleanup(): Promise<void> };
    let store: Store;
    let clock = new Date("2026-06-01T12:00:00.000Z");
    const lines: string[] = [];
    let ingest: Ingest;
    before(async () => {
      receipts.length = 0;
      location = await backend.fresh();
      store = await openStore(location.url, { historyLimit: 10 });
      ingest = ingestOn(receiptOnlyBus, {
        log: createLogger({ write: (line) => lines.push(line), pretty: false }),
      });
    });
    after(async () => {
      await store.close();
      await location.cleanup();
    });

    /** Ingest on this store and the test's clock, sending on `bus`, with what a test sets besides. */
    const ingestOn = (bus: ControlBus, settings: Partial<IngestContext> = {}) =>
      new Ingest({
        store,
        bus,
        log: createLogger({ level: "error" }),
        now: () => clock,
        resendAfterMs: 1000,
        ...settings,
      });
    const enrol = (node: string, at: Date) => enrolled(store, node, at);
    const delivery = (
      kind: "report" | "alive",
      node: string,
      body: object,
      receivedAt = clock,
    ): ControlDelivery => ({
      kind,
      node,
      body: encodeMessage(body as never),
      redelivered: false,
      receivedAt,
    });
    /** A report delivery whose body is not JSON at all. */
    const notJson = (node: string): ControlDelivery => ({
      kind: "report",
      node,
      body: new TextEncoder().encode("{nope"),
      redelivered: false,
      receivedAt: clock,
    });
    const report = (node: string, reportSequence: number) => reportOfNothing(node, reportSequence, clock);
    /** Records `node`'s first declaration, issued now (as a roll-out leaves the store). */
    const firstDeclared = async (node: string) => {
      await store.nodes.nextDeclarationSequences([node]);
      await store.declarations.recordMany([
        {
          node,
          sequence: 1,
          epoch: 1,
          issuedAt: clock.toISOString(),
          digest: emptyDigest,
          ...keptParts(),
          units: [],
        },
      ]);
    };

    /** The store refuses every write of `write` to `table` (a disk full, a table broken): what makes one fails. */
    const refuseWritesIn = async (
      db: ReturnType<typeof rawStoreDb>,
      table: string,
      write: "INSERT" | "UPDATE",
      refusing: boolean,
    ) => {
      const trigger = `refuse_${table}`;
      const statements =
        backend.name === "sqlite"
          ? refusing
            ? [
                `CREATE TRIGGER ${trigger} BEFORE ${write} ON ${table} ` +
                  "BEGIN SELECT RAISE(ABORT, 'the disk is full (test)'); END",
              ]
            : [`DROP TRIGGER ${trigger}`]
          : refusing
            ? [
                `CREATE FUNCTION ${trigger}() RETURNS trigger LANGUAGE plpgsql AS ` +
                  "$$ BEGIN RAISE EXCEPTION 'the disk is full (test)'; END $$",
                `CREATE TRIGGER ${trigger} BEFORE ${write} ON ${table} FOR EACH ROW EXECUTE FUNCTION ${trigger}()`,
              ]
            : [`DROP TRIGGER ${trigger} ON ${table}`, `DROP FUNCTION ${trigger}()`];
      for (const statement of statements) await sql.raw(statement).execute(db);
    };

    test("ingest — last_seen is when the broker received the alive, not when it was processed", async () => {
      // Enrolled a minute ago, spoke 40 s ago, heard only now.
      await enrol("late-1", new Date(clock.getTime() - 60_000));
      const spokeAt = new Date(clock.getTime() - 40_000);
      clock = new Date(clock.getTime() + 1000);
      const alive = { kind: "alive", node: "late-1", sent_at: spokeAt.toISOString() };
      assert.equal(await ingest.handle(delivery("alive", "late-1", alive, spokeAt)), "done");
      await ingest.flush();
      assert.equal((await store.nodes.get("late-1"))?.lastSeen, spokeAt.toISOString());
      assert.equal(await store.accounts.recoveryCopy("late-1"), undefined, "an alive is never an account");
    });

    test("ingest — a retired node's messages are refused and counted, never kept", async () => {
      await enrol("gone-1", clock);
      await store.nodes.retire("gone-1", clock.toISOString());
      const alive = { kind: "alive", node: "gone-1", sent_at: clock.toISOString() };
      assert.equal(await ingest.handle(delivery("alive", "gone-1", alive)), "done");
      assert.equal(await ingest.handle(delivery("report", "gone-1", report("gone-1", 1))), "done");
      await ingest.flush();
      assert.equal((await store.nodes.get("gone-1"))?.lastSeen, null);
      assert.equal(await store.accounts.recoveryCopy("gone-1"), undefined);
      assert.deepEqual(await store.counters.of("gone-1"), { alive_refused: 1, report_refused: 1 });
    });

    test("ingest — a machine that enrolled again starts its report order anew", async () => {
      await enrol("again-1", clock);
      assert.equal(await ingest.handle(delivery("report", "again-1", report("again-1", 7))), "done");
      assert.equal(await ingest.handle(delivery("report", "again-1", report("again-1", 3))), "done");
      assert.equal(
        (await store.accounts.recoveryCopy("again-1"))?.reportSequence,
        7,
        "an older report is refused",
      );
      clock = new Date(clock.getTime() + 5000);
      await store.nodes.enrol("again-1", {
        signingKey: "s2",
        overlayKey: "o2",
        brokerUser: "U-again-2",
        profile: "{}",
        at: clock.toISOString(),
      });
      // As the control plane's enrolment does once the new enrolment is committed.
      ingest.forget("again-1");
      clock = new Date(clock.getTime() + 1000);
      assert.equal(await ingest.handle(delivery("report", "again-1", report("again-1", 1))), "done");
      assert.equal((await store.accounts.recoveryCopy("again-1"))?.reportSequence, 1);
      assert.deepEqual(
        receipts.filter((r) => r.node === "again-1").map((r) => r.receipt),
        [
          { kind: "receipt", node: "again-1", report_sequence: 7, verdict: "kept" },
          {
            kind: "receipt",
            node: "again-1",
            report_sequence: 3,
            verdict: "refused",
            reason: (
              receipts.find((r) => (r.receipt as { report_sequence: number }).report_sequence === 3)
                ?.receipt as { reason: string }
            ).reason,
          },
          { kind: "receipt", node: "again-1", report_sequence: 1, verdict: "kept" },
        ],
      );
    });

    test("ingest — what the machine before a node's latest enrolment sent is refused, without a receipt", async () => {
      const later = (ms: number) => (clock = new Date(clock.getTime() + ms));
      await enrol("rebuilt-1", clock);
      later(1000);
      const lastHeard = clock;
      assert.equal(await ingest.handle(delivery("report", "rebuilt-1", report("rebuilt-1", 7))), "done");
      // The old machine's last report and alive wait in the queue while the machine is rebuilt and joins again.
      later(1000);
      const queuedAt = clock;
      later(60_000);
      const enrolledAgainAt = clock;
      await store.nodes.enrol("rebuilt-1", {
        signingKey: "s2",
        overlayKey: "o2",
        brokerUser: "U-rebuilt-1-again",
        profile: "{}",
        at: enrolledAgainAt.toISOString(),
      });
      ingest.forget("rebuilt-1");
      later(1000);
      const receiptsBefore = receipts.length;
      // Where the broker gives only its time of receipt (NATS), that time says it came before the enrolment.
      assert.equal(
        await ingest.handle(delivery("report", "rebuilt-1", report("rebuilt-1", 8), queuedAt)),
        "done",
      );
      const oldAlive = { kind: "alive", node: "rebuilt-1", sent_at: queuedAt.toISOString() };
      assert.equal(await ingest.handle(delivery("alive", "rebuilt-1", oldAlive, queuedAt)), "done");
      // Where the broker names the identity that published (RabbitMQ), that says so, whatever the time.
      const byIdentity = (identity: string, body: object, receivedAt: Date): ControlDelivery => ({
        ...delivery("report", "rebuilt-1", body, receivedAt),
        identity,
      });
      assert.equal(await ingest.handle(byIdentity("U-rebuilt-1", report("rebuilt-1", 9), clock)), "done");
      assert.equal(receipts.length, receiptsBefore, "nothing from the machine before is answered");
      assert.equal((await store.accounts.recoveryCopy("rebuilt-1"))?.reportSequence, 7, "nor kept");
      const counters = await store.counters.of("rebuilt-1");
      assert.equal(counters.report_from_before_enrolment, 2);
      assert.equal(counters.alive_from_before_enrolment, 1);
      await ingest.flush();
      assert.equal(
        (await store.nodes.get("rebuilt-1"))?.lastSeen,
        lastHeard.toISOString(),
        "the old machine's later alive does not count as the node heard",
      );
      // The new machine counts its reports from 1, and they are its order. RabbitMQ's time is the publisher's, to the
      // second: a current identity's report stamped before the enrolment is the new machine's all the same.
      assert.equal(
        await ingest.handle(
          byIdentity("U-rebuilt-1-again", report("rebuilt-1", 1), new Date(enrolledAgainAt.getTime() - 900)),
        ),
        "done",
      );
      // The broker's clock a little behind the control plane's: the new machine's all the same.
      assert.equal(
        await ingest.handle(
          delivery("report", "rebuilt-1", report("rebuilt-1", 2), new Date(enrolledAgainAt.getTime() - 500)),
        ),
        "done",
      );
      assert.equal((await store.accounts.recoveryCopy("rebuilt-1"))?.reportSequence, 2);
      assert.deepEqual(
        receipts.slice(receiptsBefore).map((r) => r.receipt),
        [
          { kind: "receipt", node: "rebuilt-1", report_sequence: 1, verdict: "kept" },
          { kind: "receipt", node: "rebuilt-1", report_sequence: 2, verdict: "kept" },
        ],
      );
    });

    test("ingest — the very report already kept, sent again, is taken quietly and receipted again", async () => {
      await enrol("twice-1", clock);
      const body = report("twice-1", 4);
      assert.equal(await ingest.handle(delivery("report", "twice-1", body)), "done");
      assert.equal(await ingest.handle(delivery("report", "twice-1", body)), "done");
      assert.deepEqual(await store.counters.of("twice-1"), {});
      assert.deepEqual(
        receipts.filter((r) => r.node === "twice-1").map((r) => (r.receipt as { verdict: string }).verdict),
        ["kept", "kept"],
      );
    });

    test("ingest — bad input is refused with a reason, counted, and acknowledged", async () => {
      await enrol("bad-1", clock);
      const garbage = notJson("bad-1");
      assert.equal(await ingest.handle(garbage), "done");
      assert.equal(await ingest.handle({ ...garbage, node: undefined }), "done");
      assert.deepEqual(await store.counters.of("bad-1"), { report_refused: 1 });
      assert.deepEqual(await store.counters.of("*"), { report_refused: 1 });
      assert.ok(lines.some((line) => line.includes('"event":"report.refused"') && line.includes("bad-1")));
    });

    test("ingest — a node's failures of one declaration are told when the outcome changes, at most once a minute; a drift's entries are bounded", async () => {
      await enrol("flip-1", clock);
      /** Reports about the same (no) declaration, each newer, flipping between failed and refused. */
      const flip = (reportSequence: number) => {
        const outcome = reportSequence % 2 === 1 ? "failed" : "refused";
        return { ...report("flip-1", reportSequence), outcome, reason: `${outcome} ${reportSequence}` };
      };
      const toldEvents = async () =>
        (await store.events.list({ limit: 1000, node: "flip-1" })).filter((event) =>
          event.kind.startsWith("declaration."),
        );
      const told = async () => (await toldEvents()).map((event) => event.kind);
      const toldLines = () =>
        lines.filter((line) => /"event":"node\.declaration_/.test(line) && line.includes("flip-1"));
      for (let sequence = 1; sequence <= 40; sequence += 1)
        assert.equal(await ingest.handle(delivery("report", "flip-1", flip(sequence))), "done");
      await ingest.flush();
      assert.deepEqual(
        await told(),
        ["declaration.failed"],
        "the first is told; the flips after it are counted",
      );
      assert.equal(toldLines().length, 1);
      assert.deepEqual(await store.counters.of("flip-1"), {
        declarations_failed: 20,
        declarations_refused: 20,
      });
      assert.equal((await store.accounts.recoveryCopy("flip-1"))?.reportSequence, 40, "every report is kept");
      // A minute on, before any flush told them, the next change comes: the 39 held back are told first, as the
      // minute's end would have told them, and the new one waits for the minute that starts, with the one after it.
      clock = new Date(clock.getTime() + 60_000);
      assert.equal(await ingest.handle(delivery("report", "flip-1", flip(41))), "done");
      assert.equal(await ingest.handle(delivery("report", "flip-1", flip(42))), "done");
      await ingest.flush();
      assert.deepEqual(await told(), ["declaration.failed", "declaration.refused"]);
      assert.deepEqual((await toldEvents()).at(-1)?.detail, {
        reason: "refused 40",
        sequence: 0,
        changes: 39,
      });
      assert.equal(toldLines().length, 2);
      assert.equal(await ingest.handle(delivery("report", "flip-1", flip(43))), "done");
      assert.equal(await ingest.handle(delivery("report", "flip-1", flip(44))), "done");
      await ingest.flush();
      assert.equal(toldLines().length, 2, "nothing more within the minute");
      // Its minute over, the change held back is told with how many came, once.
      clock = new Date(clock.getTime() + 60_000);
      await ingest.flush();
      await ingest.flush();
      const last = (await toldEvents()).at(-1);
      assert.equal(last?.kind, "declaration.refused", "the latest change held back: flip 44's");
      assert.deepEqual(last?.detail, { reason: "refused 44", sequence: 0, changes: 4 });
      assert.equal(toldLines().length, 3);
      const changes = (await toldEvents()).reduce(
        (sum, event) => sum + ((event.detail as { changes?: number }).changes ?? 1),
        0,
      );
      assert.equal(changes, 44, "every report's outcome is accounted for in what was told");
      // A change held back is not told once the node applied the declaration after it.
      clock = new Date(clock.getTime() + 1000);
      assert.equal(await ingest.handle(delivery("report", "flip-1", flip(45))), "done");
      assert.equal(await ingest.handle(delivery("report", "flip-1", report("flip-1", 46))), "done");
      clock = new Date(clock.getTime() + 60_000);
      await ingest.flush();
      assert.equal(toldLines().length, 3, "applied since: nothing to tell");

      // An item's id may be 4,096 characters: each entry of the drift's event is cut as a reason is.
      await enrol("drift-1", clock);
      const longId = `file:/${"d".repeat(4000)}`;
      const drifted = {
        ...report("drift-1", 1),
        items: [{ id: longId, state: "applied", drift: "x".repeat(500) }],
      };
      assert.equal(await ingest.handle(delivery("report", "drift-1", drifted)), "done");
      await ingest.flush();
      const drift = (await store.events.list({ limit: 10, node: "drift-1" })).find(
        (event) => event.kind === "node.drift",
      );
      const entries = (drift?.detail as { items?: string[] } | undefined)?.items;
      assert.ok(entries !== undefined && entries.length === 1, `a drift event: ${JSON.stringify(drift)}`);
      assert.ok(
        Buffer.byteLength(entries[0] ?? "") <= 512,
        `${Buffer.byteLength(entries[0] ?? "")} bytes kept`,
      );
      assert.ok(entries[0]?.startsWith("file:/ddd"), "what is kept begins as the item's id does");
    });

    test("ingest — a change held back is told, not passed over, when the node's first account of another declaration comes within its minute", async () => {
      await enrol("turn-1", clock);
      const toldNow = async () =>
        (await store.events.list({ limit: 100, node: "turn-1" })).map((event) => [
          event.kind,
          event.detail.changes ?? null,
        ]);
      const failed = { ...report("turn-1", 1), outcome: "failed", reason: "disk" };
      const refused = { ...report("turn-1", 2), outcome: "refused", reason: "no room" };
      assert.equal(await ingest.handle(delivery("report", "turn-1", failed)), "done");
      clock = new Date(clock.getTime() + 10_000);
      assert.equal(await ingest.handle(delivery("report", "turn-1", refused)), "done");
      // Declared something new, the node fails it within the minute: its first account of it is told at once, and
      // the change held back about the one before is told with it.
      await firstDeclared("turn-1");
      clock = new Date(clock.getTime() + 5_000);
      const next = {
        ...report("turn-1", 3),
        epoch: 1,
        sequence: 1,
        outcome: "failed",
        reason: "disk, the new one",
      };
      assert.equal(await ingest.handle(delivery("report", "turn-1", next)), "done");
      clock = new Date(clock.getTime() + 70_000);
      await ingest.flush();
      await ingest.flush();
      assert.deepEqual(await toldNow(), [
        ["declaration.failed", null],
        ["declaration.refused", 1],
        ["declaration.failed", null],
      ]);
    });

    test("ingest — what a batch told is told again when the store did not keep it: refusals, outcomes, drifts, and what a flush tells", async () => {
      const db = rawStoreDb(location.url);
      const refuseWrites = (table: "events" | "nodes", write: "INSERT" | "UPDATE", refusing: boolean) =>
        refuseWritesIn(db, table, write, refusing);
      const refuseEvents = (refusing: boolean) => refuseWrites("events", "INSERT", refusing);
      try {
        await enrol("untold-1", clock);
        const failedLines: string[] = [];
        const own = ingestOn(receiptOnlyBus, {
          log: createLogger({ write: (line) => failedLines.push(line), pretty: false }),
        });
        const kinds = async () =>
          (await store.events.list({ limit: 100, node: "untold-1" })).map((event) => event.kind).sort();
        const failed = { ...report("untold-1", 1), outcome: "failed", reason: "disk" };
        assert.equal(await own.handle(delivery("report", "untold-1", failed)), "done");
        assert.deepEqual(await kinds(), ["declaration.failed"]);
        // A minute on: the outcome changes (told at once), an item drifted, and a report that is no report at all.
        clock = new Date(clock.getTime() + 61_000);
        const changed = {
          ...report("untold-1", 2),
          outcome: "refused",
          reason: "no room",
          items: [{ id: "file:/etc/motd", state: "applied", drift: "changed by hand" }],
        };
        const batch = [delivery("report", "untold-1", changed), notJson("untold-1")];
        await refuseEvents(true);
        assert.deepEqual(await own.handleBatch(batch), ["retry", "retry"], "handed back: nothing of it kept");
        assert.ok(
          failedLines.some(
            (line) => line.includes('"event":"ingest.failed"') && line.includes("the disk is full"),
          ),
          "the failure is told",
        );
        await refuseEvents(false);
        // Handed back, the same deliveries come again a moment later, within the minute of what was told.
        clock = new Date(clock.getTime() + 1000);
        assert.deepEqual(await own.handleBatch(batch), ["done", "done"]);
        assert.deepEqual(await kinds(), [
          "declaration.failed",
          "declaration.refused",
          "node.drift",
          "report.refused",
        ]);
        assert.deepEqual(await store.counters.of("untold-1"), {
          declarations_failed: 1,
          declarations_refused: 1,
          drift_repaired: 1,
          report_refused: 1,
        });
        // What a flush tells (a refusal counted in its window, told once the window is over) is told again too.
        assert.equal(await own.handle(notJson("untold-1")), "done");
        clock = new Date(clock.getTime() + 60_000);
        await refuseEvents(true);
        await assert.rejects(own.flush(), /the disk is full/);
        await refuseEvents(false);
        await own.flush();
        const told = (await store.events.list({ limit: 100, node: "untold-1" })).filter(
          (event) => event.kind === "report.refused",
        );
        assert.deepEqual(
          told.map((event) => event.detail.refusals),
          [1, 1],
          "the refusal counted in the window, told once the store kept it",
        );
        // And the times nodes spoke, written at a flush the store failed, are written at the next.
        const spokeAt = new Date(clock.getTime() - 500);
        const alive = { kind: "alive", node: "untold-1", sent_at: spokeAt.toISOString() };
        assert.equal(await own.handle(delivery("alive", "untold-1", alive, spokeAt)), "done");
        await refuseWrites("nodes", "UPDATE", true);
        await assert.rejects(own.flush(), /the disk is full/);
        await refuseWrites("nodes", "UPDATE", false);
        await own.flush();
        assert.equal((await store.nodes.get("untold-1"))?.lastSeen, spokeAt.toISOString());
        // A change of outcome held back within its minute, told at a flush the store failed: told at the next.
        clock = new Date(clock.getTime() + 61_000);
        const failedAgain = { ...report("untold-1", 3), outcome: "failed", reason: "disk again" };
        const refusedAgain = { ...report("untold-1", 4), outcome: "refused", reason: "no room again" };
        assert.equal(await own.handle(delivery("report", "untold-1", failedAgain)), "done");
        assert.equal(await own.handle(delivery("report", "untold-1", refusedAgain)), "done");
        clock = new Date(clock.getTime() + 60_000);
        await refuseEvents(true);
        await assert.rejects(own.flush(), /the disk is full/);
        await refuseEvents(false);
        await own.flush();
        const held = (await store.events.list({ limit: 100, node: "untold-1" })).filter(
          (event) => event.kind === "declaration.refused" && event.detail.changes !== undefined,
        );
        assert.deepEqual(
          held.map((event) => event.detail),
          [{ reason: "no room again", sequence: 0, changes: 1 }],
        );
      } finally {
        // Left by a failed assertion, a trigger would fail the tests after this one.
        for (const table of ["events", "nodes"]) {
          const on = backend.name === "sqlite" ? "" : ` ON ${table}`;
          await sql.raw(`DROP TRIGGER IF EXISTS refuse_${table}${on}`).execute(db);
        }
        await db.destroy();
      }
    });

    /** A point the test holds: while held, whatever comes to it waits until it is opened. */
    const gatePoint = () => {
      let held: Promise<void> | undefined;
      let release: () => void = () => undefined;
      let arrive: () => void = () => undefined;
      return {
        /** Holds from now on; settles once something waits here. */
        hold(): Promise<void> {
          held = new Promise<void>((resolve) => (release = resolve));
          return new Promise<void>((resolve) => (arrive = resolve));
        },
        /** Lets what waits go on, and holds nothing more. */
        open(): void {
          held = undefined;
          release();
        },
        /** Where the store waits: at once when not held. */
        pass(): Promise<void> | undefined {
          if (held === undefined) return undefined;
          arrive();
          return held;
        },
      };
    };

    /**
     * The real store, with two points the test holds: a batch's transaction before it begins (`batch`), and the
     * flush's write of the events it tells (`flush`; batches write theirs within their transactions).
     */
    const gatedStore = () => {
      const batch = gatePoint();
      const flush = gatePoint();
      const gated = new Proxy(store, {
        get(target, property, receiver) {
          if (property === "transaction") {
            return async <T>(work: (tx: Store) => Promise<T>) => {
              await batch.pass();
              return target.transaction(work);
            };
          }
          if (property !== "events") return Reflect.get(target, property, receiver) as unknown;
          return new Proxy(target.events, {
            get(events, name, eventsReceiver) {
              if (name !== "recordMany") return Reflect.get(events, name, eventsReceiver) as unknown;
              return async (list: Parameters<Store["events"]["recordMany"]>[0]) => {
                await flush.pass();
                return events.recordMany(list);
              };
            },
          });
        },
      });
      return { store: gated, batch, flush };
    };

    /** Drops the trigger `refuseWritesIn` made on `table`, should a failed assertion have left it. */
    const dropRefusal = async (db: ReturnType<typeof rawStoreDb>, table: string) => {
      const on = backend.name === "sqlite" ? "" : ` ON ${table}`;
      await sql.raw(`DROP TRIGGER IF EXISTS refuse_${table}${on}`).execute(db);
      if (backend.name !== "sqlite") await sql.raw(`DROP FUNCTION IF EXISTS refuse_${table}()`).execute(db);
    };

    /**
     * An ingest on the real store whose batch the test holds at its transaction while a flush runs, then has the store
     * refuse (every counter write fails: a disk full) so that the batch is handed back. `check` runs with it; the
     * trigger is dropped whatever happens.
     */
    const handedBackAfterFlush = async (
      check: (parts: {
        own: Ingest;
        ledger: RefusalLedger;
        /**
         * Runs `deliveries` as a batch held at its transaction (`whileHeld` runs then) while the test's clock moves a
         * minute on and a flush runs, then refused by the store. The deliveries must make the batch write something.
         */
        heldAndRefused: (deliveries: ControlDelivery[], whileHeld?: () => void) => Promise<void>;
      }) => Promise<void>,
    ) => {
      const db = rawStoreDb(location.url);
      const gated = gatedStore();
      const ledger = new RefusalLedger(createLogger({ level: "error" }));
      const own = ingestOn(receiptOnlyBus, { store: gated.store, refusals: ledger });
      const heldAndRefused = async (deliveries: ControlDelivery[], whileHeld?: () => void) => {
        const reachedTransaction = gated.batch.hold();
        const batch = own.handleBatch(deliveries);
        await reachedTransaction;
        whileHeld?.();
        // The window ends while the batch waits, and a flush runs.
        clock = new Date(clock.getTime() + 60_000);
        await own.flush();
        await refuseWritesIn(db, "node_counters", "INSERT", true);
        gated.batch.open();
        assert.deepEqual(
          await batch,
          deliveries.map(() => "retry"),
        );
        await refuseWritesIn(db, "node_counters", "INSERT", false);
      };
      try {
        await check({ own, ledger, heldAndRefused });
      } finally {
        // Left by a failed assertion, the trigger would fail the tests after this one.
        await dropRefusal(db, "node_counters");
        await db.destroy();
      }
    };

    test("ingest — a refusal counted while a flush tells its window's end, its batch then handed back, is told once", async () => {
      await enrol("ahead-1", clock);
      await handedBackAfterFlush(async ({ own, ledger, heldAndRefused }) => {
        const told = async () =>
          (await store.events.list({ limit: 100, node: "ahead-1" }))
            .filter((event) => event.kind === "report.refused")
            .map((event) => event.detail.refusals);
        assert.equal(await own.handle(notJson("ahead-1")), "done");
        assert.deepEqual(await told(), [1], "the first of the window is told at once");
        // Another within the window, counted by a batch under way while the window ends; then handed back.
        await heldAndRefused([notJson("ahead-1")], () =>
          assert.equal(ledger.pendingCount, 1, "the batch's count waits for its transaction"),
        );
        assert.equal(ledger.pendingCount, 0, "handed back, it waits for nothing");
        // It comes again and is kept: told once in all, as it is counted once.
        assert.equal(await own.handle(notJson("ahead-1")), "done");
        clock = new Date(clock.getTime() + 60_000);
        await own.flush();
        assert.deepEqual(await told(), [1, 1], "each refusal told once");
        assert.equal(ledger.pendingCount, 0);
        assert.deepEqual(await store.counters.of("ahead-1"), { report_refused: 2 });
      });
    });

    test("ingest — a change of outcome held back by a batch under way while its minute ends, the batch then handed back, is told once", async () => {
      await enrol("hold-1", clock);
      await handedBackAfterFlush(async ({ own, heldAndRefused }) => {
        const told = async () =>
          (await store.events.list({ limit: 100, node: "hold-1" })).map((event) => [
            event.kind,
            event.detail.changes ?? null,
          ]);
        const failed = { ...report("hold-1", 1), outcome: "failed", reason: "disk" };
        const refused = { ...report("hold-1", 2), outcome: "refused", reason: "no room" };
        assert.equal(await own.handle(delivery("report", "hold-1", failed)), "done");
        // Within the minute the outcome changes: held back, by a batch under way while the minute ends.
        clock = new Date(clock.getTime() + 10_000);
        await heldAndRefused([delivery("report", "hold-1", refused)]);
        // It comes again and is kept (its minute over now: told at once).
        assert.equal(await own.handle(delivery("report", "hold-1", refused)), "done");
        // The next change within that minute is held back by a batch kept, and told once its minute is over: the
        // batch handed back waits for nothing any more.
        clock = new Date(clock.getTime() + 10_000);
        const failedAgain = { ...report("hold-1", 3), outcome: "failed", reason: "disk again" };
        assert.equal(await own.handle(delivery("report", "hold-1", failedAgain)), "done");
        clock = new Date(clock.getTime() + 60_000);
        await own.flush();
        await own.flush();
        assert.deepEqual(
          await told(),
          [
            ["declaration.failed", null],
            ["declaration.refused", null],
            ["declaration.failed", 1],
          ],
          "each change told once",
        );
        assert.deepEqual(await store.counters.of("hold-1"), {
          declarations_failed: 2,
          declarations_refused: 1,
        });
      });
    });

    /** A report of `node` about what it was sent first (nothing, or with `declared` its first declaration). */
    const outcomeOf = (node: string, sequence: number, outcome: "failed" | "refused", declared = false) => {
      const body = {
        ...report(node, sequence),
        ...(declared ? { epoch: 1, sequence: 1 } : {}),
        outcome,
        reason: `${outcome} ${sequence}`,
      };
      return delivery("report", node, body);
    };
    const toldOf = async (node: string) =>
      (await store.events.list({ limit: 100, node })).map((event) => [
        event.kind,
        event.detail.changes ?? null,
      ]);
    /** `node`'s outcome told (failed), then changed within the minute (refused): held back. */
    const failedThenHeld = async (own: Ingest, node: string) => {
      assert.equal(await own.handle(outcomeOf(node, 1, "failed")), "done");
      clock = new Date(clock.getTime() + 10_000);
      assert.equal(await own.handle(outcomeOf(node, 2, "refused")), "done");
    };

    /**
     * An ingest on the gated store whose node's outcome was told (failed), then changed within the minute (refused:
     * held back); the minute over, a flush is under way, held at its events write. `check` goes on from there with
     * the steps these tests take (`declared` records the node's first declaration before the flush); the store's
     * refusing triggers are dropped whatever happens.
     */
    const whileFlushWrites = async (
      node: string,
      check: (steps: {
        own: Ingest;
        /** `deliveries` as a batch held at its transaction (its outcome, once let go, is `outcome`). */
        heldBatch: (deliveries: ControlDelivery[]) => Promise<{ outcome: Promise<DeliveryOutcome[]> }>;
        /** Lets the held batch go and has the store refuse it: handed back. */
        batchRefused: (batch: { outcome: Promise<DeliveryOutcome[]> }) => Promise<void>;
        /** Lets the flush write its events, and the store keep them. */
        flushKept: () => Promise<void>;
        /** Lets the flush write its events, and the store refuse them. */
        flushNotKept: () => Promise<void>;
        /** The minute the flush started over: two flushes. */
        minuteOver: () => Promise<void>;
      }) => Promise<void>,
      declared = false,
    ) => {
      await enrol(node, clock);
      const db = rawStoreDb(location.url);
      const gated = gatedStore();
      const own = ingestOn(receiptOnlyBus, { store: gated.store });
      /** Runs `during` while the store refuses every insert into `table`. */
      const refusing = async (table: string, during: () => Promise<void>) => {
        await refuseWritesIn(db, table, "INSERT", true);
        await during();
        await refuseWritesIn(db, table, "INSERT", false);
      };
      try {
        await failedThenHeld(own, node);
        if (declared) await firstDeclared(node);
        clock = new Date(clock.getTime() + 60_000);
        const flushReachedWrite = gated.flush.hold();
        const flushing = own.flush();
        await flushReachedWrite;
        await check({
          own,
          heldBatch: async (deliveries) => {
            const reached = gated.batch.hold();
            const outcome = own.handleBatch(deliveries);
            await reached;
            return { outcome };
          },
          batchRefused: (batch) =>
            refusing("node_counters", async () => {
              gated.batch.open();
              assert.deepEqual(await batch.outcome, ["retry"]);
            }),
          flushKept: async () => {
            gated.flush.open();
            await flushing;
          },
          flushNotKept: () =>
            refusing("events", async () => {
              gated.flush.open();
              await assert.rejects(flushing, /the disk is full/);
            }),
          minuteOver: async () => {
            clock = new Date(clock.getTime() + 70_000);
            await own.flush();
            await own.flush();
          },
        });
      } finally {
        await dropRefusal(db, "events");
        await dropRefusal(db, "node_counters");
        await db.destroy();
      }
    };

    test("ingest — a change told by a flush while a batch that would tell it too is handed back is told once", async () => {
      await whileFlushWrites("flux-1", async ({ own, heldBatch, batchRefused, flushKept, minuteOver }) => {
        // While the flush writes, the next change comes in a batch whose transaction begins once the flush's events
        // are kept, and the store refuses it.
        const batch = await heldBatch([outcomeOf("flux-1", 3, "failed")]);
        await flushKept();
        await batchRefused(batch);
        // It comes again and is kept, held back for the minute the flush started; then that minute ends.
        assert.equal(await own.handle(outcomeOf("flux-1", 3, "failed")), "done");
        await minuteOver();
        assert.deepEqual(
          await toldOf("flux-1"),
          [
            ["declaration.failed", null],
            ["declaration.refused", 1],
            ["declaration.failed", 1],
          ],
          "each change told once",
        );
      });
    });

    test("ingest — a change held back is told with the next declaration's first account in the same batch", async () => {
      await enrol("solo-1", clock);
      const failed = { ...report("solo-1", 1), outcome: "failed", reason: "disk" };
      assert.equal(await ingest.handle(delivery("report", "solo-1", failed)), "done");
      await firstDeclared("solo-1");
      clock = new Date(clock.getTime() + 10_000);
      const refused = { ...report("solo-1", 2), outcome: "refused", reason: "no room" };
      const next = {
        ...report("solo-1", 3),
        epoch: 1,
        sequence: 1,
        outcome: "failed",
        reason: "disk, the new one",
      };
      // One batch holds the change back, then brings the node's first account of the next declaration.
      assert.deepEqual(
        await ingest.handleBatch([delivery("report", "solo-1", refused), delivery("report", "solo-1", next)]),
        ["done", "done"],
      );
      clock = new Date(clock.getTime() + 70_000);
      await ingest.flush();
      await ingest.flush();
      assert.deepEqual(await toldOf("solo-1"), [
        ["declaration.failed", null],
        ["declaration.refused", 1],
        ["declaration.failed", null],
      ]);
    });

    test("ingest — a flush whose events are not kept leaves what it would have told to the change a batch kept meanwhile", async () => {
      await whileFlushWrites("fold-1", async ({ own, flushNotKept, minuteOver }) => {
        // While the flush writes, the next change comes and is kept; then the store refuses the flush's events.
        assert.equal(await own.handle(outcomeOf("fold-1", 3, "failed")), "done");
        await flushNotKept();
        // The next flush after the minute tells both changes, as one: the latest, and how many came.
        await minuteOver();
        assert.deepEqual(await toldOf("fold-1"), [
          ["declaration.failed", null],
          ["declaration.failed", 2],
        ]);
      });
    });

    test("ingest — a flush not kept, a batch that replaced its entry meanwhile and is handed back after another flush told it: told once", async () => {
      await whileFlushWrites(
        "twin-1",
        async ({ own, heldBatch, batchRefused, flushNotKept, minuteOver }) => {
          // While the flush writes, the first account of the next declaration comes, in a batch held at its
          // transaction. The flush's events are refused; the next flush tells them; then the batch is refused,
          // handed back, and comes again.
          const batch = await heldBatch([outcomeOf("twin-1", 3, "failed", true)]);
          await flushNotKept();
          await own.flush();
          await batchRefused(batch);
          assert.equal(await own.handle(outcomeOf("twin-1", 3, "failed", true)), "done");
          await minuteOver();
          assert.deepEqual(await toldOf("twin-1"), [
            ["declaration.failed", null],
            ["declaration.refused", 1],
            ["declaration.failed", null],
          ]);
        },
        true,
      );
    });

    test("ingest — a flush not kept, two batches replacing its entry meanwhile, the second handed back: nothing passed over", async () => {
      await whileFlushWrites("trio-1", async ({ own, heldBatch, batchRefused, flushNotKept, minuteOver }) => {
        // While the flush writes: one change kept, the next in a batch held at its transaction.
        assert.equal(await own.handle(outcomeOf("trio-1", 3, "failed")), "done");
        const batch = await heldBatch([outcomeOf("trio-1", 4, "refused")]);
        await flushNotKept();
        await batchRefused(batch);
        assert.equal(await own.handle(outcomeOf("trio-1", 4, "refused")), "done");
        await minuteOver();
        assert.deepEqual(await toldOf("trio-1"), [
          ["declaration.failed", null],
          ["declaration.refused", 3],
        ]);
      });
    });

    test("ingest — a batch under way past its minute, its entry forgotten as quiet meanwhile, handed back: what it told is told again", async () => {
      await enrol("slow-1", clock);
      await handedBackAfterFlush(async ({ own, heldAndRefused }) => {
        await failedThenHeld(own, "slow-1");
        await firstDeclared("slow-1");
        clock = new Date(clock.getTime() + 5_000);
        // The next declaration's first account tells the change held back; its batch waits a minute (a flush
        // forgets its entry as quiet meanwhile) and is handed back.
        await heldAndRefused([outcomeOf("slow-1", 3, "failed", true)]);
        assert.equal(await own.handle(outcomeOf("slow-1", 3, "failed", true)), "done");
        clock = new Date(clock.getTime() + 70_000);
        await own.flush();
        assert.deepEqual(await toldOf("slow-1"), [
          ["declaration.failed", null],
          ["declaration.refused", 1],
          ["declaration.failed", null],
        ]);
      });
    });

    test("ingest — report batches handed over side by side are judged one after the other: the same report in both counts once", async () => {
      await enrol("pair-1", clock);
      const gated = gatedStore();
      const own = ingestOn(receiptOnlyBus, { store: gated.store });
      const failed = outcomeOf("pair-1", 1, "failed");
      const reached = gated.batch.hold();
      const first = own.handleBatch([failed]);
      await reached;
      // The same report again (as a consumer taken over redelivers it), handed over while the first batch waits at
      // its transaction: judged once the first is kept, it is the very report already kept, taken quietly.
      const second = own.handleBatch([failed]);
      gated.batch.open();
      assert.deepEqual(await Promise.all([first, second]), [["done"], ["done"]]);
      assert.deepEqual(await store.counters.of("pair-1"), { declarations_failed: 1 });
      assert.deepEqual(await toldOf("pair-1"), [["declaration.failed", null]]);
      assert.equal((await store.accounts.history("pair-1")).length, 1);
    });

    test("ingest — flushes asked for side by side tell a change held back once", async () => {
      await enrol("side-1", clock);
      const failed = { ...report("side-1", 1), outcome: "failed", reason: "first" };
      const refused = { ...report("side-1", 2), outcome: "refused", reason: "then" };
      assert.equal(await ingest.handle(delivery("report", "side-1", failed)), "done");
      assert.equal(await ingest.handle(delivery("report", "side-1", refused)), "done");
      clock = new Date(clock.getTime() + 60_000);
      await Promise.all([ingest.flush(), ingest.flush(), ingest.flush()]);
      const told = (await store.events.list({ limit: 10, node: "side-1" })).map((event) => event.kind);
      assert.deepEqual(told.sort(), ["declaration.failed", "declaration.refused"]);
    });

    test("ingest — a batch is judged in arrival order, each report against those before it in the batch", async () => {
      await enrol("ba1", clock);
      await enrol("ba2", clock);
      await enrol("ba3", clock);
      const garbage = notJson("ba2");
      const outcomes = await ingest.handleBatch([
        delivery("report", "ba1", report("ba1", 1)),
        delivery("report", "ba2", report("ba2", 1)),
        delivery("report", "ba1", report("ba1", 2)),
        // Sent again in the same batch: taken quietly.
        delivery("report", "ba1", report("ba1", 2)),
        // Older than one kept earlier in this very batch: refused.
        delivery("report", "ba1", report("ba1", 1)),
        garbage,
        delivery("alive", "ba2", { kind: "alive", node: "ba2", sent_at: clock.toISOString() }),
        delivery("report", "ba1", report("ba1", 3)),
        // The last to arrive from ba3 is older than its newest (as when a node that joined again counts from 1).
        delivery("report", "ba3", report("ba3", 4)),
        delivery("report", "ba3", report("ba3", 2)),
        // The newest, twice over: answered once.
        delivery("report", "ba2", report("ba2", 5)),
        delivery("report", "ba2", report("ba2", 5)),
      ]);
      assert.deepEqual(outcomes, Array(12).fill("done"));
      assert.deepEqual(
        (await store.accounts.history("ba1")).map((a) => a.reportSequence),
        [3, 2, 1],
      );
      assert.equal((await store.accounts.recoveryCopy("ba2"))?.reportSequence, 5);
      assert.deepEqual(await store.counters.of("ba1"), { report_out_of_order: 1 });
      assert.deepEqual(await store.counters.of("ba2"), { report_refused: 1 });
      // One receipt per node for its newest report in the batch, which a node keeps pending: a receipt for any
      // report it sent before would change nothing there. The last to arrive is answered too where it is another.
      const answered = (node: string) =>
        receipts
          .filter((r) => r.node === node)
          .map((r) => {
            const { report_sequence, verdict } = r.receipt as { report_sequence: number; verdict: string };
            return `${report_sequence} ${verdict}`;
          });
      assert.deepEqual(answered("ba1"), ["3 kept"]);
      assert.deepEqual(answered("ba2"), ["5 kept"]);
      assert.deepEqual(answered("ba3"), ["4 kept", "2 refused"]);
      await ingest.flush();
      assert.notEqual((await store.nodes.get("ba2"))?.lastSeen, null);
    });

    test("ingest — receipts go out only once the batch is committed; a store that fails hands all of it back", async () => {
      await enrol("co1", clock);
      await enrol("co2", clock);
      // Each receipt checks, as it is sent, that the account it answers is already in the store.
      const checks: Array<Promise<void>> = [];
      const answeredHere: string[] = [];
      const checkingBus = busDoing("publishReceipt", (node: string, body: Uint8Array) => {
        const { report_sequence } = JSON.parse(new TextDecoder().decode(body)) as {
          report_sequence: number;
        };
        answeredHere.push(`${node} ${report_sequence}`);
        checks.push(
          store.accounts.history(node).then((kept) => {
            assert.ok(
              kept.some((a) => a.reportSequence === report_sequence),
              `receipt for ${node} ${report_sequence} before its account was stored`,
            );
          }),
        );
        return Promise.resolve();
      });
      const checked = ingestOn(checkingBus);
      const batch = [1, 2, 3].flatMap((n) => [
        delivery("report", "co1", report("co1", n)),
        delivery("report", "co2", report("co2", n)),
      ]);
      assert.deepEqual(await checked.handleBatch(batch), Array(6).fill("done"));
      // Each node's newest report (3) is answered: one receipt per node.
      assert.equal(checks.length, 2);
      assert.deepEqual(answeredHere.sort(), ["co1 3", "co2 3"]);
      await Promise.all(checks);

      // The same batch's successors through a store that is gone: every delivery handed back, nothing sent.
      const elsewhere = await backend.fresh();
      const broken = await openStore(elsewhere.url, { historyLimit: 10 });
      await broken.close();
      const failing = ingestOn(checkingBus, {
        store: broken,
        log: createLogger({ write: (line) => lines.push(line), pretty: false }),
      });
      const later = [4, 5].map((n) => delivery("report", "co1", report("co1", n)));
      assert.deepEqual(await failing.handleBatch(later), ["retry", "retry"]);
      assert.equal(checks.length, 2, "no receipt for a batch that was not written");
      assert.ok(
        lines.some((line) => line.includes('"event":"ingest.failed"') && line.includes('"deliveries":2')),
      );
      await elsewhere.cleanup();
      // Redelivered to a working store, the batch is kept as if nothing had happened.
      assert.deepEqual(await checked.handleBatch(later), ["done", "done"]);
      await Promise.all(checks);
      assert.equal((await store.accounts.recoveryCopy("co1"))?.reportSequence, 5);
    });

    test("ingest — draining a backlog, receipts go out at most once a period: each node's newest of the batches between, one receipt", async () => {
      for (const node of ["rp1", "rp2", "rp3"]) await enrol(node, clock);
      // A backlog: the broker had every report before the first receipt went.
      const since = clock;
      const sent: string[] = [];
      const sentBus = busDoing("publishReceipt", (node: string, body: Uint8Array) => {
        const { report_sequence, verdict } = JSON.parse(new TextDecoder().decode(body)) as {
          report_sequence: number;
          verdict: string;
        };
        sent.push(`${node} ${report_sequence} ${verdict}`);
        return Promise.resolve();
      });
      const said: string[] = [];
      // A period far longer than the test: what is sent is decided by the clock given, never by a timer.
      let counted = 0;
      const periodic = ingestOn(sentBus, {
        log: createLogger({ write: (line) => said.push(line), pretty: false }),
        receiptsEveryMs: 3_600_000,
        receiptsSent: (count) => (counted += count),
      });
      const later = (ms: number) => (clock = new Date(clock.getTime() + ms));
      const batch = (...reports: Array<[string, number]>) =>
        periodic.handleBatch(reports.map(([node, n]) => delivery("report", node, report(node, n), since)));
      try {
        // None sent before: the first batch is answered at once.
        await batch(["rp1", 1], ["rp1", 2], ["rp2", 1]);
        assert.deepEqual(sent.splice(0), ["rp1 2 kept", "rp2 1 kept"]);
        later(1000);
        await batch(["rp1", 3], ["rp2", 2]);
        later(1000);
        // rp1's last to arrive is older than its newest: refused, and answered beside the newest.
        await batch(["rp1", 5], ["rp1", 4]);
        assert.deepEqual(sent, [], "within the period nothing more is sent");
        later(3_600_000);
        await batch(["rp3", 1]);
        assert.deepEqual(sent.splice(0).sort(), ["rp1 4 refused", "rp1 5 kept", "rp2 2 kept", "rp3 1 kept"]);
        assert.equal(counted, 6, "the metric counts each receipt sent");
        // Every account was kept as it came, whatever its receipt waited for.
        assert.deepEqual(
          (await store.accounts.history("rp1")).map((a) => a.reportSequence),
          [5, 3, 2, 1],
        );
        later(1000);
        await batch(["rp3", 2]);
      } finally {
        periodic.close();
      }
      // Closed with one waiting: it is not sent (the bus is closing), and the log says how many were not.
      assert.deepEqual(sent, []);
      assert.ok(
        said.some((line) => line.includes('"event":"receipt.not_sent"') && line.includes('"receipts":1')),
        said.join("\n"),
      );
    });

    test("ingest — in a backlog, a node not answered within the period is answered at once; one answered waits for the period's sending", async () => {
      for (const node of ["ra1", "ra2", "ra3"]) await enrol(node, clock);
      // A backlog: the broker had every report before the first receipt went.
      const since = clock;
      const sent: string[] = [];
      const sentBus = busDoing("publishReceipt", (node: string, body: Uint8Array) => {
        const { report_sequence } = JSON.parse(new TextDecoder().decode(body)) as { report_sequence: number };
        sent.push(`${node} ${report_sequence}`);
        return Promise.resolve();
      });
      // A period far longer than the test: what is sent is decided by the clock given, never by a timer.
      const paced = ingestOn(sentBus, { receiptsEveryMs: 3_600_000 });
      const later = (ms: number) => (clock = new Date(clock.getTime() + ms));
      const batch = (...reports: Array<[string, number]>) =>
        paced.handleBatch(reports.map(([node, n]) => delivery("report", node, report(node, n), since)));
      try {
        await batch(["ra1", 1]);
        assert.deepEqual(sent.splice(0), ["ra1 1"]);
        later(1000);
        // Within ra1's period: ra2, never answered, hears at once; ra1 waits.
        await batch(["ra1", 2], ["ra2", 1]);
        assert.deepEqual(sent.splice(0), ["ra2 1"]);
        later(1000);
        await batch(["ra2", 2], ["ra3", 1]);
        assert.deepEqual(sent.splice(0), ["ra3 1"], "ra2 was answered a second ago: it waits");
        later(3_600_000);
        // The period's sending: everything waiting, whenever its node was last answered.
        await batch(["ra3", 2]);
        assert.deepEqual(sent.splice(0).sort(), ["ra1 2", "ra2 2", "ra3 2"]);
        later(1000);
        await batch(["ra1", 3]);
        assert.deepEqual(sent, [], "answered by the period's sending a second ago");
      } finally {
        paced.close();
      }
      assert.deepEqual(sent, [], "closed: what waited is not sent");
    });

    test("ingest — a report the broker had after its node's last receipt went is answered at once, however soon; one it had before waits", async () => {
      for (const node of ["rl1", "rl2", "rl3"]) await enrol(node, clock);
      const sent: string[] = [];
      const sentBus = busDoing("publishReceipt", (node: string, body: Uint8Array) => {
        const { report_sequence } = JSON.parse(new TextDecoder().decode(body)) as { report_sequence: number };
        sent.push(`${node} ${report_sequence}`);
        return Promise.resolve();
      });
      // A period far longer than the test: what is sent is decided by the clock given, never by a timer.
      const live = ingestOn(sentBus, { receiptsEveryMs: 3_600_000 });
      const later = (ms: number) => (clock = new Date(clock.getTime() + ms));
      const at = (ms: number) => new Date(clock.getTime() + ms);
      const batch = (...reports: Array<[string, number, Date]>) =>
        live.handleBatch(reports.map(([node, n, had]) => delivery("report", node, report(node, n), had)));
      try {
        await batch(["rl1", 1, at(0)], ["rl2", 1, at(0)]);
        assert.deepEqual(sent.splice(0), ["rl1 1", "rl2 1"]);
        // The next roll-out's reports, a second later: the broker had them after the receipts went.
        later(1000);
        await batch(["rl1", 2, at(-200)], ["rl2", 2, at(-200)]);
        assert.deepEqual(sent.splice(0), ["rl1 2", "rl2 2"], "answered at once, though within the period");
        later(500);
        // rl1's report the broker had a millisecond before its last receipt went: part of what waited with it.
        // rl2 reports twice in the batch, both after its last receipt: one receipt, for the newest.
        await batch(["rl1", 3, at(-501)], ["rl2", 3, at(-100)], ["rl2", 4, at(-50)], ["rl3", 1, at(-50)]);
        assert.deepEqual(sent.splice(0), ["rl2 4", "rl3 1"], "rl1 waits for the period's sending");
        later(100);
        // At the very millisecond its last receipt went: it waits too.
        await batch(["rl2", 5, at(-100)]);
        assert.deepEqual(sent, []);
        later(3_600_000);
        await batch(["rl3", 2, at(0)]);
        assert.deepEqual(sent.splice(0).sort(), ["rl1 3", "rl2 5", "rl3 2"]);
        assert.deepEqual(
          (await store.accounts.history("rl2")).map((a) => a.reportSequence),
          [5, 4, 3, 2, 1],
          "every report kept as it came",
        );
      } finally {
        live.close();
      }
      assert.deepEqual(sent, [], "nothing left waiting");
    });

    test("ingest — a receipt waiting for the period's sending goes out by the timer when no batch comes", async () => {
      await enrol("rt1", clock);
      const sent: string[] = [];
      let heard: () => void = () => undefined;
      const sentBus = busDoing("publishReceipt", (node: string, body: Uint8Array) => {
        const { report_sequence } = JSON.parse(new TextDecoder().decode(body)) as { report_sequence: number };
        sent.push(`${node} ${report_sequence}`);
        heard();
        return Promise.resolve();
      });
      // The clock given stands still: only the timer can end the period's wait.
      const timed = ingestOn(sentBus, { receiptsEveryMs: 50 });
      try {
        await timed.handleBatch([delivery("report", "rt1", report("rt1", 1))]);
        assert.deepEqual(sent.splice(0), ["rt1 1"]);
        const second = new Promise<void>((resolve) => (heard = resolve));
        await timed.handleBatch([delivery("report", "rt1", report("rt1", 2))]);
        assert.deepEqual(sent, [], "answered within the period: it waits");
        await second;
        assert.deepEqual(sent, ["rt1 2"]);
      } finally {
        timed.close();
      }
    });

    test("ingest — a batch kept is done though sending a declaration again failed after it: never handed back to be counted twice", async () => {
      await enrol("lag-2", clock);
      const said: string[] = [];
      const brokerGone = busDoing("publishDeclaration", () =>
        Promise.reject(new Error("the broker is gone (test)")),
      );
      const catching = ingestOn(brokerGone, {
        rememberForMs: 0,
        log: createLogger({ write: (line) => said.push(line), pretty: false }),
      });
      await firstDeclared("lag-2");
      clock = new Date(clock.getTime() + 5000);
      const behind = delivery("alive", "lag-2", {
        kind: "alive",
        node: "lag-2",
        sent_at: clock.toISOString(),
        holds: { epoch: 0, sequence: 0 },
      });
      assert.deepEqual(await catching.handleBatch([notJson("lag-2"), behind]), ["done", "done"]);
      assert.deepEqual(await store.counters.of("lag-2"), { report_refused: 1 });
      assert.ok(
        said.some(
          (line) => line.includes('"event":"ingest.answers_failed"') && line.includes("the broker is gone"),
        ),
        said.join("\n"),
      );
    });

    test("ingest — a node behind its latest declaration is sent it again only once it had time to take it", async () => {
      await enrol("lag-1", clock);
      const resent: string[] = [];
      const resendBus = busDoing("publishDeclaration", (node: string) => {
        resent.push(node);
        return Promise.resolve();
      });
      const catching = ingestOn(resendBus, { rememberForMs: 0 });
      await firstDeclared("lag-1");
      const aliveHolding = (sequence: number) =>
        delivery("alive", "lag-1", {
          kind: "alive",
          node: "lag-1",
          sent_at: clock.toISOString(),
          holds: { epoch: sequence === 0 ? 0 : 1, sequence },
        });
      const later = (ms: number) => (clock = new Date(clock.getTime() + ms));
      // Just sent, still on its way in the node's queue: the node says it holds none, and is not sent it again.
      later(400);
      await catching.handle(aliveHolding(0));
      assert.deepEqual(resent, []);
      // Still behind once the period has passed since it was issued: sent again, once.
      later(700);
      await catching.handle(aliveHolding(0));
      assert.deepEqual(resent, ["lag-1"]);
      // Then again only a period after that.
      later(500);
      await catching.handle(aliveHolding(0));
      assert.deepEqual(resent, ["lag-1"]);
      later(600);
      await catching.handle(aliveHolding(0));
      assert.deepEqual(resent, ["lag-1", "lag-1"]);
      // Holding it: nothing more.
      later(5000);
      await catching.handle(aliveHolding(1));
      assert.deepEqual(resent, ["lag-1", "lag-1"]);
    });
  });
}

/** A bus that does `method` as `does` says and nothing else: anything else asked of it fails the test. */
function busDoing<M extends keyof ControlBus>(method: M, does: ControlBus[M]): ControlBus {
  return new Proxy({} as ControlBus, {
    get: (_, name) =>
      name === method
        ? does
        : () => Promise.reject(new Error(`ingest must not use the bus here (${String(name)})`)),
  });
}
