/**
 * `sendDeclarations` sends a chunk at a time. When the broker goes away part-way, or the lease moves on, the error says
 * how far the declaration got, and the store says the same, on either broker: the chunks sent are in the audit trail,
 * the chunk being sent is recorded (its nodes get it when they next say they are behind), and nothing after it was
 * recorded.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { ControlBus } from "../../src/bus/index.js";
import type { DeclareContext } from "../../src/control/declarations.js";
import { declarationChunk, sendDeclarations } from "../../src/control/declarations.js";
import { MeshError } from "../../src/errors.js";
import { itemsDigest, itemsOfContents } from "../../src/link/index.js";
import { loadOrCreateSigningKey } from "../../src/keys/index.js";
import type { Store } from "../../src/store/index.js";
import { declarationsSentIn, declarationsSentKind, openStore } from "../../src/store/index.js";
import { enrolled } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";
import type { Transport } from "../support/transports.js";
import { transports } from "../support/transports.js";

for (const { name, open } of transports)
  describe(`declare (${name}) — a fleet's declaration stopped part-way`, () => {
    const dir = tempDir(`mesh-declare-part-${name}-`);
    let transport: Transport;
    const nodes = Array.from(
      { length: 2 * declarationChunk + 100 },
      (_, i) => `n-${String(i).padStart(4, "0")}`,
    );
    const items = itemsOfContents({ files: [{ type: "file", path: "/etc/fleet", content: "everyone\n" }] });
    const targets = nodes.map((node) => ({ node, items, digest: itemsDigest(items), units: ["fleet"] }));
    /** The chunks, as the failures tell them: two whole ones and what is left. */
    const first = `${declarationChunk} of ${nodes.length} nodes \\(${nodes[0]} to ${nodes[declarationChunk - 1]}\\)`;
    const second = `${declarationChunk} more \\(${nodes[declarationChunk]} to ${nodes[2 * declarationChunk - 1]}\\)`;
    const signing = () => loadOrCreateSigningKey(join(dir.path, "keys"));

    before(async () => {
      transport = await open();
    });
    after(async () => {
      await transport.stop();
      dir.remove();
    });

    /** A fresh store with the whole fleet enrolled. */
    async function fleet(name: string): Promise<Store> {
      const store = await openStore(`sqlite:${join(dir.path, `${name}.db`)}`, { historyLimit: 50 });
      for (const node of nodes) await enrolled(store, node, new Date());
      return store;
    }

    async function failureOf(context: DeclareContext): Promise<MeshError> {
      const failure = await sendDeclarations(context, targets, 1).then(
        () => undefined,
        (error: unknown) => error,
      );
      assert.ok(failure instanceof MeshError, `declaring failed with a MeshError, not ${String(failure)}`);
      return failure;
    }

    /** The nodes the audit trail says were sent, one `declarations.sent` event a chunk. */
    async function sentEvents(store: Store): Promise<{ events: number; nodes: string[] }> {
      const events = (await store.events.list({ limit: 10_000 })).filter(
        (event) => event.kind === declarationsSentKind,
      );
      return {
        events: events.length,
        nodes: events.flatMap((event) => declarationsSentIn(event).map(({ node }) => node)),
      };
    }

    test("declare — the connection closed before the second chunk: the first sent, the second recorded to catch up, the rest not begun", async () => {
      const store = await fleet("broker-lost");
      const side = await transport.openControl();
      let sends = 0;
      // The real control bus, whose connection is closed just before the second chunk is sent.
      const bus = new Proxy(side.bus, {
        get(target, property, receiver) {
          if (property !== "publishDeclarations") return Reflect.get(target, property, receiver) as unknown;
          return async (batch: Parameters<ControlBus["publishDeclarations"]>[0]) => {
            if (++sends === 2) await side.close();
            await target.publishDeclarations(batch);
          };
        },
      });
      try {
        const failure = await failureOf({ store, signing: signing(), bus, now: () => new Date() });
        assert.equal(failure.code, "declared_in_part");
        assert.match(
          failure.message,
          new RegExp(
            `^the declaration was sent to ${first}; ${second} are recorded and are sent when their alives say they ` +
              "hold an older one; 100 were not declared; then it failed: ",
          ),
        );
        assert.deepEqual(
          await sentEvents(store),
          { events: 1, nodes: nodes.slice(0, declarationChunk) },
          "the audit trail holds the first chunk's sending, in one event, and no other",
        );
        assert.equal((await store.declarations.latest(nodes[0] ?? ""))?.sequence, 1);
        assert.equal(
          (await store.declarations.latest(nodes[declarationChunk] ?? ""))?.sequence,
          1,
          "the chunk being sent is recorded",
        );
        assert.equal(
          await store.declarations.latest(nodes.at(-1) ?? ""),
          undefined,
          "the last chunk was not begun",
        );
      } finally {
        await store.close();
      }
    });

    test("declare — the lease moves on after the first chunk: nothing more is recorded or sent under the old epoch", async () => {
      const store = await fleet("lease-moved");
      const side = await transport.openControl();
      let asked = 0;
      try {
        const failure = await failureOf({
          store,
          signing: signing(),
          bus: side.bus,
          now: () => new Date(),
          gate: () => ++asked === 1,
        });
        assert.equal(failure.code, "declared_in_part");
        assert.match(
          failure.message,
          new RegExp(
            `^the declaration was sent to ${first}; ${declarationChunk + 100} were not declared; then it failed: ` +
              "the lease no longer stands at epoch 1",
          ),
        );
        assert.equal(asked, 2, "the gate is asked before each chunk");
        assert.deepEqual(await sentEvents(store), { events: 1, nodes: nodes.slice(0, declarationChunk) });
        assert.equal(await store.declarations.latest(nodes[declarationChunk] ?? ""), undefined);
      } finally {
        await side.close();
        await store.close();
      }
    });
  });
