/**
 * What the acting control plane remembers it sent each node stands only while it names the node's newest
 * declaration: a sequence allocated since, by a roll-out that failed before it recorded or by another writer, and
 * another epoch, each send the node back to the store. Run against both stores; the store's own `latestSent` is
 * the answer each reading must equal.
 */
import assert from "node:assert/strict";
import { before, describe, test } from "node:test";
import type { SentDeclaration } from "../../src/control/declarations.js";
import { readFleet } from "../../src/control/plans.js";
import { SentMemory } from "../../src/control/sent-memory.js";
import type { LatestSent, NewDeclaration, Store } from "../../src/store/index.js";
import { enrolled, freshStoreForSuite, keptParts, storeBackends } from "../support/stores.js";

const nodes = ["m-1", "m-2", "m-3", "m-4"];

for (const backend of storeBackends) {
  describe(`sent memory — ${backend.name}`, () => {
    let store: Store;
    freshStoreForSuite(backend, { historyLimit: 10 }, (opened) => (store = opened));
    // Each test reads the whole fleet, whatever an earlier one declared: they share the nodes, not an order.
    before(async () => {
      for (const node of nodes) await enrolled(store, node, new Date());
    });

    /** Records a declaration for each node at its next sequence, as a roll-out under `epoch` does. */
    async function declare(
      names: readonly string[],
      epoch: number,
      digest: string,
    ): Promise<SentDeclaration[]> {
      const sequences = await store.nodes.nextDeclarationSequences(names);
      const kept: NewDeclaration[] = names.map((node) => ({
        node,
        sequence: sequences.get(node) ?? 0,
        epoch,
        issuedAt: new Date().toISOString(),
        digest,
        ...keptParts(),
        units: [`unit-${digest}`],
      }));
      await store.declarations.recordMany(kept);
      return kept.map(({ node, sequence }) => ({ node, sequence, epoch, digest }));
    }

    /**
     * What `memory` reads under `epoch`, checked to be what the store itself holds, and how many times it read every
     * node's latest declaration from the store to answer.
     */
    async function readOf(
      memory: SentMemory,
      epoch: number,
    ): Promise<{ read: Map<string, LatestSent>; reads: number }> {
      let reads = 0;
      const declarations = new Proxy(store.declarations, {
        get(target, property, receiver) {
          const value = Reflect.get(target, property, receiver) as unknown;
          if (property !== "latestSent" || typeof value !== "function") return value;
          return (...args: unknown[]) => {
            reads++;
            return (value as (...a: unknown[]) => unknown).apply(target, args);
          };
        },
      });
      const counting = Object.assign(Object.create(store) as Store, { declarations });
      const sequences = (await readFleet(store, new Date(), 60_000)).declarationSequences ?? new Map();
      const read = await memory.read(counting, epoch, sequences);
      assert.deepEqual(read, await store.declarations.latestSent(), "what the store holds");
      return { read, reads };
    }

    const units = (sent: readonly SentDeclaration[], digest: string) =>
      new Map(sent.map(({ node }) => [node, [`unit-${digest}`]]));

    test("reads what the store holds, remembers a roll-out's sending, and goes back to the store only for what moved", async () => {
      const memory = new SentMemory();
      // The first reading of an epoch: what the store holds (checked by `readOf`), whatever an earlier test declared.
      await readOf(memory, 7);

      const sent = await declare(nodes, 7, "a");
      memory.remember(7, sent, units(sent, "a"));
      assert.equal((await readOf(memory, 7)).reads, 0, "what the roll-out sent is remembered");

      // Another writer declares to m-2; a failed roll-out allocates m-3 a sequence and records nothing.
      await declare(["m-2"], 7, "b");
      await store.nodes.nextDeclarationSequences(["m-3"]);
      const { read, reads } = await readOf(memory, 7);
      assert.equal(read.get("m-2")?.digest, "b", "the other writer's declaration is read");
      assert.equal(
        read.get("m-3")?.digest,
        "a",
        "the node whose declaration was not recorded keeps its last",
      );
      assert.equal(reads, 1, "the nodes that moved are read, once");
      assert.equal(
        (await readOf(memory, 7)).reads,
        1,
        "m-3's sequence still names nothing recorded: it is read again",
      );
    });

    test("another epoch forgets everything, and a sending remembered under an epoch not read is not kept", async () => {
      const memory = new SentMemory();
      await readOf(memory, 8);
      const sent = await declare(nodes, 8, "c");
      memory.remember(8, sent, units(sent, "c"));
      const next = await readOf(memory, 9);
      assert.equal(next.reads, 1, "a new epoch reads the store");
      assert.equal(next.read.get("m-1")?.digest, "c");

      const stale = await declare(["m-1"], 8, "d");
      memory.remember(8, stale, units(stale, "d"));
      const after = await readOf(memory, 9);
      assert.equal(
        after.read.get("m-1")?.digest,
        "d",
        "read from the store, not taken from the earlier epoch's sending",
      );
      assert.equal(after.reads, 1);
    });
  });
}
