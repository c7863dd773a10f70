/**
 * The whole flow on a real nats-server that the test starts through `mesh up`: join → declare → applied → out of
 * touch → back → refusals, run as an operator and a machine would run it (the built executables).
 */
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import { openNatsIdentities } from "../../src/bus/index.js";
import { TokenRefused } from "../../src/errors.js";
import { loadOrCreateSigningKey, sealDeclaration } from "../../src/keys/index.js";
import {
  decodeToken,
  encodeMessage,
  encodeToken,
  itemsDigest,
  parseDeclarationEnvelope,
} from "../../src/link/index.js";
import { openStore } from "../../src/store/index.js";
import { mesh, meshHost } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

interface Shown {
  state: string;
  liveness: string;
  last_seen: string | null;
  declaration: { sequence: number; epoch: number; digest: string } | null;
  account: {
    outcome: string;
    reason: string | null;
    sequence: number | null;
    report_sequence: number | null;
    received_at: string;
    items: Array<{ id: string; state: string }>;
  } | null;
  refused: Record<string, number>;
}

describe("the mesh end to end over NATS", () => {
  const dir = tempDir("mesh-e2e-");
  const data = join(dir.path, "data");
  let up: Running;
  let brokerUrl: string;
  const agents: Running[] = [];
  const cli = (args: string[]) => mesh(["--data", data, ...args]);
  const show = async (node: string): Promise<Shown> => {
    const run = await cli(["node", "show", node, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return JSON.parse(run.stdout) as Shown;
  };
  const issue = async (node: string, ttl = "1h"): Promise<string> => {
    const run = await cli(["token", "issue", node, "--ttl", ttl, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return (JSON.parse(run.stdout) as { token: string }).token;
  };
  const runAgent = (state: string, root: string | undefined): Running => {
    const rootArgs = root === undefined ? [] : ["--root", root];
    const agent = startBin("mesh-host", ["run", "--state", state, ...rootArgs, "--alive-every", "200ms"]);
    agents.push(agent);
    return agent;
  };
  const declareFiles = async (
    node: string,
    files: Array<{ path: string; content: string; mode?: string }>,
  ) => {
    const file = join(dir.path, `decl-${Date.now()}.json`);
    writeFileSync(file, JSON.stringify({ files }));
    const run = await cli(["declare", node, "-f", file, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return JSON.parse(run.stdout) as { node: string; sequence: number; epoch: number };
  };

  before(async () => {
    up = startBin("mesh", ["--data", data, "--out-of-touch-after", "2s", "up", "--nats-port", "0"]);
    const line = await eventually(
      "mesh up to print its broker",
      () => /broker\s+(nats:\/\/\S+)/.exec(up.stdout())?.[1],
    );
    brokerUrl = line;
  });
  after(async () => {
    for (const agent of agents) await agent.stop("SIGTERM");
    const code = await up.stop();
    assert.equal(code, 0, up.stderr());
    dir.remove();
  });

  test("flow — join → declare → file written under the node's root → node show applied → node list here", async () => {
    const joined = await meshHost([
      "join",
      await issue("web-1"),
      "--state",
      join(dir.path, "web-1"),
      "--label",
      "tier=front",
    ]);
    assert.equal(joined.code, 0, joined.stderr);
    assert.equal(joined.stdout, "web-1\n");
    const root = join(dir.path, "root-1");
    mkdirSync(root);
    runAgent(join(dir.path, "web-1"), root);

    const sent = await declareFiles("web-1", [{ path: "/etc/motd", content: "hello\n", mode: "0640" }]);
    // Declared under the running control plane's lease: its epoch is in the signed declaration.
    const lease = JSON.parse((await cli(["lease", "show", "--json"])).stdout) as {
      holder: { pid: number } | null;
      epoch: number;
      floor: number;
      expires_in_s: number;
    };
    assert.equal(lease.holder?.pid, up.child.pid);
    assert.ok(lease.epoch >= 1 && lease.floor >= lease.epoch);
    assert.deepEqual(sent, { node: "web-1", sequence: 1, epoch: lease.epoch });
    const motd = join(root, "etc", "motd");
    await eventually("the file to be written", () => (existsSync(motd) ? true : undefined));
    assert.equal(readFileSync(motd, "utf8"), "hello\n");

    const shown = await eventually("the report to be kept", async () => {
      const s = await show("web-1");
      return s.account?.outcome === "applied" ? s : undefined;
    });
    assert.equal(shown.state, "enrolled");
    assert.deepEqual(shown.account?.items, [{ id: "file:/etc/motd", state: "applied" }]);
    assert.equal(shown.declaration?.sequence, 1);
    const list = JSON.parse((await cli(["node", "list", "--json"])).stdout) as Array<{
      name: string;
      liveness: string;
    }>;
    assert.deepEqual(list.find((n) => n.name === "web-1")?.liveness, "here");
  });

  test("flow — a stopped agent goes out of touch; started again with no token it is here and gets what was declared meanwhile", async () => {
    const state = join(dir.path, "web-2");
    const root = join(dir.path, "root-2");
    mkdirSync(root);
    // The root given at join is the one every later run uses.
    assert.equal((await meshHost(["join", await issue("web-2"), "--state", state, "--root", root])).code, 0);
    const agent = runAgent(state, undefined);
    await eventually("web-2 to be here", async () =>
      (await show("web-2")).liveness === "here" ? true : undefined,
    );
    assert.equal(await agent.stop("SIGTERM"), 0, agent.stderr());

    await eventually("web-2 to be out of touch", async () =>
      (await show("web-2")).liveness === "out_of_touch" ? true : undefined,
    );
    const table = (await cli(["node", "list"])).stdout;
    assert.match(table, /web-2\s+enrolled\s+out of touch \d+s/);

    await declareFiles("web-2", [{ path: "/srv/while-away", content: "declared while away\n" }]);
    runAgent(state, undefined);
    const file = join(root, "srv", "while-away");
    await eventually("the declaration sent while away to arrive", () =>
      existsSync(file) ? true : undefined,
    );
    await eventually("web-2 to be here again", async () =>
      (await show("web-2")).liveness === "here" ? true : undefined,
    );
    await eventually("both crossings to be logged", () =>
      /node\.out_of_touch.*web-2/.test(up.stderr()) && /node\.back_in_touch.*web-2/.test(up.stderr())
        ? true
        : undefined,
    );
    assert.equal(up.stderr().match(/node\.out_of_touch[^\n]*web-2/g)?.length, 1, "logged once going out");
    assert.equal(up.stderr().match(/node\.back_in_touch[^\n]*web-2/g)?.length, 1, "logged once coming back");
  });

  test("declarations — `declare --all` reaches every enrolled node in one batch, each signed for its node", async () => {
    const file = join(dir.path, "everyone.yaml");
    writeFileSync(file, "files:\n  - path: /etc/everyone\n    content: all of you\n");
    const run = await cli(["declare", "--all", "-f", file, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    const sent = JSON.parse(run.stdout) as { node: string; sequence: number; epoch: number }[];
    assert.deepEqual(sent.map((one) => one.node).sort(), ["web-1", "web-2"]);
    for (const root of [join(dir.path, "root-1"), join(dir.path, "root-2")]) {
      const written = join(root, "etc", "everyone");
      await eventually(`${written} to be written`, () => (existsSync(written) ? true : undefined));
      assert.equal(readFileSync(written, "utf8"), "all of you");
    }
    for (const one of sent) {
      const shown = await eventually(`${one.node} to report it`, async () => {
        const s = await show(one.node);
        return s.account?.sequence === one.sequence && s.account.outcome === "applied" ? s : undefined;
      });
      assert.equal(shown.declaration?.sequence, one.sequence);
    }
    // Several names at once take the same path; an unknown one refuses the whole batch.
    const refused = await cli(["declare", "web-1", "no-such-node", "-f", file]);
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /no node named no-such-node/);
    assert.equal(
      (await show("web-1")).declaration?.sequence,
      sent.find((one) => one.node === "web-1")?.sequence,
    );
  });

  test("enrolment — reused, expired, unknown and other-node tokens are refused with the same line, promptly", async () => {
    const refusals: Array<[string, string]> = [];
    const attempt = async (what: string, token: string) => {
      const started = Date.now();
      const run = await meshHost([
        "join",
        token,
        "--state",
        join(dir.path, `refused-${refusals.length}`),
        "--timeout",
        "10s",
      ]);
      assert.equal(run.code, 1, `${what}: ${run.stdout}${run.stderr}`);
      assert.ok(Date.now() - started < 5000, `${what} took ${Date.now() - started} ms`);
      refusals.push([what, run.stderr]);
    };

    const reused = await issue("db-1");
    assert.equal((await meshHost(["join", reused, "--state", join(dir.path, "db-1")])).code, 0);
    await attempt("reused", reused);

    const expired = await issue("db-2", "1s");
    await new Promise((resolve) => setTimeout(resolve, 1500));
    await attempt("expired", expired);
    // The broker itself refuses the expired token's identity, before the control plane hears anything.
    const content = decodeToken(expired);
    assert.equal(content.broker?.credential.type, "nats");
    if (content.broker?.credential.type !== "nats") return;
    const { jwt, seed } = content.broker.credential;
    // The identity's expiry is in whole seconds, no later than the token's; the broker goes by its own clock.
    const exp = (JSON.parse(Buffer.from(jwt.split(".")[1] ?? "", "base64url").toString()) as { exp: number })
      .exp;
    assert.ok(exp * 1000 <= Date.parse(content.expires_at), "the identity expires no later than the token");
    const refusal = await eventually(
      "the broker to refuse the expired identity",
      async () => {
        const attemptAt = Date.now();
        const result = await connect({
          servers: brokerUrl,
          reconnect: false,
          authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
        }).then(
          async (nc) => {
            // Let in for a moment, then dropped by the broker as it notices the expiry: that is a refusal too.
            const dropped = await Promise.race([
              nc.closed().then((reason) => reason ?? new Error("connection closed by the broker: expired")),
              new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 1000)),
            ]);
            if (dropped === undefined) await nc.close();
            return dropped;
          },
          (error: unknown) => error as Error,
        );
        // Kept at all is allowed only within the second the identity expires in.
        if (result === undefined) assert.ok(attemptAt < (exp + 2) * 1000, "accepted well after its expiry");
        return result;
      },
      5000,
    );
    assert.match(refusal.message, /authorization|expired/i);

    const valid = decodeToken(await issue("db-3"));
    await attempt("unknown", encodeToken({ ...valid, id: "tok_ffffffffffff" }));
    await attempt("for another node", encodeToken({ ...valid, node: "db-4" }));

    const lines = new Set(refusals.map(([, stderr]) => stderr));
    assert.deepEqual([...lines], [`mesh-host: ${TokenRefused.text}\n`], JSON.stringify(refusals));
    // None of them enrolled anything.
    for (const node of ["db-2", "db-3"]) assert.equal((await show(node)).state, "invited");
  });

  test("declarations — a changed byte, a re-encoding, another node's, an older sequence: each refused by the agent and reported", async () => {
    const state = join(dir.path, "app-1");
    const root = join(dir.path, "root-app");
    mkdirSync(root);
    assert.equal((await meshHost(["join", await issue("app-1"), "--state", state])).code, 0);
    runAgent(state, root);
    await declareFiles("app-1", [{ path: "/etc/app.conf", content: "v1\n" }]);
    await declareFiles("app-1", [{ path: "/etc/app.conf", content: "v2\n" }]);
    const conf = join(root, "etc", "app.conf");
    await eventually("v2 to be applied", () =>
      existsSync(conf) && readFileSync(conf, "utf8") === "v2\n" ? true : undefined,
    );
    const applied = await eventually("the v2 report", async () => {
      const s = await show("app-1");
      return s.account?.outcome === "applied" && s.declaration?.sequence === 2 ? s : undefined;
    });

    const store = await openStore(`sqlite:${join(data, "mesh.db")}`, { historyLimit: 50 });
    const [second, first] = await store.declarations.history("app-1");
    await store.close();
    assert.ok(first !== undefined && second !== undefined);
    const envelope = parseDeclarationEnvelope(new TextEncoder().encode(second.envelope));
    const payload = Buffer.from(envelope.payload, "base64");

    const flipped = Buffer.from(payload);
    flipped[flipped.indexOf("v2")] = "w".charCodeAt(0);
    const reencoded = Buffer.from(JSON.stringify(JSON.parse(payload.toString("utf8")), null, 1));
    const signing = loadOrCreateSigningKey(join(data, "keys"));
    const items = [
      { id: "file:/etc/app.conf", type: "file" as const, path: "/etc/app.conf", content: "stolen\n" },
    ];
    const forOther = encodeMessage({
      kind: "declaration",
      node: "app-2",
      epoch: 0,
      sequence: 9,
      issued_at: new Date().toISOString(),
      items,
      digest: itemsDigest(items),
    });
    // Properly signed, for this node, a higher sequence — but composed under an epoch before the one it applied.
    const olderEpoch = encodeMessage({
      kind: "declaration",
      node: "app-1",
      epoch: second.epoch - 1,
      sequence: 50,
      issued_at: new Date().toISOString(),
      items,
      digest: itemsDigest(items),
    });
    assert.ok(second.epoch >= 1, "declared under a lease epoch");
    const cases: Array<[string, Uint8Array, RegExp]> = [
      ["one byte changed", encodeMessage({ ...envelope, payload: flipped.toString("base64") }), /signature/],
      ["re-encoded", encodeMessage({ ...envelope, payload: reencoded.toString("base64") }), /signature/],
      [
        "for another node",
        encodeMessage(sealDeclaration(forOther, signing.privateKey, signing.fingerprint)),
        /for node app-2/,
      ],
      ["an older sequence", new TextEncoder().encode(first.envelope), /sequence 1 is not newer than 2/],
      [
        "an older epoch",
        encodeMessage(sealDeclaration(olderEpoch, signing.privateKey, signing.fingerprint)),
        /epoch \d+ is older than \d+/,
      ],
    ];

    const record = openNatsIdentities(data, brokerUrl);
    const identity = await record.controlIdentity();
    const nc = await connect({
      servers: brokerUrl,
      authenticator: jwtAuthenticator(identity.jwt, new TextEncoder().encode(identity.seed)),
    });
    try {
      let refusedBefore = applied.refused.declarations_refused ?? 0;
      let lastReport = applied.account?.report_sequence ?? 0;
      for (const [what, body, reason] of cases) {
        nc.publish("node.app-1.declaration", body);
        await nc.flush();
        const shown = await eventually(`the refusal of ${what}`, async () => {
          const s = await show("app-1");
          return (s.account?.report_sequence ?? 0) > lastReport ? s : undefined;
        });
        assert.equal(shown.account?.outcome, "refused", what);
        assert.match(shown.account?.reason ?? "", reason, what);
        // The recovery copy still says what the machine holds.
        assert.deepEqual(shown.account?.items, [{ id: "file:/etc/app.conf", state: "applied" }], what);
        assert.equal(shown.refused.declarations_refused, refusedBefore + 1, what);
        refusedBefore += 1;
        lastReport = shown.account?.report_sequence ?? 0;
        assert.equal(readFileSync(conf, "utf8"), "v2\n", `${what} changed nothing`);
      }
    } finally {
      await nc.close();
      await record.close();
    }
  });

  test("declarations — an unusable root fails every item with a reason, and the agent stays up", async () => {
    const state = join(dir.path, "odd-1");
    assert.equal((await meshHost(["join", await issue("odd-1"), "--state", state])).code, 0);
    // A root that is a regular file: nothing can be written below it.
    const notADir = join(dir.path, "root-is-a-file");
    writeFileSync(notADir, "");
    const agent = runAgent(state, notADir);
    await declareFiles("odd-1", [{ path: "/etc/a", content: "a" }]);
    const failed = await eventually("the failure report", async () => {
      const s = await show("odd-1");
      return s.account?.outcome === "failed" ? s : undefined;
    });
    assert.match(failed.account?.reason ?? "", /1 of 1 item\(s\) failed/);
    assert.equal(failed.account?.items[0]?.state, "failed");
    assert.equal(agent.child.exitCode, null, "the agent is still running");
  });

  test("alive — a stream of alives never changes the recovery copy and is absent from the log", async () => {
    const before = await show("web-1");
    assert.equal(before.account?.outcome, "applied");
    // The agent says alive every 200 ms: wait for several, and for last_seen to move.
    await new Promise((resolve) => setTimeout(resolve, 2500));
    const later = await show("web-1");
    assert.notEqual(later.last_seen, before.last_seen, "alives moved last_seen");
    assert.deepEqual(later.account, before.account, "the recovery copy is unchanged");
    assert.doesNotMatch(up.stderr(), /alive/i);
  });

  test("re-enrolment — a machine that joins again gets a new identity and the old one is refused", async () => {
    const oldState = join(dir.path, "re-1");
    const root = join(dir.path, "root-re");
    mkdirSync(root);
    assert.equal((await meshHost(["join", await issue("re-1"), "--state", oldState])).code, 0);
    const oldAgent = runAgent(oldState, root);
    await eventually("re-1 to be here", async () =>
      (await show("re-1")).liveness === "here" ? true : undefined,
    );
    // The machine is rebuilt: a new state dir, a new token for the same node record.
    const joined = await meshHost(["join", await issue("re-1"), "--state", join(dir.path, "re-1-rebuilt")]);
    assert.equal(joined.code, 0, joined.stderr);
    const code = await Promise.race([
      oldAgent.exited,
      new Promise((resolve) => setTimeout(() => resolve("running"), 10_000)),
    ]);
    assert.equal(code, 1, "the old identity is dropped by the broker");
    assert.match(oldAgent.stderr(), /refused this identity/);
  });

  test("retire — the broker drops the node's connection and refuses it; its agent ends with a clear error", async () => {
    const agent = agents[0];
    assert.ok(agent !== undefined);
    const retired = await cli(["node", "retire", "web-1"]);
    assert.equal(retired.code, 0, retired.stderr);
    assert.equal(retired.stdout, "retired web-1\n");
    const code = await Promise.race([
      agent.exited,
      new Promise((resolve) => setTimeout(() => resolve("running"), 10_000)),
    ]);
    assert.equal(code, 1, agent.stderr());
    assert.match(agent.stderr(), /refused this identity/);
    assert.equal((await show("web-1")).state, "retired");
    const again = await cli(["node", "retire", "web-1"]);
    assert.equal(again.code, 1);
    assert.equal(again.stderr, "mesh: node web-1 is already retired\n");
  });
});
