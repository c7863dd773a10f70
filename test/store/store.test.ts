import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { MeshError, StoreError, UsageError } from "../../src/errors.js";
import type { Store } from "../../src/store/index.js";
import {
  declarationsSentEvent,
  declarationsSentIn,
  declarationsSentKind,
  digestKey,
  openStore,
} from "../../src/store/index.js";
import { keptParts, storeBackends } from "../support/stores.js";

const options = { historyLimit: 3 };
const at = (seconds: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, seconds)).toISOString();

for (const backend of storeBackends) {
  describe(`store (${backend.name})`, () => {
    let location: { url: string; cleanup(): Promise<void> };
    let store: Store;

    before(async () => {
      location = await backend.fresh();
      store = await openStore(location.url, options);
    });
    after(async () => {
      await store.close();
      await location.cleanup();
    });

    test("migrations — reopening an existing store applies nothing twice and keeps the data", async () => {
      await store.tokens.issue({
        id: "tok_000000000001",
        node: "reopen-1",
        secretHash: "aa",
        createdAt: at(0),
        expiresAt: at(3600),
      });
      const again = await openStore(location.url, options);
      try {
        assert.equal((await again.nodes.get("reopen-1"))?.state, "invited");
      } finally {
        await again.close();
      }
    });

    test("tokens — issuing creates the node record as invited, once", async () => {
      for (const id of ["tok_00000000000a", "tok_00000000000b"]) {
        await store.tokens.issue({
          id,
          node: "web-1",
          secretHash: "ab",
          createdAt: at(0),
          expiresAt: at(60),
        });
      }
      const nodes = (await store.nodes.list()).filter((n) => n.name === "web-1");
      assert.deepEqual(
        nodes.map((n) => [n.name, n.state, n.lastSeen]),
        [["web-1", "invited", null]],
      );
      const tokens = (await store.tokens.list()).filter((t) => t.node === "web-1");
      assert.deepEqual(
        tokens.map((t) => t.id),
        ["tok_00000000000a", "tok_00000000000b"],
      );
    });

    test("tokens — spend is compare-and-set: the second spend and a spend after expiry fail", async () => {
      await store.tokens.issue({
        id: "tok_00000000000c",
        node: "web-2",
        secretHash: "ac",
        createdAt: at(0),
        expiresAt: at(60),
      });
      assert.equal(await store.tokens.spend("tok_00000000000c", new Date(at(10))), true);
      assert.equal(await store.tokens.spend("tok_00000000000c", new Date(at(11))), false);
      assert.equal((await store.tokens.find("tok_00000000000c"))?.spentAt, at(10));

      await store.tokens.issue({
        id: "tok_00000000000d",
        node: "web-2",
        secretHash: "ad",
        createdAt: at(0),
        expiresAt: at(60),
      });
      assert.equal(await store.tokens.spend("tok_00000000000d", new Date(at(60))), false);
      assert.equal((await store.tokens.find("tok_00000000000d"))?.spentAt, null);
    });

    test("tokens — a revoked token cannot be spent and cannot be revoked twice", async () => {
      await store.tokens.issue({
        id: "tok_00000000000e",
        node: "web-3",
        secretHash: "ae",
        createdAt: at(0),
        expiresAt: at(60),
      });
      assert.equal(await store.tokens.revoke("tok_00000000000e", new Date(at(1))), true);
      assert.equal(await store.tokens.revoke("tok_00000000000e", new Date(at(2))), false);
      assert.equal(await store.tokens.spend("tok_00000000000e", new Date(at(3))), false);
    });

    test("tokens — a retired node's name takes no new token", async () => {
      await store.tokens.issue({
        id: "tok_00000000000f",
        node: "old-1",
        secretHash: "af",
        createdAt: at(0),
        expiresAt: at(60),
      });
      assert.equal(await store.nodes.retire("old-1", at(5)), true);
      await assert.rejects(
        store.tokens.issue({
          id: "tok_000000000010",
          node: "old-1",
          secretHash: "b0",
          createdAt: at(6),
          expiresAt: at(60),
        }),
        /old-1 is retired/,
      );
      assert.equal(await store.tokens.find("tok_000000000010"), undefined);
    });

    test("nodes — enrol records keys and profile; last_seen moves in batches and never backwards", async () => {
      await store.tokens.issue({
        id: "tok_000000000011",
        node: "db-1",
        secretHash: "b1",
        createdAt: at(0),
        expiresAt: at(60),
      });
      await store.tokens.issue({
        id: "tok_000000000012",
        node: "db-2",
        secretHash: "b2",
        createdAt: at(0),
        expiresAt: at(60),
      });
      await store.nodes.enrol("db-1", {
        signingKey: "sig",
        overlayKey: "ovl",
        brokerUser: "UABC",
        profile: '{"cpu":2}',
        at: at(1),
      });
      await store.nodes.touch(
        new Map([
          ["db-1", at(30)],
          ["db-2", at(31)],
        ]),
      );
      await store.nodes.touch(new Map([["db-1", at(20)]]));
      const db1 = await store.nodes.get("db-1");
      assert.equal(db1?.state, "enrolled");
      assert.equal(db1?.signingKey, "sig");
      assert.equal(db1?.lastSeen, at(30));
      assert.equal((await store.nodes.get("db-2"))?.lastSeen, at(31));
      // `declare --all` reads the enrolled names alone, in name order (other tests' nodes share this store).
      const enrolledNames = await store.nodes.namesIn("enrolled");
      const invitedNames = await store.nodes.namesIn("invited");
      assert.ok(enrolledNames.includes("db-1") && !enrolledNames.includes("db-2"), enrolledNames.join(", "));
      assert.ok(invitedNames.includes("db-2") && !invitedNames.includes("db-1"), invitedNames.join(", "));
      assert.deepEqual(enrolledNames, [...enrolledNames].sort());
      // A roll-out and the liveness watch read the enrolled fleet alone, with what they use of each node.
      const fleet = await store.nodes.fleet();
      assert.deepEqual(
        fleet.map((node) => node.name),
        enrolledNames,
        "the fleet is the enrolled nodes, in name order",
      );
      assert.deepEqual(
        fleet.find((node) => node.name === "db-1"),
        { name: "db-1", profile: '{"cpu":2}', overlayKey: "ovl", lastSeen: at(30), declarationSequence: 0 },
      );
      await assert.rejects(
        store.nodes.enrol("nobody", {
          signingKey: "s",
          overlayKey: "o",
          brokerUser: null,
          profile: "{}",
          at: at(1),
        }),
        /no record or is retired/,
      );
    });

    test("declarations — concurrent sequence allocation hands out each number once", async () => {
      await store.tokens.issue({
        id: "tok_000000000013",
        node: "seq-1",
        secretHash: "b3",
        createdAt: at(0),
        expiresAt: at(60),
      });
      const sequences = await Promise.all(
        Array.from({ length: 30 }, () => store.nodes.nextDeclarationSequence("seq-1")),
      );
      assert.deepEqual(
        [...sequences].sort((a, b) => a - b),
        Array.from({ length: 30 }, (_, i) => i + 1),
      );
      await assert.rejects(store.nodes.nextDeclarationSequence("no-such-node"), /no node named no-such-node/);
    });

    test("nodes — a batch with an unknown or retired node allocates nothing, and names them", async () => {
      for (const [i, node] of ["batch-1", "batch-2", "batch-gone"].entries()) {
        await store.tokens.issue({
          id: `tok_0000000001${i}0`,
          node,
          secretHash: `c${i}`,
          createdAt: at(0),
          expiresAt: at(60),
        });
      }
      assert.deepEqual(
        await store.nodes.nextDeclarationSequences(["batch-1", "batch-2"]),
        new Map([
          ["batch-1", 1],
          ["batch-2", 1],
        ]),
      );
      assert.equal(await store.nodes.retire("batch-gone", at(5)), true);
      const refused = async (names: string[], code: string, message: RegExp) => {
        await assert.rejects(store.nodes.nextDeclarationSequences(names), (error: unknown) => {
          assert.ok(error instanceof MeshError, String(error));
          assert.equal(error.code, code);
          assert.match(error.message, message);
          return true;
        });
      };
      await refused(["batch-1", "batch-gone", "batch-2"], "node_retired", /^node batch-gone is retired$/);
      assert.equal(await store.nodes.retire("batch-2", at(6)), true);
      await refused(["batch-gone", "batch-1", "batch-2"], "node_retired", /^retired: batch-gone, batch-2$/);
      // The unknown ones are named first, whatever else is wrong.
      await refused(
        ["batch-gone", "batch-1", "nobody-1", "nobody-2"],
        "node_unknown",
        /^no node named nobody-1, nobody-2$/,
      );
      // Nothing was allocated by the refused batches: the next sequence follows the first one.
      assert.deepEqual(await store.nodes.nextDeclarationSequences(["batch-1"]), new Map([["batch-1", 2]]));
      assert.equal((await store.nodes.get("batch-2"))?.declarationSequence, 1);
      assert.equal((await store.nodes.get("batch-gone"))?.declarationSequence, 0);
      // What a command reads before it writes a revision: every node's last allocation, retired ones too.
      const allocated = await store.nodes.allocatedSequences();
      assert.deepEqual(
        ["batch-1", "batch-2", "batch-gone"].map((name) => allocated.get(name)),
        [2, 1, 0],
      );
    });

    test("declarations — the latest per node and a bounded history; digests map to their order", async () => {
      await store.tokens.issue({
        id: "tok_000000000014",
        node: "decl-1",
        secretHash: "b4",
        createdAt: at(0),
        expiresAt: at(60),
      });
      const record = async (sequence: number) =>
        store.declarations.record({
          node: "decl-1",
          sequence,
          epoch: 7,
          issuedAt: at(sequence),
          digest: `sha256:${sequence}`,
          ...keptParts(),
        });
      const orderOf = async (...sequences: number[]) =>
        Object.fromEntries(
          await store.declarations.ordersOfDigests(
            sequences.map((sequence) => ({ node: "decl-1", digest: `sha256:${sequence}` })),
          ),
        );
      for (let sequence = 1; sequence <= 5; sequence++) await record(sequence);
      assert.equal((await store.declarations.latest("decl-1"))?.sequence, 5);
      assert.deepEqual(
        (await store.declarations.history("decl-1")).map((d) => d.sequence),
        [5, 4, 3],
      );
      // The history is trimmed at every tenth declaration: sha256:1 is still kept, and still has its order.
      assert.deepEqual(await orderOf(1), { [digestKey("decl-1", "sha256:1")]: { epoch: 7, sequence: 1 } });
      for (let sequence = 6; sequence <= 10; sequence++) await record(sequence);
      assert.deepEqual(
        (await store.declarations.history("decl-1")).map((d) => d.sequence),
        [10, 9, 8],
      );
      // At the tenth, everything behind the newest three went: no order for sha256:1 or sha256:7 any more.
      assert.deepEqual(await orderOf(1, 7, 8), {
        [digestKey("decl-1", "sha256:8")]: { epoch: 7, sequence: 8 },
      });
      assert.equal(await store.declarations.latest("decl-none"), undefined);
    });

    test("declarations — many nodes recorded at once: each node's history bounded, the others' untouched", async () => {
      const nodes = ["trim-a", "trim-b", "trim-c"];
      for (const [i, node] of nodes.entries()) {
        await store.tokens.issue({
          id: `tok_00000000004${i}`,
          node,
          secretHash: `c${i}`,
          createdAt: at(0),
          expiresAt: at(60),
        });
      }
      const declaration = (node: string, sequence: number) => ({
        node,
        sequence,
        epoch: 7,
        issuedAt: at(sequence),
        digest: `sha256:${node}:${sequence}`,
        ...keptParts(),
      });
      // trim-a to its tenth in one batch (trimmed there) and on in the next; trim-b past the history but short of
      // a tenth (read to its history, not yet trimmed); trim-c once.
      await store.declarations.recordMany([
        ...[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map((sequence) => declaration("trim-a", sequence)),
        declaration("trim-b", 1),
        declaration("trim-b", 2),
        declaration("trim-b", 3),
        declaration("trim-c", 1),
      ]);
      await store.declarations.recordMany([declaration("trim-a", 11), declaration("trim-b", 4)]);
      const history = async (node: string) => (await store.declarations.history(node)).map((d) => d.sequence);
      assert.deepEqual(await history("trim-a"), [11, 10, 9]);
      assert.deepEqual(await history("trim-b"), [4, 3, 2]);
      const kept = await store.declarations.ordersOfDigests([
        { node: "trim-a", digest: "sha256:trim-a:7" },
        { node: "trim-a", digest: "sha256:trim-a:8" },
        { node: "trim-b", digest: "sha256:trim-b:1" },
      ]);
      assert.deepEqual([...kept.keys()].sort(), [
        digestKey("trim-a", "sha256:trim-a:8"),
        digestKey("trim-b", "sha256:trim-b:1"),
      ]);
      assert.deepEqual(await history("trim-c"), [1]);
    });

    test("accounts — the newest kept account is the recovery copy; history is bounded", async () => {
      await store.tokens.issue({
        id: "tok_000000000015",
        node: "acct-1",
        secretHash: "b5",
        createdAt: at(0),
        expiresAt: at(60),
      });
      assert.equal(await store.accounts.recoveryCopy("acct-1"), undefined);
      for (let n = 1; n <= 4; n++) {
        await store.accounts.keep({
          node: "acct-1",
          receivedAt: at(n),
          epoch: 1,
          sequence: n,
          reportSequence: n,
          digest: `sha256:${n}`,
          outcome: "applied",
          report: JSON.stringify({ n }),
        });
      }
      const copy = await store.accounts.recoveryCopy("acct-1");
      assert.equal(copy?.sequence, 4);
      assert.deepEqual(JSON.parse(copy?.report ?? "null"), { n: 4 });
      assert.deepEqual(
        (await store.accounts.history("acct-1")).map((a) => a.sequence),
        [4, 3, 2],
      );
    });

    /** Invites each node with a token of its own: ids `<idStem><index>`. */
    const invite = async (nodes: readonly string[], idStem: string) => {
      for (const [index, node] of nodes.entries()) {
        await store.tokens.issue({
          id: `${idStem}${index}`,
          node,
          secretHash: "c0",
          createdAt: at(0),
          expiresAt: at(60),
        });
      }
    };

    test("batches — accounts of many nodes kept at once: each node's last is its copy, each history bounded", async () => {
      const nodes = ["batch-a", "batch-b", "batch-c"];
      await invite(nodes, "tok_00000000002");
      const account = (node: string, n: number) => ({
        node,
        receivedAt: at(n),
        epoch: 1,
        sequence: n,
        reportSequence: n,
        digest: `sha256:${node}:${n}`,
        outcome: "applied",
        report: JSON.stringify({ node, n }),
      });
      // batch-a five times (two more than the history holds), batch-b twice, interleaved; batch-c never.
      await store.accounts.keepMany([
        account("batch-a", 1),
        account("batch-b", 1),
        account("batch-a", 2),
        account("batch-a", 3),
        account("batch-b", 2),
        account("batch-a", 4),
        account("batch-a", 5),
      ]);
      assert.deepEqual(
        (await store.accounts.history("batch-a")).map((a) => a.sequence),
        [5, 4, 3],
      );
      assert.deepEqual(
        (await store.accounts.history("batch-b")).map((a) => a.sequence),
        [2, 1],
      );
      const copies = await store.accounts.recoveryCopies(nodes);
      assert.deepEqual([...copies].map(([node, copy]) => [node, copy.sequence]).sort(), [
        ["batch-a", 5],
        ["batch-b", 2],
      ]);
      const standings = await store.nodes.standings([...nodes, "batch-nobody"]);
      assert.deepEqual([...standings.keys()].sort(), nodes);
      assert.deepEqual(standings.get("batch-a"), { state: "invited", enrolledAt: null, brokerUser: null });
    });

    test("batches — orders of digests and latest orders of many nodes, in a few statements", async () => {
      await invite(["order-a", "order-b"], "tok_00000000003");
      const declaration = (node: string, sequence: number, digest: string, epoch = 2) => ({
        node,
        sequence,
        epoch,
        issuedAt: at(sequence),
        digest,
        ...keptParts(),
      });
      // order-a holds the same digest twice (declared, changed, declared back): the newer counts.
      await store.declarations.recordMany([
        declaration("order-a", 1, "sha256:x"),
        declaration("order-a", 2, "sha256:y"),
        declaration("order-a", 3, "sha256:x", 3),
        declaration("order-b", 1, "sha256:y"),
      ]);
      const orders = await store.declarations.ordersOfDigests([
        { node: "order-a", digest: "sha256:x" },
        { node: "order-a", digest: "sha256:y" },
        { node: "order-b", digest: "sha256:y" },
        // Asked for, held by another node only: absent.
        { node: "order-b", digest: "sha256:x" },
      ]);
      assert.deepEqual(Object.fromEntries(orders), {
        [digestKey("order-a", "sha256:x")]: { epoch: 3, sequence: 3 },
        [digestKey("order-a", "sha256:y")]: { epoch: 2, sequence: 2 },
        [digestKey("order-b", "sha256:y")]: { epoch: 2, sequence: 1 },
      });
      const latest = await store.declarations.latestOrders(["order-a", "order-b", "order-none"]);
      assert.deepEqual(Object.fromEntries(latest), {
        "order-a": { epoch: 3, sequence: 3, issuedAt: at(3) },
        "order-b": { epoch: 2, sequence: 1, issuedAt: at(1) },
      });
      // What each was last sent, with the units it was composed from (none recorded: an empty list).
      await store.declarations.recordMany([
        { ...declaration("order-b", 2, "sha256:z", 4), units: ["motd", "web"] },
      ]);
      const sent = await store.declarations.latestSent(["order-a", "order-b", "order-none"]);
      assert.deepEqual(Object.fromEntries(sent), {
        "order-a": { epoch: 3, sequence: 3, digest: "sha256:x", units: [] },
        "order-b": { epoch: 4, sequence: 2, digest: "sha256:z", units: ["motd", "web"] },
      });
      const everyone = await store.declarations.latestSent();
      assert.deepEqual(everyone.get("order-b"), sent.get("order-b"), "the whole fleet in one read");
    });

    test("batches — counters added many at once sum per counter; a transaction commits all or nothing", async () => {
      await store.counters.addMany([
        { node: "count-1", name: "report_refused", by: 1 },
        { node: "count-1", name: "report_refused", by: 2 },
        { node: "count-1", name: "alive_refused", by: 1 },
        { node: "count-2", name: "report_refused", by: 1 },
      ]);
      await store.counters.addMany([{ node: "count-1", name: "report_refused", by: 4 }]);
      assert.deepEqual(await store.counters.of("count-1"), { report_refused: 7, alive_refused: 1 });
      assert.deepEqual(await store.counters.of("count-2"), { report_refused: 1 });

      await assert.rejects(
        store.transaction(async (tx) => {
          await tx.counters.add("count-2", "report_refused", 10);
          await tx.events.record({
            at: at(1),
            kind: "test.rolled_back",
            node: "count-2",
            epoch: null,
            detail: {},
          });
          throw new Error("the batch failed half-way");
        }),
        /half-way/,
      );
      assert.deepEqual(await store.counters.of("count-2"), { report_refused: 1 });
      assert.deepEqual(await store.events.list({ limit: 10, node: "count-2" }), []);

      await store.transaction(async (tx) => {
        await tx.counters.add("count-2", "report_refused", 10);
        await tx.events.record({
          at: at(2),
          kind: "test.committed",
          node: "count-2",
          epoch: null,
          detail: {},
        });
      });
      assert.deepEqual(await store.counters.of("count-2"), { report_refused: 11 });
      assert.deepEqual(
        (await store.events.list({ limit: 10, node: "count-2" })).map((e) => e.kind),
        ["test.committed"],
      );
    });

    test("events — recorded in order, listed newest window oldest first, filtered by node", async () => {
      await store.events.record({ at: at(1), kind: "test.one", node: "ev-1", epoch: null, detail: { a: 1 } });
      await store.events.record({ at: at(2), kind: "test.two", node: "ev-2", epoch: 3, detail: {} });
      await store.events.record({
        at: at(3),
        kind: "test.three",
        node: "ev-1",
        epoch: 3,
        detail: { b: [1] },
      });
      const ev1 = await store.events.list({ limit: 10, node: "ev-1" });
      assert.deepEqual(
        ev1.map((e) => [e.kind, e.detail]),
        [
          ["test.one", { a: 1 }],
          ["test.three", { b: [1] }],
        ],
      );
      const last = await store.events.list({ limit: 1 });
      assert.equal(last[0]?.kind, "test.three");
    });

    test("events — a roll-out chunk's sendings kept in one event with no node, read back as they were sent", async () => {
      const sent = [
        { node: "chunk-1", sequence: 4, digest: "d-one", items: 2 },
        { node: "chunk-2", sequence: 9, digest: "d-two", items: 1 },
        { node: "chunk-3", sequence: 1, digest: "d-one", items: 2 },
      ];
      await store.events.record(declarationsSentEvent(at(4), 7, sent));
      const [event] = await store.events.list({ limit: 1 });
      assert.ok(event !== undefined);
      assert.deepEqual([event.kind, event.node, event.epoch], [declarationsSentKind, null, 7]);
      const byNode = (a: { node: string }, b: { node: string }) => a.node.localeCompare(b.node);
      assert.deepEqual(declarationsSentIn(event).sort(byNode), sent);
      assert.deepEqual(
        await store.events.list({ limit: 10, node: "chunk-1" }),
        [],
        "a sending is not the node's event",
      );

      assert.throws(
        () => declarationsSentIn({ ...event, kind: "node.drift" }),
        /a node.drift event names no/,
      );
      assert.throws(
        () =>
          declarationsSentIn({
            ...event,
            detail: { nodes: 1, digests: { d: { items: 1, nodes: { a: "1" } } } },
          }),
        (error: unknown) => error instanceof StoreError && /detail is not as written/.test(error.message),
      );
      assert.throws(
        () => declarationsSentIn({ ...event, detail: { ...event.detail, nodes: 4 } }),
        /counts 4 nodes and names 3/,
      );
    });

    test("events — the retention deletes what is older than its age, then all but the newest it keeps", async () => {
      const own = await backend.fresh();
      const fresh = await openStore(own.url, options);
      try {
        for (let second = 0; second < 10; second += 1) {
          await fresh.events.record({
            at: at(second),
            kind: `test.${second}`,
            node: null,
            epoch: null,
            detail: {},
          });
        }
        assert.equal(await fresh.events.prune({ before: at(3), keepAtMost: 100 }), 3);
        assert.equal(await fresh.events.prune({ before: at(0), keepAtMost: 4 }), 3);
        assert.deepEqual(
          (await fresh.events.list({ limit: 100 })).map((event) => event.kind),
          ["test.6", "test.7", "test.8", "test.9"],
        );
        assert.equal(await fresh.events.prune({ before: at(0), keepAtMost: 4 }), 0);
      } finally {
        await fresh.close();
        await own.cleanup();
      }
    });

    test("nodes — a broker identity belongs to one node: the store refuses a second node enrolling with it", async () => {
      const own = await backend.fresh();
      const fresh = await openStore(own.url, options);
      try {
        for (const [id, node] of [
          ["tok_0000000000c1", "own-1"],
          ["tok_0000000000c2", "own-2"],
        ] as const) {
          await fresh.tokens.issue({ id, node, secretHash: id, createdAt: at(0), expiresAt: at(60) });
        }
        const enrolment = {
          signingKey: "s",
          overlayKey: "o",
          brokerUser: "USHARED",
          profile: "{}",
          at: at(1),
        };
        await fresh.nodes.enrol("own-1", enrolment);
        await assert.rejects(fresh.nodes.enrol("own-2", enrolment));
        assert.equal(await fresh.nodes.holderOfBrokerUser("USHARED"), "own-1");
        assert.equal((await fresh.nodes.get("own-2"))?.state, "invited");
        // The holder itself may enrol again with the same key (a join retried on the same machine).
        await fresh.nodes.enrol("own-1", { ...enrolment, at: at(2) });
      } finally {
        await fresh.close();
        await own.cleanup();
      }
    });

    test("controller_epoch — the floor is the highest epoch ever taken", async () => {
      assert.equal(await store.epochs.floor(), 0);
      await store.epochs.record(4, "ctl-a", at(1));
      await store.epochs.record(9, "ctl-b", at(2));
      await store.epochs.record(6, "ctl-a", at(3));
      await store.epochs.record(9, "ctl-b", at(4));
      assert.equal(await store.epochs.floor(), 9);
    });
  });
}

describe("store — opening", () => {
  test("store — a URL that is neither sqlite nor postgres is a usage error", async () => {
    await assert.rejects(openStore("mysql://x", options), UsageError);
    await assert.rejects(openStore("sqlite:", options), UsageError);
    await assert.rejects(openStore("postgres://h/db?schema=Bad-Name", options), UsageError);
  });

  test("store — an unreachable PostgreSQL is a StoreError that names the place, without the password", async () => {
    const error = await openStore("postgres://mesh:secret@127.0.0.1:1/none", options).then(
      () => assert.fail("opened a store on a closed port"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof StoreError);
    assert.match(error.message, /127\.0\.0\.1:1/);
    assert.match(error.message, /ECONNREFUSED/);
    assert.doesNotMatch(error.message, /secret/);
  });
});
