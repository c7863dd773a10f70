/**
 * `mesh-host run` stopped from its terminal: Ctrl-C (which `npm exec` passes on, so it comes twice) and a closed
 * terminal's SIGHUP stop the agent as asked, once the declaration under way is applied, with no error. A real mesh
 * (`mesh up` with its own nats-server) and a real agent; the declaration's apply is held by a service that takes its
 * time to stop, so the second signal surely comes while the agent stops.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { fleetForTest } from "../support/fleets.js";
import { eventually, logLines, startBin } from "../support/processes.js";

describe("mesh-host run stopped from its terminal", () => {
  const cases: Array<[string, NodeJS.Signals]> = [
    ["Ctrl-C, and again while it stops", "SIGINT"],
    ["the terminal closed, and hung up again while it stops", "SIGHUP"],
  ];
  for (const [what, signal] of cases) {
    test(`signals — ${what}: the declaration under way is applied, then the agent stops; exit 0, no error`, async (t) => {
      const fleet = await fleetForTest(t, "nats");
      const node = `sig-${signal.toLowerCase()}`;
      const state = join(fleet.dir, node);
      const root = join(fleet.dir, `${node}-root`);
      const marks = join(fleet.dir, `${node}-marks`);
      mkdirSync(marks);
      const joined = await fleet.host(["join", await fleet.issue(node), "--state", state, "--root", root]);
      assert.equal(joined.code, 0, joined.stderr);
      const agent = startBin("mesh-host", ["run", "--state", state, "--alive-every", "200ms"]);
      t.after(() => {
        if (agent.child.exitCode === null && agent.child.signalCode === null) agent.child.kill("SIGKILL");
      });
      await eventually("the agent to run", () =>
        /"event":"agent\.running"/.test(agent.stderr()) ? true : undefined,
      );

      // A service that says when it is asked to stop, and stops only once the test lets it.
      const termed = join(marks, "termed");
      const release = join(marks, "release");
      const script = `trap 'touch ${termed}' TERM; while [ ! -e ${release} ]; do sleep 0.05; done`;
      const holding = join(fleet.dir, `${node}-holding.yaml`);
      writeFileSync(
        holding,
        `services:\n  - {name: holder, command: [/bin/sh, -c, "${script}"], restart: never, stop_grace_ms: 600000}\n`,
      );
      const held = await fleet.cli(["declare", node, "-f", holding, "--wait"]);
      assert.equal(held.code, 0, held.stderr + held.stdout);

      // Declared without it: the agent's apply asks the service to stop, and waits for it.
      const without = join(fleet.dir, `${node}-without.yaml`);
      writeFileSync(without, `files:\n  - {path: /etc/after, content: "after\\n"}\n`);
      const declared = await fleet.cli(["declare", node, "-f", without]);
      assert.equal(declared.code, 0, declared.stderr);
      await eventually("the service to be asked to stop", () => (existsSync(termed) ? true : undefined));

      const pid = agent.child.pid;
      assert.ok(pid !== undefined);
      process.kill(pid, signal);
      await eventually("the agent to stop", () =>
        /"event":"agent\.stopping"/.test(agent.stderr()) ? true : undefined,
      );
      process.kill(pid, signal);
      writeFileSync(release, "");
      assert.equal(await agent.exited, 0, `${agent.child.signalCode ?? ""} ${agent.stderr()}`);
      const lines = logLines<{ level: string; event: string; signal?: string }>(agent.stderr());
      assert.deepEqual(
        lines.filter((line) => line.level === "error" || line.level === "warn"),
        [],
        agent.stderr(),
      );
      assert.deepEqual(
        lines.filter((line) => line.event === "agent.stopping").map((line) => line.signal),
        [signal],
        "stopped once, by the first signal",
      );
      assert.ok(
        existsSync(join(root, "etc", "after")),
        "the declaration under way was applied before the agent stopped",
      );
    });
  }
});
