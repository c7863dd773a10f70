/**
 * Attacks by nodes and token holders on a real operator-mode nats-server under `mesh serve`, each tried as an
 * attacker would try it (a raw connection with the identity the attacker really holds) and each shown to fail:
 * a token reading its node's declarations, one node silencing another's reports by message id, a node borrowing
 * another's broker identity, a report about a declaration never sent, and floods that would fill disk and log.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { connect, headers, jwtAuthenticator } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { openEnrolmentSide, openNatsIdentities } from "../../src/bus/index.js";
import { busyWithNode } from "../../src/link/index.js";
import { TokenRefused } from "../../src/errors.js";
import { HostState } from "../../src/host/state.js";
import { decodeToken, encodeMessage, parseEnrolReply } from "../../src/link/index.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import type { OperatorBroker } from "../support/operator-broker.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { askWrongEverywhere } from "../support/hostile.js";
import { eventually, startBin } from "../support/processes.js";
import { operatorOf } from "../support/operator.js";
import { tempDir } from "../support/tmp.js";

describe("attacks from nodes on NATS", () => {
  const dir = tempDir("mesh-attacks-nats-");
  const data = join(dir.path, "data");
  let server: OperatorBroker;
  let serve: Running;
  let store: Store;
  const operator = operatorOf(data, dir.path);
  const { cli, show, issue, joinAndRun, declare, applied } = operator;
  /** A raw connection with the identity a joined machine holds: what an attacker on that machine has. */
  const connectAs = async (node: string): Promise<NatsConnection> => {
    const state = join(dir.path, node);
    const identity = JSON.parse(readFileSync(join(state, "identity.json"), "utf8")) as {
      broker: { credential: { jwt: string } };
    };
    const seed = readFileSync(join(state, "broker-user.nk"), "utf8").trim();
    return connect({
      servers: server.url,
      inboxPrefix: `node.${node}.reply`,
      reconnect: false,
      authenticator: jwtAuthenticator(identity.broker.credential.jwt, new TextEncoder().encode(seed)),
    });
  };
  const report = (node: string, fields: Record<string, unknown>) =>
    JSON.stringify({
      kind: "report",
      node,
      digest: `sha256:${"0".repeat(64)}`,
      outcome: "applied",
      items: [],
      sent_at: new Date().toISOString(),
      ...fields,
    });

  before(async () => {
    server = await startOperatorBroker(data, dir.path);
    serve = startBin("mesh", ["--data", data, "serve", "--broker", server.url]);
    await eventually("serve to start", () => (/control\.serving/.test(serve.stderr()) ? true : undefined));
    store = await openStore(`sqlite:${join(data, "mesh.db")}`, { historyLimit: 50 });
  });
  after(async () => {
    await operator.stopAgents();
    await serve.stop();
    await store.close();
    await server.stop();
    dir.remove();
  });

  test("attack — a token for an enrolled node cannot read that node's declarations", async () => {
    await joinAndRun("tok-1");
    // The re-join of a rebuilt machine: a valid, unused token for a node that is enrolled.
    const token = decodeToken(await issue("tok-1"));
    assert.ok(token.broker !== null && token.broker.credential.type === "nats");
    const credential = token.broker.credential;
    const nc = await connect({
      servers: server.url,
      inboxPrefix: "node.tok-1.reply",
      reconnect: false,
      authenticator: jwtAuthenticator(credential.jwt, new TextEncoder().encode(credential.seed)),
    });
    try {
      const refusals: string[] = [];
      const watching = (async () => {
        for await (const status of nc.status()) {
          if (status.type === "error") refusals.push(status.error.message);
        }
      })();
      const taken: string[] = [];
      const sub = nc.subscribe("node.tok-1.declaration", {
        callback: (error, msg) => {
          if (error === null) taken.push(msg.subject);
        },
      });
      await nc.flush();
      await declare("tok-1", "for the node only");
      await applied("tok-1", 1);
      await eventually("the broker to refuse the subscription", () =>
        refusals.some((text) => /Subscription to "node\.tok-1\.declaration"/.test(text)) ? true : undefined,
      );
      assert.deepEqual(taken, [], "the token's identity received no declaration");
      sub.unsubscribe();
      void watching;
    } finally {
      await nc.close();
    }
  });

  test("attack — a node publishing another node's next message id does not silence that node's report", async () => {
    await joinAndRun("ids-1");
    await joinAndRun("ids-2");
    const attacker = await connectAs("ids-1");
    try {
      // On its own subject, as permitted; the ids are those ids-2's agent would give its first reports.
      for (let sequence = 1; sequence <= 5; sequence += 1) {
        const header = headers();
        header.set("Nats-Msg-Id", `ids-2:${sequence}`);
        attacker.publish("mesh.report.ids-1", report("ids-1", { reason: "x" }), { headers: header });
      }
      await attacker.flush();
    } finally {
      await attacker.close();
    }
    await declare("ids-2", "genuine");
    const kept = await applied("ids-2", 1);
    assert.equal(kept.account?.report_sequence, 1, "the very report whose id was taken is kept");
  });

  test("attack — a second enrolment with another node's broker key is refused, and retiring it revokes nobody", async () => {
    await joinAndRun("key-1");
    const victimKey = (await store.nodes.get("key-1"))?.brokerUser;
    assert.ok(victimKey !== null && victimKey !== undefined);
    // key-4's token, presented with key-1's public key (it is public: in key-1's JWT).
    const token = decodeToken(await issue("key-4"));
    assert.ok(token.broker !== null);
    const keys = new HostState(join(dir.path, "key-4-keys")).nodeKeys();
    const bus = await openEnrolmentSide(token.broker.url, "key-4", token.broker.credential, token.secret);
    let answer: string;
    try {
      const asked = await bus.ask(
        encodeMessage({
          kind: "enrol",
          node: "key-4",
          token_id: token.id,
          secret: token.secret,
          keys: { signing: keys.signingPublicKey, overlay: keys.overlayPublicKey, broker_user: victimKey },
          profile: {
            cpu: 1,
            memory_mb: 512,
            os: "linux",
            arch: "x64",
            labels: {},
            roles: [],
            drivers: ["file"],
          },
          agent_version: "0.1.0",
          sent_at: new Date().toISOString(),
        }),
        30_000,
      );
      answer = Buffer.from(asked).toString("utf8");
    } finally {
      await bus.close();
    }
    assert.deepEqual(JSON.parse(answer), { kind: "enrol_reply", accepted: false, reason: TokenRefused.text });
    assert.equal((await store.nodes.get("key-4"))?.state, "invited");
    assert.equal((await store.nodes.get("key-1"))?.brokerUser, victimKey, "the key is still key-1's alone");

    const retired = await cli(["node", "retire", "key-4"]);
    assert.equal(retired.code, 0, retired.stderr);
    // key-1 still reaches the broker with its own identity and is still heard.
    const victim = await connectAs("key-1");
    await victim.flush();
    await victim.close();
    await declare("key-1", "still here");
    await applied("key-1", 1);
  });

  test("attack — a report about a declaration never sent is refused, and the node's genuine next report is kept", async () => {
    await joinAndRun("seq-1");
    await declare("seq-1", "first");
    await applied("seq-1", 1);
    const attacker = await connectAs("seq-1");
    try {
      attacker.publish(
        "mesh.report.seq-1",
        report("seq-1", { epoch: 99, sequence: 99, report_sequence: 99 }),
      );
      await attacker.flush();
    } finally {
      await attacker.close();
    }
    const refused = await eventually("the forged report to be refused", async () => {
      const shown = await show("seq-1");
      return (shown.refused.report_never_sent ?? 0) >= 1 ? shown : undefined;
    });
    assert.equal(refused.account?.sequence, 1, "the recovery copy is untouched");
    await declare("seq-1", "second");
    const kept = await applied("seq-1", 2);
    assert.equal(kept.refused.report_out_of_order ?? 0, 0, "the genuine report was not refused as older");
  });

  test("attack — an enrolment whose faults outgrow a reply is still answered: refused, with a reason cut to fit", async () => {
    const logBefore = serve.stderr().length;
    await askWrongEverywhere(await issue("wrong-1"), "wrong-1");
    assert.deepEqual(await store.counters.of("wrong-1"), { enrol_refused: 1 });
    assert.doesNotMatch(serve.stderr().slice(logBefore), /enrol\.answer_failed/);
  });

  test("attack — questions asking to be answered on another's subject are not read, and told once a minute", async () => {
    const token = decodeToken(await issue("astray-1"));
    assert.ok(token.broker !== null && token.broker.credential.type === "nats");
    const { jwt, seed } = token.broker.credential;
    const raw = await connect({
      servers: server.url,
      inboxPrefix: "node.astray-1.reply",
      reconnect: false,
      authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
    });
    try {
      for (let index = 0; index < 500; index += 1)
        raw.publish("mesh.enrol.astray-1", new TextEncoder().encode('{"kind":"enrol"}'), {
          reply: `mesh.report.someone-else.${index}`,
        });
      await raw.flush();
    } finally {
      await raw.close();
    }
    // A question of its own, answered, comes after them: by then the control plane has handled all 500.
    const asker = await openEnrolmentSide(
      token.broker.url,
      "astray-1",
      token.broker.credential,
      token.secret,
    );
    try {
      parseEnrolReply(await asker.ask(new TextEncoder().encode('{"kind":"enrol"}'), 60_000));
    } finally {
      await asker.close();
    }
    const told = serve
      .stderr()
      .split("\n")
      .filter((line) => line.includes("enrol.foreign_reply_subject") && line.includes("astray-1"));
    assert.equal(told.length, 1, told.join("\n"));
    assert.deepEqual(
      await store.counters.of("astray-1"),
      { enrol_refused: 1 },
      "only its own question was read",
    );
  });

  test("attack — floods of failed reports, flipping outcomes and malformed enrolments grow neither the store nor the log per message", async () => {
    await joinAndRun("flood-1");
    await declare("flood-1", "flooded");
    await applied("flood-1", 1);
    const declared = (await show("flood-1")).declaration;
    assert.ok(declared !== null);
    const dbBytes = () =>
      ["mesh.db", "mesh.db-wal"]
        .map((file) => join(data, file))
        .reduce((sum, path) => sum + (existsSync(path) ? statSync(path).size : 0), 0);
    const eventRows = async () => (await store.events.list({ limit: 1_000_000 })).length;
    const eventsBefore = await eventRows();
    const logBefore = serve.stderr().split("\n").length;
    const dbBefore = dbBytes();

    // 3,000 failed reports with a 16 KiB reason (refused by the contract), then 3,000 failed reports with a
    // reason that fits, each about the declaration really sent and each newer than the one before; then flips.
    const attacker = await connectAs("flood-1");
    const huge = "x".repeat(16 * 1024);
    /** 3,000 reports about the declaration really sent, each newer than the one before, from `first` on. */
    const publishMany = (first: number, fields: (index: number) => Record<string, unknown>) => {
      for (let index = 0; index < 3000; index += 1) {
        attacker.publish(
          "mesh.report.flood-1",
          report("flood-1", {
            epoch: declared.epoch,
            sequence: declared.sequence,
            report_sequence: first + index,
            digest: declared.digest,
            ...fields(index),
          }),
        );
      }
    };
    try {
      publishMany(1000, () => ({ outcome: "failed", reason: huge }));
      publishMany(5000, () => ({ outcome: "failed", reason: "y".repeat(500) }));
      // A change of outcome each time.
      publishMany(8000, (index) => ({
        outcome: index % 2 === 0 ? "refused" : "failed",
        reason: `z\n${index}`,
      }));
      await attacker.flush();
    } finally {
      await attacker.close();
    }
    // 5,000 malformed enrolments on a token's identity, 250 at once: each answered, the few that wait for their
    // turn read and refused, the rest told at once that the control plane is busy with this node.
    const token = decodeToken(await issue("flood-2"));
    assert.ok(token.broker !== null);
    const asker = await openEnrolmentSide(token.broker.url, "flood-2", token.broker.credential, token.secret);
    const reasons = new Map<string, number>();
    try {
      for (let first = 0; first < 5000; first += 250) {
        const answers = await Promise.all(
          Array.from({ length: 250 }, () => asker.ask(new TextEncoder().encode('{"kind":"enrol"}'), 60_000)),
        );
        for (const answer of answers) {
          const reply = parseEnrolReply(answer);
          const reason = reply.accepted
            ? "accepted"
            : reply.reason.startsWith("enrolment refused:")
              ? "read"
              : reply.reason;
          reasons.set(reason, (reasons.get(reason) ?? 0) + 1);
        }
      }
    } finally {
      await asker.close();
    }
    // The stream keeps only so many of one node's messages (its flood evicts its own older ones), so what is
    // counted is what reached the control plane; the last report sent is kept either way.
    const counted = await eventually(
      "the flood to be handled",
      async () => {
        const shown = await show("flood-1");
        return shown.account?.report_sequence === 10_999 ? shown : undefined;
      },
      120_000,
    );
    const enrolRefusals = await store.counters.of("flood-2");
    const eventsAdded = (await eventRows()) - eventsBefore;
    const logAdded = serve.stderr().split("\n").length - logBefore;
    const dbGrowth = dbBytes() - dbBefore;
    console.log(
      `floods: 9,000 reports + 5,000 enrolments → ${eventsAdded} event rows, ${logAdded} log lines, ` +
        `store +${Math.round(dbGrowth / 1024)} KiB`,
    );
    assert.ok((counted.refused.report_refused ?? 0) >= 1, "the oversized reasons are refused and counted");
    const busy = reasons.get(busyWithNode) ?? 0;
    assert.equal(reasons.get("accepted"), undefined);
    assert.equal(
      (reasons.get("read") ?? 0) + busy,
      5000,
      `every enrolment answered: ${JSON.stringify([...reasons])}`,
    );
    assert.equal(
      enrolRefusals.enrol_refused,
      reasons.get("read"),
      "every malformed enrolment read is counted",
    );
    // Told once per node and kind in the window (the busy answers with the malformed ones), and one failure event
    // for the declaration: a handful in all.
    assert.ok(eventsAdded <= 10, `${eventsAdded} events for 14,000 hostile messages`);
    assert.ok(
      logAdded <= 10,
      `${logAdded} log lines for 14,000 hostile messages:\n${serve.stderr().slice(-3000)}`,
    );
    // The failed reports that fit are kept as accounts, and the node's accounts are bounded by its history.
    assert.ok(
      (await store.accounts.history("flood-1")).length <= 51,
      "the node's accounts stay within its history",
    );
  });

  test("attack — 200,000 garbage reports from one node hold another node's report back only briefly (measured)", async () => {
    await joinAndRun("slow-a");
    await joinAndRun("slow-b");
    await declare("slow-b", "victim");
    const start = await applied("slow-b", 1);
    assert.ok(start.declaration !== null && start.account?.report_sequence != null);
    const victim = await connectAs("slow-b");
    const attacker = await connectAs("slow-a");
    let next = start.account.report_sequence + 1000;
    /** How long the victim's next report takes from its publish until the control plane keeps it. */
    const timeReport = async (): Promise<number> => {
      next += 1;
      const sequence = next;
      const sentAt = performance.now();
      victim.publish(
        "mesh.report.slow-b",
        report("slow-b", {
          epoch: start.declaration?.epoch,
          sequence: start.declaration?.sequence,
          digest: start.declaration?.digest,
          report_sequence: sequence,
        }),
      );
      await victim.flush();
      // Polled every few milliseconds, so the figure is the report's, not the poll's.
      const deadline = Date.now() + 120_000;
      while ((await store.accounts.recoveryCopy("slow-b"))?.reportSequence !== sequence) {
        if (Date.now() > deadline) throw new Error(`slow-b's report ${sequence} was never kept`);
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
      return performance.now() - sentAt;
    };
    try {
      const quiet = await timeReport();
      const garbage = new Uint8Array(1024).fill(0x7b);
      for (let index = 0; index < 200_000; index += 1) attacker.publish("mesh.report.slow-a", garbage);
      await attacker.flush();
      const flooded = await timeReport();
      console.log(
        `flood: another node's report kept in ${quiet.toFixed(0)} ms quietly, ` +
          `${flooded.toFixed(0)} ms right after 200,000 garbage reports from one node`,
      );
      // The broker keeps a few of one node's messages: the flood pushed out its own older ones, so the control
      // plane handled only some of it (all of it, before: 200,000 refusals ahead of everyone else's reports).
      const identities = openNatsIdentities(data, server.url);
      const control = await identities.controlIdentity();
      const observer = await connect({
        servers: server.url,
        authenticator: jwtAuthenticator(control.jwt, new TextEncoder().encode(control.seed)),
      });
      try {
        const jsm = await jetstreamManager(observer);
        await eventually(
          "the report stream to be drained",
          async () => ((await jsm.streams.info("MESH_CONTROL")).state.messages === 0 ? true : undefined),
          120_000,
        );
      } finally {
        await observer.close();
        await identities.close();
      }
      const handled = (await store.counters.of("slow-a")).report_refused ?? 0;
      console.log(`flood: the control plane handled ${handled} of the 200,000`);
      assert.ok(handled > 0 && handled < 200_000, `${handled} of the flood reached the control plane`);
    } finally {
      await victim.close();
      await attacker.close();
    }
  });
});
