/**
 * The agent sends a pending report again at an alive only once it has waited a whole interval for its receipt: an
 * alive that falls just after a report does not send it twice, and a report the broker did not take goes again at
 * the next alive. Driven by the agent's own clock and its interval timer, over a bus that records what it is given.
 */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, mock, test } from "node:test";
import type { NodeBus } from "../../src/bus/index.js";
import { Agent } from "../../src/host/agent.js";
import { HostState, memoryStorage } from "../../src/host/state.js";
import type { StateStorage } from "../../src/host/state.js";
import {
  encodeSigningPublicKey,
  fingerprint,
  generateSigningKeyPair,
  sealDeclaration,
} from "../../src/keys/index.js";
import { encodeMessage, itemsDigest } from "../../src/link/index.js";
import { MemoryApplier } from "../../src/lab/memory-applier.js";
import { createLogger } from "../../src/log.js";

const node = "edge-1";
const everyMs = 1000;
const signer = generateSigningKeyPair();

function declaration(sequence: number): Uint8Array {
  const items = [{ id: "file:/etc/x", type: "file" as const, path: "/etc/x", content: `v${sequence}\n` }];
  const bytes = encodeMessage({
    kind: "declaration",
    node,
    epoch: 1,
    sequence,
    issued_at: new Date().toISOString(),
    items,
    digest: itemsDigest(items),
  });
  return encodeMessage(sealDeclaration(bytes, signer.privateKey, fingerprint(signer.publicKey)));
}

describe("agent — a pending report sent again", () => {
  let now = 0;
  let refuse = false;
  const reports: string[] = [];
  let alives = 0;
  let agent: Agent;
  let storage: StateStorage;

  beforeEach(async () => {
    mock.timers.enable({ apis: ["setInterval"] });
    now = 0;
    refuse = false;
    reports.length = 0;
    alives = 0;
    storage = memoryStorage();
    new HostState("/state", storage).saveIdentity({
      node,
      queue: "mesh.node.edge-1",
      broker: { url: "nats://127.0.0.1:4222", credential: { type: "nats", jwt: "aaa.bbb.ccc" } },
      signing_key: encodeSigningPublicKey(signer.publicKey),
      fingerprint: fingerprint(signer.publicKey),
      joined_at: new Date().toISOString(),
    });
    const bus = {
      publishReport: (body: Uint8Array) => {
        if (refuse) return Promise.reject(new Error("the broker is away"));
        const report = JSON.parse(Buffer.from(body).toString()) as { node: string; report_sequence: number };
        reports.push(`${report.node}:${report.report_sequence}`);
        return Promise.resolve();
      },
      publishAlive: () => {
        alives++;
        return Promise.resolve();
      },
      consumeNode: () => new Promise<void>(() => undefined),
      closed: () => new Promise<Error | undefined>(() => undefined),
      close: () => Promise.resolve(),
    } as unknown as NodeBus;
    agent = new Agent({
      stateDir: "/state",
      root: "/nonexistent",
      aliveEveryMs: everyMs,
      log: createLogger({ level: "error" }),
      storage,
      applier: new MemoryApplier(),
      openBus: () => Promise.resolve(bus),
      clock: () => now,
    });
    await new Promise<void>((ready) => void agent.run(ready));
  });
  afterEach(() => mock.timers.reset());

  /** The next alive: the interval timer fires at `at`. */
  async function aliveAt(at: number): Promise<void> {
    now = at;
    mock.timers.tick(everyMs);
    // The tick's sends are promise chains: let them settle.
    for (let i = 0; i < 10; i++) await Promise.resolve();
  }

  test("agent — an alive just after a report does not repeat it; one a whole interval later does", async () => {
    now = 900;
    await agent.handle(declaration(1));
    assert.deepEqual(reports, ["edge-1:1"]);
    await aliveAt(1000);
    assert.deepEqual(reports, ["edge-1:1"], "sent 100 ms before this alive: not again");
    await aliveAt(2000);
    assert.deepEqual(reports, ["edge-1:1", "edge-1:1"], "waited 1,100 ms: sent again");
    await agent["receive"](encodeMessage({ kind: "receipt", node, report_sequence: 1, verdict: "kept" }));
    await aliveAt(3000);
    assert.equal(reports.length, 2, "receipted: never again");
    assert.ok(alives >= 4, `an alive every interval (${alives})`);
  });

  test("agent — only its newest report is pending: a receipt for an older one changes nothing", async () => {
    // What the control plane relies on when it answers a batch with one receipt per node, for its newest report.
    now = 900;
    await agent.handle(declaration(1));
    await agent.handle(declaration(2));
    assert.deepEqual(reports, ["edge-1:1", "edge-1:2"]);
    await agent["receive"](encodeMessage({ kind: "receipt", node, report_sequence: 1, verdict: "kept" }));
    await aliveAt(2000);
    assert.deepEqual(
      reports,
      ["edge-1:1", "edge-1:2", "edge-1:2"],
      "the newest, and only it, is still pending",
    );
    await agent["receive"](encodeMessage({ kind: "receipt", node, report_sequence: 2, verdict: "kept" }));
    await aliveAt(3000);
    await aliveAt(4000);
    assert.equal(reports.length, 3, "its receipt ends it");
  });

  test("agent — a report the broker did not take goes again at the next alive", async () => {
    now = 900;
    refuse = true;
    await agent.handle(declaration(1));
    assert.deepEqual(reports, []);
    refuse = false;
    await aliveAt(1000);
    assert.deepEqual(reports, ["edge-1:1"]);
  });

  test("agent — the pending report's file is the truth: rewritten, it is what is sent again and what a receipt ends", async () => {
    // The agent keeps the report it composed (its sequence, its bytes) only while the file holds that very text.
    now = 900;
    await agent.handle(declaration(1));
    assert.deepEqual(reports, ["edge-1:1"]);
    const state = new HostState("/state", storage);
    const kept = state.loadSecret("pending-report.json");
    assert.ok(kept !== undefined, "the report is pending");
    const rewritten = JSON.stringify({ ...(JSON.parse(kept) as object), report_sequence: 7 });
    state.saveSecret("pending-report.json", rewritten);
    await aliveAt(2000);
    assert.deepEqual(reports, ["edge-1:1", "edge-1:7"], "the file's report went again, not the one composed");
    await agent["receive"](encodeMessage({ kind: "receipt", node, report_sequence: 1, verdict: "kept" }));
    assert.equal(
      state.loadSecret("pending-report.json"),
      rewritten,
      "a receipt for the report composed ends nothing",
    );
    await agent["receive"](encodeMessage({ kind: "receipt", node, report_sequence: 7, verdict: "kept" }));
    assert.equal(state.loadSecret("pending-report.json"), undefined, "the file's report's receipt ends it");
  });
});
