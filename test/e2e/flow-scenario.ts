/**
 * The whole flow, one scenario on both brokers, run as an operator and a machine would run it (the built
 * executables): join → declare → applied → node show/list → out of touch → back → refusals → re-enrolment → retire.
 * On NATS `mesh up` starts its own nats-server in operator mode; on RabbitMQ `mesh up --broker amqp://…` uses a
 * scratch vhost (fixtures in test/support/fleets.ts). No test uses another's nodes or processes: each joins nodes of
 * its own and runs their agents, stopped when it ends, on the suite's `mesh up`; a test whose claim is about the
 * whole fleet or the whole log (`declare --all`, out of touch logged once, alive never logged) has a `mesh up` of its
 * own and runs beside the others. So each passes run alone. nats-flow.test.ts and amqp-flow.test.ts run this
 * scenario, one file per broker (so the two run in parallel, each within the runner's per-file limit).
 * What only one broker can show is checked behind its name: RabbitMQ's accounts and queues through the management
 * API and an administrator's channel, NATS's identities (JWT expiry) from the broker's side. The wholly
 * RabbitMQ-specific cases are in amqp-accounts.test.ts.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { connect, jwtAuthenticator } from "@nats-io/transport-node";
import { exitCodes, TokenRefused } from "../../src/errors.js";
import { loadOrCreateSigningKey, sealDeclaration } from "../../src/keys/index.js";
import {
  decodeToken,
  encodeMessage,
  encodeToken,
  itemsDigest,
  parseDeclarationEnvelope,
} from "../../src/link/index.js";
import { openStore } from "../../src/store/index.js";
import { meshHost } from "../support/cli.js";
import type { BrokerName, Fleet } from "../support/fleets.js";
import { exitWithin, fleetForTest, openFleet } from "../support/fleets.js";
import { eventually } from "../support/processes.js";

/** Joins `node` with a token of its own into `state`; the join must succeed and print the node's name. */
async function joined(fleet: Fleet, node: string, extra: string[] = []): Promise<string> {
  const state = join(fleet.dir, node);
  const run = await meshHost(["join", await fleet.issue(node), "--state", state, ...extra]);
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stdout, `${node}\n`);
  return state;
}

/** A fresh root dir for a node's files. */
function rootFor(fleet: Fleet, name: string): string {
  const root = join(fleet.dir, name);
  mkdirSync(root);
  return root;
}

/** Waits until the node has been heard and that has been written (`last_seen` is flushed in batches). */
async function heard(fleet: Fleet, node: string): Promise<void> {
  await eventually(`${node}'s first alive or report to be flushed as last_seen`, async () =>
    (await fleet.show(node)).last_seen !== null ? true : undefined,
  );
}

/** Registers the scenario for one broker. */
export function flowScenario(broker: BrokerName): void {
  // The tests on the suite's `mesh up` run one after another (as an operator's commands would); the tests with a
  // `mesh up` of their own run beside them.
  describe(`the mesh end to end (${broker})`, { concurrency: 2 }, () => {
    describe(`on the suite's mesh up (${broker})`, () => {
      /** The suite's `mesh up`: a fixture, holding no test's nodes but its own. */
      let shared: Fleet;
      before(async () => {
        shared = await openFleet(broker);
      });
      after(async () => {
        await shared?.close();
      });

      test(`flow (${broker}) — join → declare → file written under the node's root → node show applied → node list here`, async (t) => {
        const fleet = shared;
        const { rabbit } = fleet;
        const token = await fleet.issue("web-1");
        const tokenUser = rabbit?.scratch.users.token("web-1", decodeToken(token).id);
        if (rabbit !== undefined)
          assert.deepEqual(
            await rabbit.accounts("token", "web-1"),
            [tokenUser],
            "the token has its own account",
          );
        const state = join(fleet.dir, "web-1");
        const join1 = await meshHost(["join", token, "--state", state, "--label", "tier=front"]);
        assert.equal(join1.code, 0, join1.stderr);
        assert.equal(join1.stdout, "web-1\n");

        if (rabbit !== undefined) {
          // The spent token's account is deleted by the broker; the node has an account of its own and a queue.
          await eventually("the spent token's account to be deleted", async () =>
            (await rabbit.accounts("token", "web-1")).length === 0 ? true : undefined,
          );
          const identity = fleet.identityOf(state);
          assert.equal(identity.broker.credential.type, "amqp");
          assert.equal(identity.broker.url, rabbit.nodeUrl);
          if (identity.broker.credential.type !== "amqp") return;
          assert.deepEqual(await rabbit.accounts("node", "web-1"), [identity.broker.credential.username]);
          assert.ok(
            (await rabbit.scratch.api.queue(rabbit.scratch.vhost, "node.web-1")) !== undefined,
            "the node's queue exists",
          );
        }

        const root = rootFor(fleet, "root-1");
        fleet.runAgent(state, root, t);
        const sent = await fleet.declareFiles("web-1", [
          { path: "/etc/motd", content: "hello\n", mode: "0640" },
        ]);
        // Declared under the running control plane's lease: its epoch is in the signed declaration.
        const lease = JSON.parse((await fleet.cli(["lease", "show", "--json"])).stdout) as {
          holder: { pid: number } | null;
          epoch: number;
          floor: number;
        };
        // The control plane is `mesh up`'s child (`mesh serve --under-up`), so that its end is not the broker's.
        assert.equal(parentOf(lease.holder?.pid ?? 0), fleet.up.child.pid);
        assert.ok(lease.epoch >= 1 && lease.floor >= lease.epoch);
        assert.deepEqual(sent, { node: "web-1", sequence: 1, epoch: lease.epoch });
        const motd = join(root, "etc", "motd");
        await eventually("the file to be written", () => (existsSync(motd) ? true : undefined));
        assert.equal(readFileSync(motd, "utf8"), "hello\n");

        const shown = await eventually("the report to be kept", async () => {
          const s = await fleet.show("web-1");
          return s.account?.outcome === "applied" ? s : undefined;
        });
        assert.equal(shown.state, "enrolled");
        assert.deepEqual(shown.account?.items, [{ id: "file:/etc/motd", state: "applied" }]);
        assert.equal(shown.account?.sequence, 1);
        assert.equal(shown.declaration?.sequence, 1);
        // A kept report does not mean last_seen is written yet: the control plane writes last_seen in batches (every
        // second), so on a busy machine `node list` read in between says `never_spoken`. Wait for the write, then list.
        await heard(fleet, "web-1");
        const list = await fleet.list();
        assert.equal(list.find((n) => n.name === "web-1")?.liveness, "here");
        // The receipt emptied the pending report.
        await eventually("the agent to drop its pending report", () =>
          existsSync(join(state, "pending-report.json")) ? undefined : true,
        );
        // The node's one consumer is on its own queue.
        if (rabbit !== undefined) assert.equal((await rabbit.queueNow("node.web-1"))?.consumerCount, 1);
      });

      test(`enrolment (${broker}) — reused, expired, unknown, wrong-secret and other-node tokens are refused with the same line, before the join's own timeout`, async () => {
        const fleet = shared;
        const refusals: Array<[string, string]> = [];
        // The join waits at most 60 s for an answer, and a join that waited it out says so in other words: the one
        // refusal line below is the control plane's (or the broker's) answer, not a timeout.
        const attempt = async (what: string, token: string) => {
          const run = await meshHost([
            "join",
            token,
            "--state",
            join(fleet.dir, `refused-${refusals.length}`),
            "--timeout",
            "60s",
          ]);
          assert.deepEqual(
            { code: run.code, stdout: run.stdout, stderr: run.stderr },
            { code: 1, stdout: "", stderr: `mesh-host: ${TokenRefused.text}\n` },
            what,
          );
          refusals.push([what, run.stderr]);
        };

        const reused = await fleet.issue("db-1");
        assert.equal((await meshHost(["join", reused, "--state", join(fleet.dir, "db-1")])).code, 0);
        await attempt("reused", reused);

        const expired = await fleet.issue("db-2", "1s");
        await new Promise((resolve) => setTimeout(resolve, 1500));
        await attempt("expired", expired);
        if (broker === "nats") {
          // The broker itself refuses the expired token's identity, before the control plane hears anything.
          const content = decodeToken(expired);
          assert.equal(content.broker?.credential.type, "nats");
          if (content.broker?.credential.type !== "nats") return;
          const { jwt, seed } = content.broker.credential;
          // The identity's expiry is in whole seconds, no later than the token's; the broker goes by its own clock.
          const exp = (
            JSON.parse(Buffer.from(jwt.split(".")[1] ?? "", "base64url").toString()) as { exp: number }
          ).exp;
          assert.ok(
            exp * 1000 <= Date.parse(content.expires_at),
            "the identity expires no later than the token",
          );
          const refusal = await eventually(
            "the broker to refuse the expired identity",
            async () => {
              const attemptAt = Date.now();
              const result = await connect({
                servers: fleet.brokerUrl,
                reconnect: false,
                authenticator: jwtAuthenticator(jwt, new TextEncoder().encode(seed)),
              }).then(
                async (nc) => {
                  // Let in for a moment, then dropped by the broker as it notices the expiry: that is a refusal too.
                  const dropped = await Promise.race([
                    nc
                      .closed()
                      .then((reason) => reason ?? new Error("connection closed by the broker: expired")),
                    new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 1000)),
                  ]);
                  if (dropped === undefined) await nc.close();
                  return dropped;
                },
                (error: unknown) => error as Error,
              );
              // Kept at all is allowed only within the second the identity expires in.
              if (result === undefined)
                assert.ok(attemptAt < (exp + 2) * 1000, "accepted well after its expiry");
              return result;
            },
            30_000,
          );
          assert.match(refusal.message, /authorization|expired/i);
        }

        const valid = decodeToken(await fleet.issue("db-3"));
        await attempt("unknown", encodeToken({ ...valid, id: "tok_ffffffffffff" }));
        await attempt("with a wrong secret", encodeToken({ ...valid, secret: "A".repeat(43) }));
        const other = decodeToken(await fleet.issue("db-5"));
        await attempt("for another node", encodeToken({ ...other, node: "db-6" }));

        const lines = new Set(refusals.map(([, stderr]) => stderr));
        assert.deepEqual([...lines], [`mesh-host: ${TokenRefused.text}\n`], JSON.stringify(refusals));
        // None of them enrolled anything, and db-3's token may still be spent by its own machine.
        for (const node of ["db-2", "db-3", "db-5"]) assert.equal((await fleet.show(node)).state, "invited");
        if (fleet.rabbit !== undefined) assert.equal((await fleet.rabbit.accounts("node", "db-3")).length, 0);
        const tokens = JSON.parse((await fleet.cli(["token", "list", "--json"])).stdout) as Array<{
          id: string;
          status: string;
        }>;
        assert.equal(tokens.find((one) => one.id === valid.id)?.status, "valid");
      });

      test(`declarations (${broker}) — a changed byte, a re-encoding, another node's, an older sequence, an older epoch: each refused by the agent and reported`, async (t) => {
        const fleet = shared;
        const root = rootFor(fleet, "root-app");
        fleet.runAgent(await joined(fleet, "app-1"), root, t);
        await fleet.declareFiles("app-1", [{ path: "/etc/app.conf", content: "v1\n" }]);
        await fleet.declareFiles("app-1", [{ path: "/etc/app.conf", content: "v2\n" }]);
        const conf = join(root, "etc", "app.conf");
        await eventually("v2 to be applied", () =>
          existsSync(conf) && readFileSync(conf, "utf8") === "v2\n" ? true : undefined,
        );
        const applied = await eventually("the v2 report", async () => {
          const s = await fleet.show("app-1");
          return s.account?.outcome === "applied" && s.declaration?.sequence === 2 ? s : undefined;
        });

        const store = await openStore(`sqlite:${join(fleet.data, "mesh.db")}`, { historyLimit: 50 });
        const [second, first] = await store.declarations.history("app-1");
        await store.close();
        assert.ok(first !== undefined && second !== undefined);
        const envelope = parseDeclarationEnvelope(new TextEncoder().encode(second.envelope));
        const payload = Buffer.from(envelope.payload, "base64");

        const flipped = Buffer.from(payload);
        flipped[flipped.indexOf("v2")] = "w".charCodeAt(0);
        const reencoded = Buffer.from(JSON.stringify(JSON.parse(payload.toString("utf8")), null, 1));
        const signing = loadOrCreateSigningKey(join(fleet.data, "keys"));
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
          [
            "one byte changed",
            encodeMessage({ ...envelope, payload: flipped.toString("base64") }),
            /signature/,
          ],
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

        let refusedBefore = applied.refused.declarations_refused ?? 0;
        let lastReport = applied.account?.report_sequence ?? 0;
        for (const [what, body, reason] of cases) {
          await fleet.sendToNode("app-1", body);
          const shown = await eventually(`the refusal of ${what}`, async () => {
            const s = await fleet.show("app-1");
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
      });

      test(`declarations (${broker}) — an unusable root fails every item with a reason, and the agent stays up`, async (t) => {
        const fleet = shared;
        const state = await joined(fleet, "odd-1");
        // A root that is a regular file: nothing can be written below it.
        const notADir = join(fleet.dir, "root-is-a-file");
        writeFileSync(notADir, "");
        const agent = fleet.runAgent(state, notADir, t);
        await fleet.declareFiles("odd-1", [{ path: "/etc/a", content: "a" }]);
        const failed = await eventually("the failure report", async () => {
          const s = await fleet.show("odd-1");
          return s.account?.outcome === "failed" ? s : undefined;
        });
        assert.match(failed.account?.reason ?? "", /1 of 1 item\(s\) failed/);
        assert.equal(failed.account?.items[0]?.state, "failed");
        assert.equal(agent.child.exitCode, null, "the agent is still running");
      });

      test(`re-enrolment (${broker}) — a machine that joins again gets a new identity and the old one is refused`, async (t) => {
        const fleet = shared;
        const oldAgent = fleet.runAgent(await joined(fleet, "re-1"), rootFor(fleet, "root-re"), t);
        await eventually("re-1 to be here", async () =>
          (await fleet.show("re-1")).liveness === "here" ? true : undefined,
        );
        // The machine is rebuilt: a new state dir, a new token for the same node record.
        const rejoined = await meshHost([
          "join",
          await fleet.issue("re-1"),
          "--state",
          join(fleet.dir, "re-1-rebuilt"),
        ]);
        assert.equal(rejoined.code, 0, rejoined.stderr);
        assert.equal(
          await exitWithin(oldAgent),
          exitCodes.identityRefused,
          "the old identity is dropped by the broker",
        );
        assert.match(oldAgent.stderr(), /refused this identity/);
      });

      test(`retire (${broker}) — the broker drops the node's connection and refuses it, and forgets its account and queue; its agent ends with a clear error`, async (t) => {
        const fleet = shared;
        const { rabbit } = fleet;
        const state = await joined(fleet, "gone-1");
        const agent = fleet.runAgent(state, rootFor(fleet, "root-gone"), t);
        await eventually("gone-1 to be here", async () =>
          (await fleet.show("gone-1")).liveness === "here" ? true : undefined,
        );
        const credential = fleet.identityOf(state).broker.credential;
        const user = credential.type === "amqp" ? credential.username : "";
        if (rabbit !== undefined) {
          assert.ok((await rabbit.scratch.api.users()).includes(user));
          // The management API lists connections some seconds late.
          await eventually("the broker to list the agent's connection", async () =>
            (await rabbit.scratch.api.connectionsOf(user)) === 1 ? true : undefined,
          );
        }

        const retired = await fleet.cli(["node", "retire", "gone-1"]);
        assert.equal(retired.code, 0, retired.stderr);
        assert.equal(retired.stdout, "retired gone-1\n");
        if (rabbit !== undefined) {
          assert.ok(!(await rabbit.scratch.api.users()).includes(user), "the node's account is deleted");
          assert.equal(
            await rabbit.scratch.api.queue(rabbit.scratch.vhost, "node.gone-1"),
            undefined,
            "its queue is deleted",
          );
        }
        assert.equal(await exitWithin(agent), exitCodes.identityRefused, agent.stderr());
        assert.match(agent.stderr(), /refused this identity/);
        if (rabbit !== undefined) assert.equal(await rabbit.scratch.api.connectionsOf(user), 0);
        assert.equal((await fleet.show("gone-1")).state, "retired");
        const again = await fleet.cli(["node", "retire", "gone-1"]);
        assert.equal(again.code, 1);
        assert.equal(again.stderr, "mesh: node gone-1 is already retired\n");
        // The control plane itself carries on.
        assert.equal(fleet.up.child.exitCode, null, fleet.up.stderr());
      });

      test(`enrolment (${broker}) — eight machines joining at once each get an identity of their own${broker === "amqp" ? ", an account and a queue" : ""}`, async () => {
        const fleet = shared;
        const { rabbit } = fleet;
        const names = Array.from({ length: 8 }, (_, i) => `crowd-${i + 1}`);
        const tokens = await Promise.all(names.map((node) => fleet.issue(node)));
        const joins = await Promise.all(
          names.map((node, i) => meshHost(["join", tokens[i] ?? "", "--state", join(fleet.dir, node)])),
        );
        joins.forEach((run, i) => {
          assert.equal(run.code, 0, run.stderr);
          assert.equal(run.stdout, `${names[i]}\n`);
        });
        const credentials = names.map((node) => fleet.identityOf(join(fleet.dir, node)).broker.credential);
        assert.equal(
          new Set(credentials.map((credential) => JSON.stringify(credential))).size,
          names.length,
          "no two nodes share an identity",
        );
        for (const node of names) assert.equal((await fleet.show(node)).state, "enrolled");
        if (rabbit === undefined) return;
        const users = credentials.map((credential) =>
          credential.type === "amqp" ? credential.username : "",
        );
        assert.equal(new Set(users).size, names.length, "no two nodes share an account");
        for (const [i, node] of names.entries()) {
          assert.deepEqual(await rabbit.accounts("node", node), [users[i]]);
          assert.ok(
            (await rabbit.scratch.api.queue(rabbit.scratch.vhost, `node.${node}`)) !== undefined,
            `node.${node} exists`,
          );
        }
        // One listing of the broker's users a look (RabbitMQ answers several at once while deleting users with 500s).
        const tokenAccount = new RegExp(
          `^${rabbit.scratch.users.prefix.replace(/[.]/g, "\\.")}\\.token\\.crowd-`,
        );
        await eventually("the spent tokens' accounts to be deleted", async () =>
          (await rabbit.scratch.api.users()).some((user) => tokenAccount.test(user)) ? undefined : true,
        );
      });
    });

    describe(`each on a mesh up of its own (${broker})`, { concurrency: 3 }, () => {
      test(`flow (${broker}) — a stopped agent goes out of touch; started again with no token it is here and gets what was declared meanwhile`, async (t) => {
        const fleet = await fleetForTest(t, broker, { outOfTouchAfter: "5s" });
        const root = rootFor(fleet, "root-2");
        // The root given at join is the one every later run uses.
        const state = await joined(fleet, "web-2", ["--root", root]);
        const agent = fleet.runAgent(state);
        await eventually("web-2 to be here", async () =>
          (await fleet.show("web-2")).liveness === "here" ? true : undefined,
        );
        assert.equal(await agent.stop("SIGTERM"), 0, agent.stderr());

        await eventually(
          "web-2 to be out of touch",
          async () => ((await fleet.show("web-2")).liveness === "out_of_touch" ? true : undefined),
          60_000,
        );
        assert.match((await fleet.cli(["node", "list"])).stdout, /web-2\s+enrolled\s+out of touch \d+s/);

        await fleet.declareFiles("web-2", [{ path: "/srv/while-away", content: "declared while away\n" }]);
        // Declared while nobody consumes the node's queue: the broker keeps it there.
        if (fleet.rabbit !== undefined)
          assert.equal((await fleet.rabbit.queueNow("node.web-2"))?.messageCount, 1);
        fleet.runAgent(state);
        const file = join(root, "srv", "while-away");
        await eventually("the declaration sent while away to arrive", () =>
          existsSync(file) ? true : undefined,
        );
        assert.equal(readFileSync(file, "utf8"), "declared while away\n");
        await eventually("web-2 to be here again, its report kept", async () => {
          const s = await fleet.show("web-2");
          return s.liveness === "here" && s.account?.outcome === "applied" && s.account.sequence === 1
            ? true
            : undefined;
        });
        const log = () => fleet.up.stderr();
        await eventually("both crossings to be logged", () =>
          /node\.out_of_touch.*web-2/.test(log()) && /node\.back_in_touch.*web-2/.test(log())
            ? true
            : undefined,
        ).catch((error: unknown) => {
          throw new Error(`${String(error)}; the control plane logged:\n${log()}`);
        });
        assert.equal(log().match(/node\.out_of_touch[^\n]*web-2/g)?.length, 1, "logged once going out");
        assert.equal(log().match(/node\.back_in_touch[^\n]*web-2/g)?.length, 1, "logged once coming back");
      });

      test(`declarations (${broker}) — \`declare --all\` reaches every enrolled node in one batch, each signed for its node`, async (t) => {
        const fleet = await fleetForTest(t, broker);
        const roots = [rootFor(fleet, "root-1"), rootFor(fleet, "root-2")];
        fleet.runAgent(await joined(fleet, "web-1"), roots[0]);
        fleet.runAgent(await joined(fleet, "web-2"), roots[1]);
        const file = join(fleet.dir, "everyone.yaml");
        writeFileSync(file, "files:\n  - path: /etc/everyone\n    content: all of you\n");
        const run = await fleet.cli(["declare", "--all", "-f", file, "--json"]);
        assert.equal(run.code, 0, run.stderr);
        const sent = JSON.parse(run.stdout) as { node: string; sequence: number; epoch: number }[];
        assert.deepEqual(sent.map((one) => one.node).sort(), ["web-1", "web-2"]);
        for (const root of roots) {
          const written = join(root, "etc", "everyone");
          await eventually(`${written} to be written`, () => (existsSync(written) ? true : undefined));
          assert.equal(readFileSync(written, "utf8"), "all of you");
        }
        for (const one of sent) {
          const shown = await eventually(`${one.node} to report it`, async () => {
            const s = await fleet.show(one.node);
            return s.account?.sequence === one.sequence && s.account.outcome === "applied" ? s : undefined;
          });
          assert.equal(shown.declaration?.sequence, one.sequence);
        }
        // Several names at once take the same path; an unknown one refuses the whole batch.
        const refused = await fleet.cli(["declare", "web-1", "no-such-node", "-f", file]);
        assert.equal(refused.code, 1);
        assert.match(refused.stderr, /no node named no-such-node/);
        assert.equal(
          (await fleet.show("web-1")).declaration?.sequence,
          sent.find((one) => one.node === "web-1")?.sequence,
        );
      });

      test(`alive (${broker}) — a stream of alives never changes the recovery copy and is absent from the log`, async (t) => {
        const fleet = await fleetForTest(t, broker);
        fleet.runAgent(await joined(fleet, "web-1"), rootFor(fleet, "root-1"));
        await fleet.declareFiles("web-1", [{ path: "/etc/motd", content: "hello\n" }]);
        await eventually("the report to be kept", async () =>
          (await fleet.show("web-1")).account?.outcome === "applied" ? true : undefined,
        );
        await heard(fleet, "web-1");
        const before = await fleet.show("web-1");
        assert.equal(before.account?.outcome, "applied");
        // The agent says alive every 200 ms and last_seen is written in batches: wait until it has moved three times.
        const seen = new Set([before.last_seen]);
        const later = await eventually("alives to move last_seen three times", async () => {
          const s = await fleet.show("web-1");
          seen.add(s.last_seen);
          return seen.size > 3 ? s : undefined;
        });
        assert.notEqual(later.last_seen, before.last_seen, "alives moved last_seen");
        assert.deepEqual(later.account, before.account, "the recovery copy is unchanged");
        assert.doesNotMatch(fleet.up.stderr(), /alive/i);
      });
    });
  });
}

/** The parent process of `pid`, from Linux's /proc (its stat's fourth field). */
function parentOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
}
