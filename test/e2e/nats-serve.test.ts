/**
 * `mesh serve` against a nats-server the operator runs (configured from `mesh broker config`): what nodes send
 * while no control plane runs is processed when one returns, exactly once in effect. Each test has its own server,
 * control plane and node (edge-1), so each passes run alone, and they run side by side.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { describe, test } from "node:test";
import { connect, headers, jwtAuthenticator } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { openNatsIdentities } from "../../src/bus/index.js";
import { decodeToken } from "../../src/link/index.js";
import { mesh, meshHost } from "../support/cli.js";
import type { OperatorBroker } from "../support/operator-broker.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

interface Shown {
  declaration: { sequence: number } | null;
  account: {
    outcome: string;
    sequence: number | null;
    report_sequence: number | null;
    received_at: string;
  } | null;
  refused: Record<string, number>;
}

/** One test's own mesh: an operator's nats-server and `mesh serve` on it, stopped when the test ends. */
async function openServe(t: TestContext) {
  const dir = tempDir("mesh-serve-");
  const data = join(dir.path, "data");
  const running: { serve?: Running; agent?: Running; server?: OperatorBroker } = {};
  t.after(async () => {
    await running.agent?.stop("SIGTERM");
    await running.serve?.stop();
    await running.server?.stop();
    dir.remove();
  });
  running.server = await startOperatorBroker(data, dir.path);
  const server = running.server;
  const url = server.url;
  const cli = (args: string[]) => mesh(["--data", data, ...args]);
  const mine = {
    dir: dir.path,
    data,
    url,
    root: join(dir.path, "root"),
    state: join(dir.path, "edge-1"),
    cli,
    show: async (): Promise<Shown> =>
      JSON.parse((await cli(["node", "show", "edge-1", "--json"])).stdout) as Shown,
    restartServer: () => server.restart(),
    get serve(): Running | undefined {
      return running.serve;
    },
    get agent(): Running | undefined {
      return running.agent;
    },
    /** Starts `mesh serve` and waits until it serves. */
    async startServe(): Promise<Running> {
      const serve = startBin("mesh", ["--data", data, "serve", "--broker", url]);
      running.serve = serve;
      await eventually("serve to start", () => (/control\.serving/.test(serve.stderr()) ? true : undefined));
      return serve;
    },
    async stopServe(): Promise<void> {
      const serve = running.serve;
      running.serve = undefined;
      if (serve === undefined) return;
      assert.equal(await serve.stop(), 0, serve.stderr());
      // The store's checkpoint thread runs from the bundle as from the sources: it would have said so by now.
      assert.doesNotMatch(serve.stderr(), /store\.checkpoint_failed/);
    },
    /** Enrols edge-1 and starts its agent. */
    async joinEdge(): Promise<void> {
      const token = JSON.parse((await cli(["token", "issue", "edge-1", "--json"])).stdout) as {
        token: string;
      };
      const joined = await meshHost(["join", token.token, "--state", mine.state]);
      assert.equal(joined.code, 0, joined.stderr);
      mkdirSync(mine.root);
      const agent = startBin("mesh-host", [
        "run",
        "--state",
        mine.state,
        "--root",
        mine.root,
        "--alive-every",
        "300ms",
      ]);
      running.agent = agent;
      // A declaration is sent to the node's subjects as it is made: a node not yet listening does not hear it, and
      // only a running control plane sends it again. The agent listens before it says it runs.
      await eventually("the agent to run", () => (/agent\.running/.test(agent.stderr()) ? true : undefined), {
        detail: mine.agentLog,
      });
    },
    /** The agent's log, for a failure's message. */
    agentLog: () => `the agent's log:\n${running.agent?.stderr() ?? "(no agent)"}`,
    /** Declares /etc/edge to edge-1; returns its sequence. */
    async declare(content: string): Promise<number> {
      const file = join(dir.path, `${content.replace(/\W/g, "-")}.yaml`);
      writeFileSync(file, `files:\n  - path: /etc/edge\n    content: ${content}\n`);
      const declared = await cli(["declare", "edge-1", "-f", file, "--json"]);
      assert.equal(declared.code, 0, declared.stderr);
      return (JSON.parse(declared.stdout) as { sequence: number }).sequence;
    },
  };
  return mine;
}

/** A serving control plane and edge-1 running, with its first declaration applied and its report kept. */
async function openServeWithEdge(t: TestContext) {
  const mesh = await openServe(t);
  await mesh.startServe();
  await mesh.joinEdge();
  const sequence = await mesh.declare("first");
  await eventually("edge-1's report to be kept", async () => {
    const s = await mesh.show();
    return s.account?.outcome === "applied" && s.account.sequence === sequence ? true : undefined;
  });
  await eventually("the agent to drop its pending report", () =>
    existsSync(join(mesh.state, "pending-report.json")) ? undefined : true,
  );
  return mesh;
}

describe("mesh serve with an operator's nats-server", { concurrency: 3 }, () => {
  test("durable ingest — a report sent while no control plane runs is kept once one returns", async (t) => {
    const m = await openServe(t);
    await m.startServe();
    await m.joinEdge();

    await m.stopServe();
    const file = join(m.dir, "decl.yaml");
    writeFileSync(file, "files:\n  - path: /etc/edge\n    content: offline\n");
    const declared = await m.cli(["declare", "edge-1", "-f", file, "--json"]);
    assert.equal(declared.code, 0, declared.stderr);
    await eventually(
      "the agent to apply",
      () => (existsSync(join(m.root, "etc", "edge")) ? true : undefined),
      {
        detail: m.agentLog,
      },
    );
    assert.equal(readFileSync(join(m.root, "etc", "edge"), "utf8"), "offline");
    assert.equal((await m.show()).account, null, "nothing is kept while no control plane runs");
    // Meanwhile the agent said alive every 300 ms; the broker keeps only the newest one per node.
    const identities = openNatsIdentities(m.data, m.url);
    const control = await identities.controlIdentity();
    const nc = await connect({
      servers: m.url,
      authenticator: jwtAuthenticator(control.jwt, new TextEncoder().encode(control.seed)),
    });
    const alives = await (await jetstreamManager(nc)).streams.info("MESH_ALIVE");
    await nc.close();
    await identities.close();
    assert.equal(alives.state.messages, 1);

    await m.startServe();
    const kept = await eventually("the report to be kept", async () => {
      const s = await m.show();
      return s.account?.outcome === "applied" ? s : undefined;
    });
    assert.equal(kept.account?.sequence, 1);
    // The control plane's receipt ends the report's pending state on the node.
    await eventually("the agent to drop its pending report", () =>
      existsSync(join(m.state, "pending-report.json")) ? undefined : true,
    );
  });

  test("durable ingest — a repeated report and a report naming another node are refused and counted", async (t) => {
    const m = await openServeWithEdge(t);
    const identity = JSON.parse(readFileSync(join(m.state, "identity.json"), "utf8")) as {
      broker: { credential: { jwt: string } };
    };
    const seed = readFileSync(join(m.state, "broker-user.nk"), "utf8").trim();
    const nc = await connect({
      servers: m.url,
      inboxPrefix: "node.edge-1.reply",
      authenticator: jwtAuthenticator(identity.broker.credential.jwt, new TextEncoder().encode(seed)),
    });
    try {
      const before = await m.show();
      const report = {
        kind: "report",
        node: "edge-1",
        epoch: 0,
        sequence: before.account?.sequence ?? 1,
        report_sequence: before.account?.report_sequence ?? 1,
        digest: "sha256:" + "0".repeat(64),
        outcome: "applied",
        items: [],
        sent_at: new Date().toISOString(),
      };
      const withId = (id: string) => {
        const h = headers();
        h.set("Nats-Msg-Id", id);
        return { headers: h };
      };
      // An older report (a replay by the node): ordering refuses it. Sent twice with one message id within the
      // window: the broker keeps one, so it is refused and counted once.
      nc.publish("mesh.report.edge-1", JSON.stringify(report), withId("replay-1"));
      nc.publish("mesh.report.edge-1", JSON.stringify(report), withId("replay-1"));
      // A body naming another node than the subject.
      nc.publish("mesh.report.edge-1", JSON.stringify({ ...report, node: "edge-2", report_sequence: 99 }));
      await nc.flush();
      const after = await eventually("both refusals to be counted", async () => {
        const s = await m.show();
        return (s.refused.report_out_of_order ?? 0) >= 1 && (s.refused.report_refused ?? 0) >= 1
          ? s
          : undefined;
      });
      assert.equal(after.refused.report_out_of_order, 1);
      assert.equal(after.refused.report_refused, 1);
      assert.deepEqual(after.account, before.account, "the recovery copy is untouched");

      // The enrolled node's own identity cannot speak for another node nor read another node's queue.
      const violations: string[] = [];
      const watching = (async () => {
        for await (const status of nc.status()) {
          if (status.type === "error") violations.push(status.error.message);
          if (violations.length === 2) return;
        }
      })();
      nc.publish("mesh.report.edge-2", JSON.stringify({ ...report, node: "edge-2" }));
      nc.subscribe("node.edge-2.>");
      await nc.flush();
      // Both refusals come as errors on the status stream; the deadline only guards against a hang.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([watching, new Promise((resolve) => (timer = setTimeout(resolve, 60_000)))]);
      clearTimeout(timer);
      assert.equal(violations.length, 2, violations.join("; "));
      assert.match(violations.join("\n"), /Publish to "mesh\.report\.edge-2"/);
      assert.match(violations.join("\n"), /Subscription to "node\.edge-2\.>"/);
    } finally {
      await nc.close();
    }
  });

  test("reconnection — after a broker restart the agent and the control plane carry on without a person", async (t) => {
    const m = await openServeWithEdge(t);
    // A revoked token whose revocation the restarted server's own config does not know.
    const revoked = decodeToken(
      (JSON.parse((await m.cli(["token", "issue", "edge-9", "--json"])).stdout) as { token: string }).token,
    );
    assert.equal((await m.cli(["token", "revoke", revoked.id])).code, 0);
    await m.restartServer();
    const file = join(m.dir, "after-restart.yaml");
    writeFileSync(file, "files:\n  - path: /etc/edge\n    content: after the restart\n");
    const declared = await eventually("the broker to take a declaration again", async () => {
      const run = await m.cli(["declare", "edge-1", "-f", file, "--json"]);
      return run.code === 0 ? (JSON.parse(run.stdout) as { sequence: number }) : undefined;
    });
    await eventually("the reconnected agent to apply it", () =>
      readFileSync(join(m.root, "etc", "edge"), "utf8") === "after the restart" ? true : undefined,
    );
    const kept = await eventually("the reconnected control plane to keep the report", async () => {
      const s = await m.show();
      return s.account?.sequence === declared.sequence && s.account.outcome === "applied" ? s : undefined;
    });
    assert.equal(kept.account?.outcome, "applied");
    assert.match(
      m.agent?.stderr() ?? "",
      /"event":"broker\.disconnected"/,
      "the agent says it lost the broker",
    );
    assert.match(m.agent?.stderr() ?? "", /"event":"broker\.reconnected"/, "and that it is back");

    // The control plane told the restarted server its revocations again.
    assert.equal(revoked.broker?.credential.type, "nats");
    if (revoked.broker?.credential.type !== "nats") return;
    const { jwt, seed } = revoked.broker.credential;
    await eventually("the revoked token to be refused again", () =>
      connect({
        servers: m.url,
        reconnect: false,
        authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
      }).then(
        async (nc) => {
          await nc.close();
          return undefined;
        },
        (error: unknown) => (/authorization|revoked/i.test(String(error)) ? true : undefined),
      ),
    );
  });

  test("enrolment — the control plane answers only in the requester's own reply space", async (t) => {
    const m = await openServeWithEdge(t);
    const token = decodeToken(
      (JSON.parse((await m.cli(["token", "issue", "edge-5", "--json"])).stdout) as { token: string }).token,
    );
    if (token.broker?.credential.type !== "nats") throw new Error("a NATS token was expected");
    const { jwt, seed } = token.broker.credential;
    const nc = await connect({
      servers: m.url,
      inboxPrefix: "node.edge-5.reply",
      authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
    });
    try {
      const before = await m.show();
      // A well-formed enrolment whose reply subject points at another node's queue.
      nc.publish("mesh.enrol.edge-5", JSON.stringify({ kind: "enrol" }), {
        reply: "node.edge-1.declaration",
      });
      await nc.flush();
      await eventually("the control plane to log the foreign reply subject", () =>
        /enrol\.foreign_reply_subject/.test(m.serve?.stderr() ?? "") ? true : undefined,
      );
      const after = await m.show();
      assert.deepEqual(after.refused, before.refused, "nothing reached edge-1's queue");
      const tokens = JSON.parse((await m.cli(["token", "list", "--json"])).stdout) as Array<{
        id: string;
        status: string;
      }>;
      assert.equal(
        tokens.find((one) => one.id === token.id)?.status,
        "valid",
        "the request was not even read",
      );
    } finally {
      await nc.close();
    }
  });

  test("streams — a node naming the JetStream API as its reply subject gets nothing done there", async (t) => {
    const m = await openServeWithEdge(t);
    const identity = JSON.parse(readFileSync(join(m.state, "identity.json"), "utf8")) as {
      broker: { credential: { jwt: string } };
    };
    const seed = readFileSync(join(m.state, "broker-user.nk"), "utf8").trim();
    const node = await connect({
      servers: m.url,
      authenticator: jwtAuthenticator(identity.broker.credential.jwt, new TextEncoder().encode(seed)),
    });
    const identities = openNatsIdentities(m.data, m.url);
    const control = await identities.controlIdentity();
    const admin = await connect({
      servers: m.url,
      authenticator: jwtAuthenticator(control.jwt, new TextEncoder().encode(control.seed)),
    });
    try {
      const jsm = await jetstreamManager(admin);
      // Stop the control plane so the streams hold what nodes send.
      await m.stopServe();
      // The consumer the control plane made for itself, which a node would most like to delete.
      const consumers: string[] = [];
      for await (const info of jsm.consumers.list("MESH_CONTROL")) consumers.push(info.name);
      assert.equal(consumers.length, 1, `one consumer of the report stream: ${consumers.join(", ")}`);
      const consumer = consumers[0] ?? "";
      node.publish(
        "mesh.alive.edge-1",
        JSON.stringify({ kind: "alive", node: "edge-1", sent_at: new Date().toISOString() }),
      );
      node.publish("mesh.report.edge-1", "{}", { reply: "$JS.API.STREAM.PURGE.MESH_ALIVE" });
      node.publish("mesh.alive.edge-1", "{}", { reply: "$JS.API.STREAM.PURGE.MESH_CONTROL" });
      node.publish("mesh.report.edge-1", "{}", { reply: `$JS.API.CONSUMER.DELETE.MESH_CONTROL.${consumer}` });
      await node.flush();
      // The two reports are in the stream, so what was sent with them has been through the server; then a moment
      // more for anything they might wrongly have set off.
      await eventually("the server to hold the two reports", async () =>
        (await jsm.streams.info("MESH_CONTROL")).state.messages >= 2 ? true : undefined,
      );
      await new Promise((resolve) => setTimeout(resolve, 500));
      assert.ok(
        (await jsm.streams.info("MESH_ALIVE")).state.messages >= 1,
        "the alive stream was not purged",
      );
      assert.ok(
        (await jsm.streams.info("MESH_CONTROL")).state.messages >= 2,
        "the report stream was not purged",
      );
      assert.equal(
        (await jsm.consumers.info("MESH_CONTROL", consumer)).name,
        consumer,
        "the consumer is still there",
      );
    } finally {
      await node.close();
      await admin.close();
      await identities.close();
    }
  });
});
