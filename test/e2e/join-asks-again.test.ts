/**
 * `mesh-host join` while no control plane acts (one restarting, or taking over from another): the question reached
 * nobody, so the token is untouched, and the joiner asks again after a pause until its timeout. A join whose timeout
 * ends first fails saying so and spends nothing: the same token joins once a control plane acts again. On each
 * broker, with a real `mesh serve` stopped and started again under the joiner; on RabbitMQ the joiner also holds one
 * channel at most however often it asks, and a vhost with no control queue is nobody answering too.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { describe, test } from "node:test";
import { promisify } from "node:util";
import { exitCodes } from "../../src/errors.js";
import { controlQueue } from "../../src/link/index.js";
import { mesh, meshHost } from "../support/cli.js";
import { startOperatorBroker } from "../support/operator-broker.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { scratchVhost } from "../support/rabbit.js";
import { tempDir } from "../support/tmp.js";

const run = promisify(execFile);

/** A mesh on `broker` whose control plane the test stops and starts, everything ended with the test. */
async function openMesh(t: TestContext, broker: "nats" | "amqp") {
  const dir = tempDir("mesh-join-again-");
  const data = join(dir.path, "data");
  const running: Running[] = [];
  const made: {
    stop?: () => Promise<void>;
    dropControlQueue?: () => Promise<void>;
    channelsOpen?: () => Promise<number[]>;
  } = {};
  t.after(async () => {
    for (const one of running) await one.stop("SIGKILL");
    await made.stop?.();
    dir.remove();
  });
  let url: string;
  if (broker === "nats") {
    const server = await startOperatorBroker(data, dir.path);
    made.stop = () => server.stop();
    url = server.url;
  } else {
    const vhost = await scratchVhost();
    made.stop = () => vhost.drop();
    made.channelsOpen = async () => {
      const { stdout } = await run("rabbitmqctl", ["list_connections", "-q", "-p", vhost.vhost, "channels"], {
        timeout: 60_000,
      });
      return stdout
        .split("\n")
        .map((line) => line.trim())
        .filter((line) => /^\d+$/.test(line))
        .map(Number);
    };
    made.dropControlQueue = async () => {
      assert.equal(
        await vhost.api.deleteQueue(vhost.vhost, controlQueue),
        true,
        "the control queue was there",
      );
    };
    url = vhost.url;
  }
  const cli = (args: string[]) => mesh(["--data", data, ...args]);
  return {
    dir: dir.path,
    cli,
    /** RabbitMQ only: the control queue deleted, as on a vhost no control plane ever ran on. */
    dropControlQueue: made.dropControlQueue,
    /** RabbitMQ only: how many channels each connection to the vhost has open now, as the broker counts them. */
    channelsOpen: made.channelsOpen,
    async serve(): Promise<Running> {
      const serve = startBin("mesh", ["--data", data, "serve", "--broker", url]);
      running.push(serve);
      await eventually("serve to serve", () => (/control\.serving/.test(serve.stderr()) ? true : undefined));
      return serve;
    },
    join(token: string, state: string, timeout: string): Running {
      const joining = startBin("mesh-host", ["join", token, "--state", state, "--timeout", timeout]);
      running.push(joining);
      return joining;
    },
  };
}

/** How many times a join's stderr says it asks again because nobody answered. */
const askedAgain = (stderr: string) =>
  (stderr.match(/no control plane is answering at \S+; asking again in \d+\.\d s/g) ?? []).length;

for (const broker of ["nats", "amqp"] as const) {
  describe(`mesh-host join while no control plane acts (${broker})`, () => {
    test(`join — asks again while nobody answers: fails unspent at its timeout, and the same token joins once a control plane acts (${broker})`, async (t) => {
      const mesh = await openMesh(t, broker);
      const first = await mesh.serve();
      const issued = await mesh.cli(["token", "issue", "edge-1", "--json"]);
      assert.equal(issued.code, 0, issued.stderr);
      const { token } = JSON.parse(issued.stdout) as { token: string };
      assert.equal(await first.stop("SIGTERM"), 0, first.stderr());

      // Nobody acts: asked again while 3 s of the 8 would be left for an answer, then told, with how often it asked.
      const state = join(mesh.dir, "edge-1");
      const short = await meshHost(["join", token, "--state", state, "--timeout", "8s"]);
      assert.equal(short.code, exitCodes.failure, short.stderr);
      const told = /no control plane is answering at \S+ \(asked (\d+) times in (\d+\.\d) s\)/.exec(
        short.stderr,
      );
      assert.ok(told !== null, short.stderr);
      assert.ok(Number(told[1]) >= 2, `asked ${told[1]} times`);
      assert.equal(askedAgain(short.stderr), Number(told[1]) - 1, short.stderr);

      // The same token, the same state dir: asking until a control plane acts, which starts only once it has
      // asked again; the token was spent by neither question before it.
      const joining = mesh.join(token, state, "10m");
      await eventually(
        "the joiner to ask again",
        () => (askedAgain(joining.stderr()) >= 1 ? true : undefined),
        {
          timeoutMs: 120_000,
          detail: () => joining.stderr(),
        },
      );
      if (mesh.channelsOpen !== undefined && mesh.dropControlQueue !== undefined) {
        // Each question's channel is closed after it: after three questions the joiner holds one at most.
        await eventually("the joiner to have asked three times", () =>
          askedAgain(joining.stderr()) >= 3 ? true : undefined,
        );
        const channels = await mesh.channelsOpen();
        assert.equal(channels.length, 1, `connections to the vhost: ${channels.join(", ")}`);
        assert.ok((channels[0] ?? 0) <= 1, `the joiner's connection holds ${channels[0]} channels`);
        // No control queue at all (a vhost no control plane ran on yet): nobody answers there either, and the
        // joiner goes on asking until the control plane makes it again.
        await mesh.dropControlQueue();
        const before = askedAgain(joining.stderr());
        await eventually(
          "the joiner to ask again twice with no control queue",
          () => (askedAgain(joining.stderr()) >= before + 2 ? true : undefined),
          { timeoutMs: 120_000, detail: () => joining.stderr() },
        );
      }
      await mesh.serve();
      assert.equal(await joining.exited, 0, joining.stderr());
      assert.equal(joining.stdout().trim(), "edge-1");
      const shown = await mesh.cli(["node", "show", "edge-1", "--json"]);
      assert.equal(shown.code, 0, shown.stderr);
      assert.equal((JSON.parse(shown.stdout) as { state: string }).state, "enrolled");
    });
  });
}
