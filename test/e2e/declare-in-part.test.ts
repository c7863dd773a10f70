/**
 * `declareMany` sends a chunk at a time. When the broker goes away part-way, the error says how far the declaration
 * got, and the store says the same: the chunks sent are in the audit trail, and nothing after the failed chunk was
 * recorded at all.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { ControlBus, ControlSide } from "../../src/bus/index.js";
import { declarationChunk, declareMany } from "../../src/control/declarations.js";
import { MeshError } from "../../src/errors.js";
import { loadOrCreateSigningKey } from "../../src/keys/index.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { enrolled } from "../support/stores.js";
import { tempDir } from "../support/tmp.js";
import type { Transport } from "../support/transports.js";
import { natsTransport } from "../support/transports.js";

describe("declare — a broker lost part-way through a fleet", () => {
  const dir = tempDir("mesh-declare-part-");
  let transport: Transport;
  let store: Store;
  let side: ControlSide;
  const nodes = Array.from(
    { length: 2 * declarationChunk + 100 },
    (_, i) => `n-${String(i).padStart(4, "0")}`,
  );

  before(async () => {
    transport = await natsTransport();
    store = await openStore(`sqlite:${join(dir.path, "mesh.db")}`, { historyLimit: 50 });
    for (const node of nodes) await enrolled(store, node, new Date());
    side = await transport.openControl();
  });
  after(async () => {
    await side.close();
    await store.close();
    await transport.stop();
    dir.remove();
  });

  test("declare — the connection closed after the first chunk: the error and the audit trail say 250 reached", async () => {
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
    const signing = loadOrCreateSigningKey(join(dir.path, "keys"));
    const files = [{ path: "/etc/fleet", content: "everyone\n" }];
    const failure = await declareMany({ store, signing, bus, now: () => new Date() }, nodes, files, 1).then(
      () => undefined,
      (error: unknown) => error,
    );
    assert.ok(failure instanceof MeshError, `declaring failed with a MeshError, not ${String(failure)}`);
    assert.equal(failure.code, "declared_in_part");
    assert.match(
      failure.message,
      new RegExp(
        `reached ${declarationChunk} of ${nodes.length} nodes \\(n-0000 to n-0249\\) and then failed`,
      ),
    );
    const sent = (await store.events.list({ limit: 10_000 })).filter((e) => e.kind === "declaration.sent");
    assert.deepEqual(
      sent.map((event) => event.node).sort(),
      nodes.slice(0, declarationChunk),
      "the audit trail holds the first chunk's sending, and no other",
    );
    assert.equal((await store.declarations.latest(nodes[0] ?? ""))?.sequence, 1);
    assert.equal(
      await store.declarations.latest(nodes.at(-1) ?? ""),
      undefined,
      "the last chunk was not begun",
    );
  });
});
