/**
 * RabbitMQ's management API too busy to answer one kind of call while a control plane starts: `mesh serve` on a
 * scratch vhost of the machine's broker, its management API reached through a proxy that forwards every call but,
 * while a test says so, holds `GET /api/users` (what the token sweep and the revocations' update list first) without
 * answering. The control plane acts all the same, logs what timed out, and does it once the API answers.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { after, before, describe, test } from "node:test";
import { meshHost, mesh } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import type { ApiProxy, ScratchVhost } from "../support/rabbit.js";
import { scratchVhost, startApiProxy } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

describe("mesh serve on RabbitMQ while its management API holds a call", () => {
  const dir = tempDir("mesh-amqp-api-stalled-");
  let scratch: ScratchVhost | undefined;
  let proxy: ApiProxy | undefined;
  /** While set, `GET /api/users` is held unanswered. */
  let holding = false;
  let heldCalls = 0;

  before(async () => {
    scratch = await scratchVhost();
    // Every call forwarded but the user listing, held unanswered while `holding`.
    proxy = await startApiProxy((request) => {
      if (!holding || request.method !== "GET" || request.url?.startsWith("/api/users") !== true)
        return false;
      heldCalls += 1;
      request.resume();
      return true;
    });
  });
  after(async () => {
    holding = false;
    await proxy?.close();
    await scratch?.drop();
    dir.remove();
  });

  /** The scratch vhost and the proxy, once `before` has run. */
  const fixture = () => {
    if (scratch === undefined || proxy === undefined) throw new Error("no scratch vhost or proxy");
    return { vhost: scratch, apiUrl: proxy.url };
  };

  /**
   * `mesh serve` on `data` through the proxy, with a token sweep every 2 s; stopped (exit 0) when the test ends.
   * `running()` throws at once, naming why, once it has stopped.
   */
  const serveThroughProxy = (t: TestContext, data: string) => {
    const { vhost, apiUrl } = fixture();
    const serving: Running = startBin(
      "mesh",
      ["--data", data, "serve", "--broker", vhost.url, "--rabbitmq-api", apiUrl],
      { MESH_TOKEN_SWEEP_EVERY: "2s" },
    );
    let stopped: Promise<number | null> | undefined;
    const stop = () => (stopped ??= serving.stop());
    t.after(async () => {
      holding = false;
      assert.equal(await stop(), 0, serving.stderr());
    });
    const running = () => {
      if (serving.child.exitCode !== null) throw new Error(`serve stopped:\n${serving.stderr()}`);
    };
    /** Waits for `check` while serve runs, failing at once should it stop. */
    const whileServing = <T>(what: string, check: () => Promise<T | undefined> | T | undefined) =>
      eventually(
        what,
        () => {
          running();
          return check();
        },
        { timeoutMs: 120_000, detail: () => serving.stderr() },
      );
    /** Waits until the broker no longer knows `user`. */
    const gone = (what: string, user: string) =>
      whileServing(what, async () => ((await vhost.api.users()).includes(user) ? undefined : true));
    return { serving, running, stop, whileServing, gone };
  };

  /** A node of the mesh on `data`, joined with a token issued for it. */
  const joinNode = async (data: string, node: string): Promise<string> => {
    const issued = await mesh(["--data", data, "token", "issue", node, "--json"]);
    assert.equal(issued.code, 0, issued.stderr);
    const state = join(dir.path, `${node}-state`);
    const joined = await meshHost([
      "join",
      (JSON.parse(issued.stdout) as { token: string }).token,
      "--state",
      state,
    ]);
    assert.equal(joined.code, 0, joined.stderr);
    return state;
  };

  test("amqp api stalled — the first token sweep times out at the start: the control plane acts, answers a join, and sweeps once the API answers", async (t) => {
    const { vhost } = fixture();
    const data = join(dir.path, "sweep");
    // A token account of this mesh whose token the store does not know: the first sweep's to delete.
    const stale = vhost.users.token("gone-1", "tok_stale00000000");
    await vhost.api.putUser(stale, "stale-secret");
    holding = true;
    heldCalls = 0;
    const { serving, running, whileServing, gone } = serveThroughProxy(t, data);
    await whileServing("serve to act while the sweep's listing is held", () =>
      /control\.serving/.test(serving.stderr()) && heldCalls > 0 ? true : undefined,
    );

    // It answers a join while the listing is still held.
    await joinNode(data, "edge-1");

    // The held listing runs out of time: logged, and the control plane goes on.
    await whileServing("the held sweep to be logged as failed", () =>
      /tokens\.sweep\.failed.*no answer within/.test(serving.stderr()) ? true : undefined,
    );
    assert.ok((await vhost.api.users()).includes(stale), "nothing was swept while the API held the listing");
    assert.doesNotMatch(serving.stderr(), /control plane failed/);

    holding = false;
    await gone("a later sweep to delete the stale token account", stale);
    // The broker has deleted it before the sweep hears so and logs it.
    await whileServing("the sweep that deleted it to say so", () =>
      /tokens\.swept/.test(serving.stderr()) ? true : undefined,
    );
    running();
  });

  test("amqp api stalled — the revocations' update at a start times out: logged, made again, and the retired node's account that came back is deleted", async (t) => {
    const { vhost } = fixture();
    const data = join(dir.path, "revoke");
    holding = false;
    const first = serveThroughProxy(t, data);
    await first.whileServing("the first serve to act", () =>
      /control\.serving/.test(first.serving.stderr()) ? true : undefined,
    );
    const state = await joinNode(data, "edge-2");
    const credential = (
      JSON.parse(readFileSync(join(state, "identity.json"), "utf8")) as {
        broker: { credential: { type: string; username?: string } };
      }
    ).broker.credential;
    if (credential.type !== "amqp" || credential.username === undefined)
      throw new Error("edge-2 holds no RabbitMQ account");
    const account = credential.username;
    const retired = await mesh(["--data", data, "node", "retire", "edge-2"]);
    assert.equal(retired.code, 0, retired.stderr);
    assert.ok(!(await vhost.api.users()).includes(account), "retiring deleted the node's account");
    assert.equal(await first.stop(), 0, first.serving.stderr());

    // The account comes back behind the mesh's back (a broker restored from an older backup, say): the update at the
    // next start is what deletes it, and its listing is held.
    await vhost.api.putUser(account, "came-back");
    holding = true;
    heldCalls = 0;
    const { serving, running, whileServing, gone } = serveThroughProxy(t, data);
    await whileServing("the held update to be logged, and the control plane to act all the same", () =>
      /broker\.revocations_not_applied.*no answer within.*again_in_ms/.test(serving.stderr()) &&
      /control\.serving/.test(serving.stderr())
        ? true
        : undefined,
    );
    assert.ok(
      (await vhost.api.users()).includes(account),
      "nothing was deleted while the API held the listing",
    );

    holding = false;
    await gone("the update made again to delete the account", account);
    assert.doesNotMatch(serving.stderr(), /control plane failed/);
    running();
  });
});
