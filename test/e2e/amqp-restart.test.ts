/**
 * A RabbitMQ restart in the middle of a run: `mesh serve` on a scratch vhost of the machine's broker, a node
 * applying and reporting declarations, and the broker's application stopped and started again (`rabbitmqctl
 * stop_app` / `start_app`: every connection drops, the listener closes, durable queues and persistent messages
 * stay) while a declaration is being applied and reported. Afterwards every declaration's report is accounted
 * for, and neither process needed a person.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import amqp from "amqplib";
import type { ChannelModel } from "amqplib";
import { openStore } from "../../src/store/index.js";
import { enrolNode, mesh } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import type { ScratchVhost } from "../support/rabbit.js";
import { scratchVhost } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

const run = promisify(execFile);

interface Shown {
  declaration: { sequence: number } | null;
  account: { outcome: string; sequence: number | null; report_sequence: number | null } | null;
  refused: Record<string, number>;
}

/** The machine's RabbitMQ application, stopped and started again in its running Erlang node (as root). */
const rabbitmqctl = async (...args: string[]): Promise<void> => {
  await run("rabbitmqctl", args, { timeout: 60_000 });
};

describe("mesh serve on RabbitMQ through a broker restart", () => {
  const dir = tempDir("mesh-amqp-restart-");
  const data = join(dir.path, "data");
  const state = join(dir.path, "edge-1");
  const root = join(dir.path, "root");
  let scratch: ScratchVhost;
  let serve: Running;
  let agent: Running;
  /** Set while the broker's application is stopped, so `after` starts it again whatever failed. */
  let brokerStopped = false;
  const cli = (args: string[]) => mesh(["--data", data, ...args]);
  const show = async (): Promise<Shown> => {
    const shown = await cli(["node", "show", "edge-1", "--json"]);
    assert.equal(shown.code, 0, shown.stderr);
    return JSON.parse(shown.stdout) as Shown;
  };
  const declare = async (version: number): Promise<number> => {
    const file = join(dir.path, `v${version}.yaml`);
    writeFileSync(file, `files:\n  - path: /etc/edge\n    content: "v${version}"\n`);
    // While the broker is away a declaration cannot be sent: the operator tries again, as here.
    const declared = await eventually(
      `declaration v${version} to be taken`,
      async () => {
        const attempt = await cli(["declare", "edge-1", "-f", file, "--json"]);
        return attempt.code === 0 ? (JSON.parse(attempt.stdout) as { sequence: number }) : undefined;
      },
      30_000,
    );
    return declared.sequence;
  };
  const controlConsumers = async (): Promise<number> => {
    const connection: ChannelModel = await amqp.connect(scratch.url);
    try {
      const channel = await connection.createChannel();
      return (await channel.checkQueue("control")).consumerCount;
    } finally {
      await connection.close();
    }
  };

  before(async () => {
    scratch = await scratchVhost();
    serve = startBin("mesh", ["--data", data, "serve", "--broker", scratch.url]);
    await eventually("serve to consume the control queue", async () =>
      /control\.serving/.test(serve.stderr()) && (await controlConsumers()) === 1 ? true : undefined,
    );
    await enrolNode(cli, "edge-1", state, ["--root", root]);
    mkdirSync(root, { recursive: true });
    agent = startBin("mesh-host", ["run", "--state", state, "--alive-every", "300ms"]);
  });
  after(async () => {
    if (brokerStopped) await rabbitmqctl("start_app");
    const agentCode = await agent.stop("SIGTERM");
    const serveCode = await serve.stop();
    await scratch.drop();
    dir.remove();
    assert.equal(agentCode, 0, agent.stderr());
    assert.equal(serveCode, 0, serve.stderr());
  });

  test("amqp restart — declarations go on while the broker restarts: every report is kept, none lost, nobody exited", async () => {
    const edge = join(root, "etc", "edge");
    assert.equal(await declare(1), 1);
    await eventually("report 1 to be kept", async () =>
      (await show()).account?.outcome === "applied" ? true : undefined,
    );

    // Four more, one after another, while the broker's application is stopped and started again under them: the
    // agent is applying and reporting when every connection drops.
    const restart = (async () => {
      await new Promise((resolve) => setTimeout(resolve, 300));
      brokerStopped = true;
      const started = Date.now();
      await rabbitmqctl("stop_app");
      await rabbitmqctl("start_app");
      brokerStopped = false;
      return Date.now() - started;
    })();
    const declared = [1];
    for (const version of [2, 3, 4, 5]) declared.push(await declare(version));
    const restartMs = await restart;
    const last = declared.at(-1) ?? 0;
    assert.ok(last >= 5, `declared ${declared.join(", ")}`);

    const kept = await eventually(`the report of the last declaration (${last}) to be kept`, async () => {
      const s = await show();
      return s.account?.sequence === last && s.account.outcome === "applied" ? s : undefined;
    });
    assert.equal(kept.declaration?.sequence, last);
    assert.equal(readFileSync(edge, "utf8"), "v5");
    await eventually("the agent's pending report to be receipted", () =>
      existsSync(join(state, "pending-report.json")) ? undefined : true,
    );
    assert.deepEqual(kept.refused, {}, "nothing was refused on the way");

    // The agent numbers every report it writes: the control plane kept each one, in order, with no gap, and one
    // for every declaration the operator was told was sent.
    const store = await openStore(`sqlite:${join(data, "mesh.db")}`, { historyLimit: 50 });
    const history = (await store.accounts.history("edge-1")).reverse();
    await store.close();
    const seen = history.map((a) => `report ${a.reportSequence}: declaration ${a.sequence} ${a.outcome}`);
    const where = `broker restart took ${restartMs} ms; declared ${declared.join(", ")}; kept:\n${seen.join("\n")}`;
    assert.deepEqual(
      history.map((a) => a.reportSequence),
      history.map((_a, index) => index + 1),
      where,
    );
    assert.ok(
      history.every((a) => a.outcome === "applied"),
      where,
    );
    const reported = new Set(history.map((a) => a.sequence));
    assert.deepEqual(
      declared.filter((sequence) => !reported.has(sequence)),
      [],
      where,
    );

    // Neither process exited, and the control plane says it lost the broker and came back.
    assert.equal(serve.child.exitCode, null, serve.stderr());
    assert.equal(agent.child.exitCode, null, agent.stderr());
    // Their logs come through pipes, read as the test's own loop gets to them: waited for, not taken as read.
    const says = (who: string, log: () => string, event: RegExp) =>
      eventually(`${who} to log ${event.source}`, () => (event.test(log()) ? true : undefined)).catch(
        (error: unknown) => {
          throw new Error(`${String(error)}; it logged:\n${log()}`);
        },
      );
    await says("the control plane", () => serve.stderr(), /"event":"broker\.disconnected"/);
    await says("the control plane", () => serve.stderr(), /"event":"broker\.reconnected"/);
    await says("the agent", () => agent.stderr(), /"event":"broker\.disconnected"/);
    await says("the agent", () => agent.stderr(), /"event":"broker\.reconnected"/);
    assert.equal(await controlConsumers(), 1, "the control plane consumes again");
  });
});
