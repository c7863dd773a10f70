/**
 * `mesh up` keeps the mesh running through faults, against its real nats-server and a real `mesh-host` node: the
 * broker paused for 30 s (the control plane loses its lease and a fresh one takes over, the broker keeps serving,
 * and the node is never called out of touch for the control plane's own deafness), the broker killed (started
 * again on the same port and data), the control plane killed (started again, it takes the lease over). And the
 * broker's address never moves by itself, and a terminal's signals stop it in order.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import type { TestContext } from "node:test";
import type { Fleet } from "../support/fleets.js";
import { controlPlanePid, fleetForTest } from "../support/fleets.js";
import { mesh, meshHost } from "../support/cli.js";
import { eventually, logLines, startBin } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

/** The pids of processes whose command line holds `pattern` (none: empty). */
function pidsOf(pattern: string): number[] {
  try {
    return execFileSync("pgrep", ["-f", "--", pattern], { encoding: "utf8" }).trim().split("\n").map(Number);
  } catch (error) {
    if ((error as { status?: number }).status === 1) return [];
    throw error;
  }
}

const brokerOf = (fleet: Fleet) => {
  const pids = pidsOf(join(fleet.data, "nats", "server", "nats-server.conf"));
  assert.equal(pids.length, 1, `one nats-server for ${fleet.data}: ${pids.join(", ")}`);
  return pids[0] as number;
};

const events = (fleet: Fleet, name: string) =>
  fleet.up
    .stderr()
    .split("\n")
    .filter((line) => line.includes(`"event":"${name}"`));

/** A joined node running `mesh-host run`, holding one applied declaration. */
async function steadyNode(fleet: Fleet, t: TestContext, node: string): Promise<{ root: string }> {
  const state = join(fleet.dir, node);
  const root = join(fleet.dir, `${node}-root`);
  const joinRun = await meshHost(["join", await fleet.issue(node), "--state", state]);
  assert.equal(joinRun.code, 0, joinRun.stderr);
  fleet.runAgent(state, root, t);
  await declaredAndApplied(fleet, node, root, "before\n");
  return { root };
}

async function declaredAndApplied(fleet: Fleet, node: string, root: string, content: string): Promise<void> {
  await fleet.declareFiles(node, [{ path: "/etc/motd", content }]);
  const motd = join(root, "etc", "motd");
  await eventually(
    `${node} to apply "${content.trim()}"`,
    () => (existsSync(motd) && readFileSync(motd, "utf8") === content ? true : undefined),
    120_000,
  );
}

/** Every node `here`, as `mesh node list` says. */
async function allHere(fleet: Fleet): Promise<void> {
  await eventually(
    "every node to be here",
    async () => ((await fleet.list()).every((node) => node.liveness === "here") ? true : undefined),
    120_000,
  );
}

describe("mesh up through faults (NATS)", () => {
  test("faults — the broker paused 30 s: the broker keeps serving, a fresh control plane takes over, nobody is called out of touch", async (t) => {
    // A threshold far shorter than the pause: a control plane that blamed its deafness on the node would say so.
    const fleet = await fleetForTest(t, "nats", { outOfTouchAfter: "5s" });
    const { root } = await steadyNode(fleet, t, "steady-1");
    const broker = brokerOf(fleet);
    const firstControl = controlPlanePid(fleet);
    process.kill(broker, "SIGSTOP");
    try {
      // The fault itself: the pause lasts longer than the lease (15 s), as in the field report.
      await new Promise((resolve) => setTimeout(resolve, 30_000));
    } finally {
      process.kill(broker, "SIGCONT");
    }
    await eventually(
      "a fresh control plane to act",
      () => (events(fleet, "control.serving").length >= 2 ? true : undefined),
      120_000,
    ).catch((error: unknown) => {
      // What mesh up said is the whole story of a takeover that did not come.
      throw new Error(`${String(error)}\n${fleet.up.stderr().slice(-4000)}`);
    });
    assert.equal(fleet.up.child.exitCode, null, "mesh up still runs");
    assert.equal(brokerOf(fleet), broker, "the same broker process kept serving: it was never stopped");
    assert.notEqual(controlPlanePid(fleet), firstControl, "the control plane that lost its lease ended");
    await allHere(fleet);
    await declaredAndApplied(fleet, "steady-1", root, "after the pause\n");
    assert.equal(events(fleet, "control.deaf").length >= 1, true, "the deafness was said");
    assert.deepEqual(
      events(fleet, "node.out_of_touch"),
      [],
      "no node blamed for the control plane's deafness",
    );
    const shown = await fleet.show("steady-1");
    assert.equal(shown.liveness, "here");
  });

  test("faults — the broker killed: started again on the same port and data; the node is back and takes declarations", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const { root } = await steadyNode(fleet, t, "steady-2");
    const broker = brokerOf(fleet);
    process.kill(broker, "SIGKILL");
    await eventually("the broker to be started again", () => {
      const now = pidsOf(join(fleet.data, "nats", "server", "nats-server.conf"));
      return now.length === 1 && now[0] !== broker ? true : undefined;
    });
    const recorded = JSON.parse(readFileSync(join(fleet.data, "broker.json"), "utf8")) as { url: string };
    assert.equal(recorded.url, fleet.brokerUrl, "the same address");
    await declaredAndApplied(fleet, "steady-2", root, "after the broker came back\n");
    await allHere(fleet);
    assert.equal(fleet.up.child.exitCode, null, "mesh up still runs");
    assert.equal(events(fleet, "broker.started_again").length, 1);
  });

  test("faults — the control plane killed: mesh up starts another, which takes the lease over and acts", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const { root } = await steadyNode(fleet, t, "steady-3");
    const first = controlPlanePid(fleet);
    process.kill(first, "SIGKILL");
    // The new one stands by until the killed one's lease ages out, then takes it.
    await eventually(
      "a new control plane to act",
      () => (events(fleet, "control.serving").length >= 2 ? true : undefined),
      120_000,
    );
    const lease = JSON.parse((await fleet.cli(["lease", "show", "--json"])).stdout) as {
      holder: { pid: number } | null;
    };
    assert.equal(lease.holder?.pid, controlPlanePid(fleet));
    assert.notEqual(lease.holder.pid, first);
    await declaredAndApplied(fleet, "steady-3", root, "after the control plane came back\n");
    assert.equal(brokerOf(fleet) > 0, true);
  });
});

describe("mesh up stopped from its terminal", () => {
  /** The process group `pid` is in. */
  const groupOf = (pid: number) =>
    Number(readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ")[2]);
  const cases: Array<[string, NodeJS.Signals[]]> = [
    ["Ctrl-C, and again while it stops (npm exec passes the terminal's on)", ["SIGINT", "SIGINT"]],
    ["the terminal closed", ["SIGHUP"]],
  ];
  for (const [what, signals] of cases) {
    test(`signals — ${what}, to the whole process group: the lease is given back through the broker, then the broker stops; no error, nothing left running`, async (t) => {
      const dir = tempDir("mesh-up-signals-");
      const data = join(dir.path, "data");
      const up = startBin("mesh", ["--data", data, "up", "--nats-port", "0"], {}, { ownProcessGroup: true });
      t.after(() => {
        for (const pid of pidsOf(data)) process.kill(pid, "SIGKILL");
        dir.remove();
      });
      await eventually("the control plane to serve", () =>
        /"event":"control\.serving"/.test(up.stderr()) ? true : undefined,
      );
      const group = up.child.pid;
      assert.ok(group !== undefined);
      const broker = pidsOf(join(data, "nats", "server", "nats-server.conf"));
      const control = pidsOf(`--data ${data} serve`);
      assert.equal(broker.length + control.length, 2, "the broker and the control plane");
      for (const pid of [...broker, ...control])
        assert.notEqual(groupOf(pid), group, "out of the terminal's reach");

      // The control plane paused, mesh up waits in its stop for as long as the test likes: a signal sent again then
      // reaches it while it stops, not while it ends.
      const [controlPid] = control as [number];
      process.kill(controlPid, "SIGSTOP");
      const [first, ...again] = signals as [NodeJS.Signals, ...NodeJS.Signals[]];
      process.kill(-group, first);
      await eventually("mesh up to stop", () =>
        /"event":"mesh\.stopping"/.test(up.stderr()) ? true : undefined,
      );
      for (const signal of again) process.kill(-group, signal);
      process.kill(controlPid, "SIGCONT");
      assert.equal(await up.exited, 0, `${up.child.signalCode ?? ""} ${up.stderr()}`);
      const lines = logLines<{ level: string; event: string; given_back?: boolean }>(up.stderr());
      assert.deepEqual(
        lines.filter((line) => line.level === "error" || line.level === "warn"),
        [],
        "the broker was stopped by mesh up, after the control plane: it never ended by itself",
      );
      assert.ok(
        lines.some((line) => line.event === "lease.released" && line.given_back === true),
        up.stderr(),
      );
      assert.deepEqual(pidsOf(data), [], "neither the broker nor the control plane is left running");
    });
  }
});

describe("mesh up killed outright", () => {
  test("faults — mesh up killed with SIGKILL leaves its nats-server running: the next mesh up on the same data stops that one, starts its own on the same port and acts", async (t) => {
    const dir = tempDir("mesh-up-left-");
    const data = join(dir.path, "data");
    const config = join(data, "nats", "server", "nats-server.conf");
    t.after(() => {
      for (const pid of pidsOf(data)) process.kill(pid, "SIGKILL");
      dir.remove();
    });
    const urlOf = (text: string) => /broker\s+(nats:\/\/\S+)/.exec(text)?.[1];
    const first = startBin("mesh", ["--data", data, "up", "--nats-port", "0"]);
    const url = await eventually("the first mesh up to serve", () =>
      /"event":"control\.serving"/.test(first.stderr()) ? urlOf(first.stdout()) : undefined,
    );
    const [left] = pidsOf(config) as [number];
    assert.equal(pidsOf(config).length, 1, "one nats-server for the data dir");
    // No chance to stop anything: its broker, a process of its own, goes on serving the port.
    process.kill(first.child.pid as number, "SIGKILL");
    await first.exited;
    assert.deepEqual(pidsOf(config), [left], "the nats-server outlived the mesh up that started it");

    const second = startBin("mesh", ["--data", data, "up"]);
    // Its control plane's log and its own summary on stdout come separately: both are waited for.
    const secondUrl = await eventually("the second mesh up to serve", () =>
      /"event":"control\.serving"/.test(second.stderr()) ? urlOf(second.stdout()) : undefined,
    );
    assert.match(
      second.stderr(),
      new RegExp(`this mesh's nats-server was left running \\(pid ${left}\\); it is started again here`),
    );
    const now = pidsOf(config);
    assert.equal(now.length, 1, `one nats-server for the data dir: ${now.join(", ")}`);
    assert.notEqual(now[0], left, "the one left behind was stopped");
    assert.equal(secondUrl, url, "on the same port");
    assert.equal(await second.stop("SIGTERM"), 0, second.stderr());
    assert.deepEqual(pidsOf(data), [], "nothing left running");
  });
});

describe("mesh up keeps its broker's address", () => {
  test("cli — another --nats-port is refused without --move-broker; with it the broker moves and the operator is told how", async (t) => {
    const dir = tempDir("mesh-up-move-");
    t.after(() => dir.remove());
    const data = join(dir.path, "data");
    const urlOf = (text: string) => /broker\s+(nats:\/\/\S+)/.exec(text)?.[1];
    const first = startBin("mesh", ["--data", data, "up", "--nats-port", "0"]);
    const firstUrl = await eventually("the first start", () => urlOf(first.stdout()));
    assert.equal(await first.stop("SIGTERM"), 0, first.stderr());
    const record = () => readFileSync(join(data, "broker.json"), "utf8");
    const before = record();

    for (const port of ["0", "1"]) {
      const refused = await mesh(["--data", data, "up", "--nats-port", port]);
      assert.equal(refused.code, 2, refused.stderr);
      assert.match(
        refused.stderr,
        /^mesh: this mesh's broker is on port \d+, where its nodes reach it; --nats-port \d+ would move it: give --move-broker as well/,
      );
      assert.equal(refused.stderr.split("\n").length, 2, "one line");
      assert.equal(record(), before, "nothing recorded");
    }
    const again = startBin("mesh", ["--data", data, "up", "--nats-port", new URL(firstUrl).port]);
    assert.equal(await eventually("the same port again", () => urlOf(again.stdout())), firstUrl);
    assert.equal(await again.stop("SIGTERM"), 0, again.stderr());

    const moved = startBin("mesh", ["--data", data, "up", "--nats-port", "0", "--move-broker"]);
    const movedUrl = await eventually("the moved start", () => urlOf(moved.stdout()));
    assert.equal(await moved.stop("SIGTERM"), 0, moved.stderr());
    assert.notEqual(movedUrl, firstUrl);
    assert.match(
      moved.stderr(),
      /the broker moves from port \d+ to \d+\. Every enrolled node still dials .*mesh-host broker set/,
    );
    assert.equal((JSON.parse(record()) as { url: string }).url, movedUrl);
  });
});
