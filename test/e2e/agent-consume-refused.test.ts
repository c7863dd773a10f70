/**
 * An agent whose broker refuses the node's own subscription while the connection stays open ends `run()` with that
 * refusal: the process is not ended by a failure nobody waited for. Tried from the attacker's side on the real
 * broker: a node's bus opened with another node's identity, so the broker refuses to let it read the node's queue.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Agent } from "../../src/host/agent.js";
import { HostState, memoryStorage } from "../../src/host/state.js";
import { encodeSigningPublicKey, fingerprint, generateSigningKeyPair } from "../../src/keys/index.js";
import { MemoryApplier } from "../../src/lab/memory-applier.js";
import { MeshError } from "../../src/errors.js";
import { createLogger } from "../../src/log.js";
import type { Transport } from "../support/transports.js";
import { transports } from "../support/transports.js";

for (const { name, open } of transports) {
  describe(`agent — its subscription refused while connected (${name})`, () => {
    let transport: Transport;
    before(async () => {
      transport = await open();
    });
    after(async () => {
      await transport.stop();
    });

    test(`agent (${name}) — a node reading its queue with another node's identity ends run() with the refusal`, async () => {
      const signer = generateSigningKeyPair();
      const storage = memoryStorage();
      const own = await transport.nodeFor("edge-1");
      new HostState("/state", storage).saveIdentity({
        node: "edge-1",
        queue: "mesh.node.edge-1",
        broker: { url: transport.nodeUrl, credential: own.credential },
        signing_key: encodeSigningPublicKey(signer.publicKey),
        fingerprint: fingerprint(signer.publicKey),
        joined_at: new Date().toISOString(),
      });
      const other = await transport.nodeFor("edge-2");
      const agent = new Agent({
        stateDir: "/state",
        root: "/nonexistent",
        aliveEveryMs: 60_000,
        log: createLogger({ level: "error" }),
        storage,
        applier: new MemoryApplier(),
        // edge-2's identity may read edge-2's queue only: the broker refuses edge-1's, and keeps the connection.
        openBus: () => transport.openNode("edge-1", other),
      });
      const ended = await agent.run().then(
        () => undefined,
        (error: unknown) => error,
      );
      assert.ok(ended instanceof MeshError, `run() ended with a MeshError, not ${String(ended)}`);
      assert.equal(ended.code, "identity_refused");
      assert.match(ended.message, /node edge-1 was retired, or joined again elsewhere/);
    });
  });
}
