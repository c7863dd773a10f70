/**
 * RabbitMQ's management API too busy to answer one kind of call while a control plane starts: `mesh serve` on a
 * scratch vhost of the machine's broker, its management API reached through a proxy that forwards every call but
 * holds `GET /api/users` (what the token sweep lists first) without answering. The control plane acts all the same:
 * it serves, answers a join, logs the sweep that timed out, and sweeps the stale token account once the API answers.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { meshHost, mesh } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import type { ApiProxy, ScratchVhost } from "../support/rabbit.js";
import { scratchVhost, startApiProxy } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

describe("mesh serve on RabbitMQ while its management API holds a call", () => {
  const dir = tempDir("mesh-amqp-api-stalled-");
  const data = join(dir.path, "data");
  let scratch: ScratchVhost | undefined;
  let proxy: ApiProxy | undefined;
  let serve: Running | undefined;
  /** While set, `GET /api/users` is held unanswered. */
  let holding = true;
  let heldCalls = 0;

  before(async () => {
    scratch = await scratchVhost();
  });
  after(async () => {
    holding = false;
    const code = await serve?.stop();
    await proxy?.close();
    await scratch?.drop();
    dir.remove();
    if (serve !== undefined) assert.equal(code, 0, serve.stderr());
  });

  test("amqp api stalled — the first token sweep times out at the start: the control plane acts, answers a join, and sweeps once the API answers", async () => {
    if (scratch === undefined) throw new Error("no scratch vhost");
    const vhost = scratch;
    // A token account of this mesh whose token the store does not know: the first sweep's to delete.
    const stale = vhost.users.token("gone-1", "tok_stale00000000");
    await vhost.api.putUser(stale, "stale-secret");
    // Every call forwarded but the user listing, held unanswered while `holding`.
    proxy = await startApiProxy((request) => {
      if (!holding || request.method !== "GET" || request.url?.startsWith("/api/users") !== true)
        return false;
      heldCalls += 1;
      request.resume();
      return true;
    });
    const apiUrl = proxy.url;

    const serving = startBin(
      "mesh",
      ["--data", data, "serve", "--broker", vhost.url, "--rabbitmq-api", apiUrl],
      {
        MESH_TOKEN_SWEEP_EVERY: "2s",
      },
    );
    serve = serving;
    /** Waits fail at once when serve has stopped, naming why. */
    const running = () => {
      if (serving.child.exitCode !== null) throw new Error(`serve stopped:\n${serving.stderr()}`);
    };
    await eventually("serve to act while the sweep's listing is held", () => {
      running();
      return /control\.serving/.test(serving.stderr()) && heldCalls > 0 ? true : undefined;
    });

    // It answers a join while the listing is still held.
    const issued = await mesh(["--data", data, "token", "issue", "edge-1", "--json"]);
    assert.equal(issued.code, 0, issued.stderr);
    const joined = await meshHost([
      "join",
      (JSON.parse(issued.stdout) as { token: string }).token,
      "--state",
      join(dir.path, "edge-1"),
    ]);
    assert.equal(joined.code, 0, joined.stderr);

    // The held listing runs out of time: logged, and the control plane goes on.
    await eventually(
      "the held sweep to be logged as failed",
      () => {
        running();
        return /tokens\.sweep\.failed.*no answer within/.test(serving.stderr()) ? true : undefined;
      },
      { timeoutMs: 120_000, detail: () => serving.stderr() },
    );
    assert.ok((await vhost.api.users()).includes(stale), "nothing was swept while the API held the listing");
    assert.doesNotMatch(serving.stderr(), /control plane failed/);

    holding = false;
    await eventually(
      "a later sweep to delete the stale token account",
      async () => {
        running();
        return (await vhost.api.users()).includes(stale) ? undefined : true;
      },
      { timeoutMs: 120_000, detail: () => serving.stderr() },
    );
    assert.match(serving.stderr(), /tokens\.swept/);
    running();
  });
});
