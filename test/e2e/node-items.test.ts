/**
 * What a node holds beyond text files, through `mesh declare` and a real `mesh-host` on `mesh up`: directories with
 * mode and owner, symbolic links, binary content; drift put back and reported (a hand-edited file, a changed mode);
 * a failed item tried again until it applies; and every kind's bad input refused when the operator writes it.
 */
import assert from "node:assert/strict";
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import type { TestContext } from "node:test";
import { openStore } from "../../src/store/index.js";
import { meshHost } from "../support/cli.js";
import type { Fleet } from "../support/fleets.js";
import { fleetForTest } from "../support/fleets.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";

interface ShownItems {
  account: {
    outcome: string;
    sequence: number | null;
    items: Array<{ id: string; state: string; reason?: string; drift?: string }>;
  } | null;
  declaration: { sequence: number } | null;
}

async function runNode(fleet: Fleet, t: TestContext, node: string, root: string): Promise<Running> {
  const state = join(fleet.dir, node);
  const joined = await meshHost(["join", await fleet.issue(node), "--state", state]);
  assert.equal(joined.code, 0, joined.stderr);
  return runAgentAgain(fleet, t, node, root);
}

/** Starts the agent of a node that joined already (checks every second), on its state dir and root. */
function runAgentAgain(fleet: Fleet, t: TestContext, node: string, root: string): Promise<Running> {
  const agent = startBin("mesh-host", [
    "run",
    "--state",
    join(fleet.dir, node),
    "--root",
    root,
    "--alive-every",
    "200ms",
    "--verify-every",
    "1s",
  ]);
  t.after(() => agent.stop("SIGTERM"));
  return Promise.resolve(agent);
}

async function show(fleet: Fleet, node: string): Promise<ShownItems> {
  const run = await fleet.cli(["node", "show", node, "--json"]);
  assert.equal(run.code, 0, run.stderr);
  return JSON.parse(run.stdout) as ShownItems;
}

function declareFile(fleet: Fleet, name: string, text: string): string {
  const file = join(fleet.dir, name);
  writeFileSync(file, text);
  return file;
}

describe("node items (nats)", () => {
  test("items — directories, links and binary content applied; a hand edit and a mode change put back and reported as drift", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const root = join(fleet.dir, "root-1");
    mkdirSync(root);
    await runNode(fleet, t, "items-1", root);
    const bytes = Buffer.from([0, 1, 2, 250, 255]);
    const file = declareFile(
      fleet,
      "items.yaml",
      `files:
  - {path: /srv/app, type: directory, owner: 1234, mode: "0750"}
  - {path: /srv/app/hello.txt, content: "hello\\n", owner: 1234, group: 1234, mode: "0640"}
  - {path: /srv/app/current, type: symlink, target: hello.txt}
  - {path: /srv/app/blob.bin, content_base64: "${bytes.toString("base64")}"}
`,
    );
    const declared = await fleet.cli(["declare", "items-1", "-f", file, "--wait"]);
    assert.equal(declared.code, 0, declared.stderr + declared.stdout);
    const dir = lstatSync(join(root, "srv", "app"));
    assert.ok(dir.isDirectory());
    assert.equal(dir.mode & 0o7777, 0o750);
    assert.equal(dir.uid, 1234);
    const hello = join(root, "srv", "app", "hello.txt");
    assert.equal(readFileSync(hello, "utf8"), "hello\n");
    assert.equal(lstatSync(hello).mode & 0o7777, 0o640);
    assert.deepEqual([lstatSync(hello).uid, lstatSync(hello).gid], [1234, 1234]);
    assert.equal(readlinkSync(join(root, "srv", "app", "current")), "hello.txt");
    assert.deepEqual(readFileSync(join(root, "srv", "app", "blob.bin")), bytes);

    // By hand: the content edited and the mode opened. The next check puts both back and says what it found.
    writeFileSync(hello, "edited by hand\n");
    chmodSync(join(root, "srv", "app", "blob.bin"), 0o666);
    await eventually("the edit to be put back", () =>
      readFileSync(hello, "utf8") === "hello\n" ? true : undefined,
    );
    const reported = await eventually("the drift to be reported", async () => {
      const shown = await show(fleet, "items-1");
      const drift = shown.account?.items.filter((item) => item.drift !== undefined) ?? [];
      return drift.length === 2 ? shown : undefined;
    });
    assert.equal(lstatSync(join(root, "srv", "app", "blob.bin")).mode & 0o7777, 0o644);
    const drifts = Object.fromEntries(reported.account?.items.map((item) => [item.id, item.drift]) ?? []);
    assert.match(drifts["file:/srv/app/hello.txt"] ?? "", /content changed/);
    assert.match(drifts["file:/srv/app/blob.bin"] ?? "", /mode 0666, not 0644/);
    assert.equal(reported.account?.outcome, "applied");
    const text = await fleet.cli(["node", "show", "items-1"]);
    assert.match(
      text.stdout,
      /^drift\s+.*file:\/srv\/app\/hello\.txt: content changed.*\(\d+ repaired in all; \d+ failed report\(s\)\)$/m,
    );
    assert.equal(
      reported.account?.sequence,
      reported.declaration?.sequence,
      "the same declaration, reported again",
    );
    // A drift is an event in the audit trail.
    const store = await openStore(`sqlite:${join(fleet.data, "mesh.db")}`, { historyLimit: 50 });
    t.after(() => store.close());
    const events = await eventually("the drift event", async () => {
      const found = (await store.events.list({ limit: 1000 })).filter((event) => event.kind === "node.drift");
      return found.length > 0 ? found : undefined;
    });
    assert.equal(events[0]?.node, "items-1");
  });

  test("items — a failed item is tried again with backoff and applies once what stood in its way is gone", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const root = join(fleet.dir, "root-2");
    mkdirSync(root);
    // A regular file where the declared file's directory must go.
    writeFileSync(join(root, "opt"), "in the way\n");
    await runNode(fleet, t, "retry-1", root);
    const file = declareFile(fleet, "retry.yaml", "files:\n  - {path: /opt/app.conf, content: ok}\n");
    const waited = await fleet.cli(["declare", "retry-1", "-f", file, "--wait"]);
    assert.equal(waited.code, 1);
    assert.match(
      waited.stdout,
      /retry-1\s+\d+\s+failed\s+1 of 1 item\(s\) failed: file:\/opt\/app\.conf: .*not a directory/,
    );
    rmSync(join(root, "opt"));
    await eventually("the retry to apply it", async () => {
      const shown = await show(fleet, "retry-1");
      return shown.account?.outcome === "applied" ? true : undefined;
    });
    assert.equal(readFileSync(join(root, "opt", "app.conf"), "utf8"), "ok");
  });

  test("items — a rebuilt node joining again is told what it owns: a file and a service that still match are kept, what was dropped removed, nothing else touched", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const root = join(fleet.dir, "root-rb");
    mkdirSync(root);
    const first = await runNode(fleet, t, "rb-1", root);
    const keeper = "services:\n  - {name: keeper, command: [/bin/sleep, '876543'], restart: always}\n";
    const pidFile = join(fleet.dir, "rb-1", "services", "keeper", "pid.json");
    const seen = new Set<number>();
    const keeperPid = () => {
      if (!existsSync(pidFile)) return undefined;
      const { pid } = JSON.parse(readFileSync(pidFile, "utf8")) as { pid: number };
      seen.add(pid);
      return pid;
    };
    t.after(() => {
      for (const pid of seen) if (existsSync(`/proc/${pid}`)) process.kill(-pid, "SIGKILL");
    });
    const both = declareFile(
      fleet,
      "ab.yaml",
      `files:\n  - {path: /etc/a, content: A}\n  - {path: /etc/b, content: B}\n${keeper}`,
    );
    const applied = await fleet.cli(["declare", "rb-1", "-f", both, "--wait"]);
    assert.equal(applied.code, 0, applied.stderr + applied.stdout);
    writeFileSync(join(root, "etc", "c"), "not the mesh's\n");
    const a = lstatSync(join(root, "etc", "a"));
    const running = await eventually("the service to run", () => keeperPid());

    // The disk is rebuilt: the agent gone, its state dir wiped; meanwhile the node's declaration drops B.
    await first.stop("SIGTERM");
    rmSync(join(fleet.dir, "rb-1"), { recursive: true });
    const onlyA = declareFile(fleet, "a.yaml", `files:\n  - {path: /etc/a, content: A}\n${keeper}`);
    assert.equal((await fleet.cli(["declare", "rb-1", "-f", onlyA])).code, 0);
    const rebuilt = await runNode(fleet, t, "rb-1", root);
    await eventually("B to be removed", () => (existsSync(join(root, "etc", "b")) ? undefined : true));
    await eventually("the rebuilt node to report", async () => {
      const shown = await show(fleet, "rb-1");
      return shown.account?.outcome === "applied" && shown.account.sequence === shown.declaration?.sequence
        ? true
        : undefined;
    });
    const kept = lstatSync(join(root, "etc", "a"));
    assert.deepEqual([kept.ino, kept.mtimeMs], [a.ino, a.mtimeMs], "A adopted, not rewritten");
    assert.equal(readFileSync(join(root, "etc", "c"), "utf8"), "not the mesh's\n", "C untouched");
    assert.match(rebuilt.stderr(), /"event":"agent\.recovered","node":"rb-1","items":3/);
    assert.equal(keeperPid(), running, "the service adopted, not started again");
    assert.match(rebuilt.stderr(), /"event":"service\.adopted","service":"keeper","pid":\d+/);
  });

  test("items — the issue's example on a scratch root: a user, a directory and file it owns, a service run as it; killed, restarted; the agent restarted, the service adopted; a deleted user put back", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const root = join(fleet.dir, "root-ex");
    mkdirSync(join(root, "etc"), { recursive: true });
    writeFileSync(join(root, "etc", "passwd"), "root:x:0:0:root:/root:/bin/bash\n");
    writeFileSync(join(root, "etc", "group"), "root:x:0:\n");
    writeFileSync(join(root, "etc", "shadow"), "root:*:19000:0:99999:7:::\n", { mode: 0o640 });
    writeFileSync(join(root, "etc", "gshadow"), "root:*::\n", { mode: 0o640 });
    const machinePasswd = readFileSync("/etc/passwd", "utf8");
    const state = join(fleet.dir, "ex-1");
    const pidFile = join(state, "services", "sleeper", "pid.json");
    /** Every pid the service had: it outlives its agent by design, so the test ends each one. */
    const seen = new Set<number>();
    const servicePid = () => {
      if (!existsSync(pidFile)) return undefined;
      const { pid } = JSON.parse(readFileSync(pidFile, "utf8")) as { pid: number };
      seen.add(pid);
      return pid;
    };
    const alive = (pid: number | undefined) => pid !== undefined && existsSync(`/proc/${pid}`);
    t.after(() => {
      for (const pid of seen) if (alive(pid)) process.kill(-pid, "SIGKILL");
    });
    const agent = await runNode(fleet, t, "ex-1", root);
    const file = declareFile(
      fleet,
      "example.yaml",
      `users:
  - {name: app, uid: 1777, shell: /usr/sbin/nologin}
files:
  - {path: /srv/app, type: directory, owner: app, mode: "0750"}
  - {path: /srv/app/hello.txt, content: "hello\\n", owner: app, mode: "0640"}
services:
  - {name: sleeper, command: [/bin/sleep, "987654"], user: app, restart: always}
`,
    );
    const declared = await fleet.cli(["declare", "ex-1", "-f", file, "--wait"]);
    assert.equal(declared.code, 0, declared.stderr + declared.stdout);
    assert.match(
      readFileSync(join(root, "etc", "passwd"), "utf8"),
      /^app:x:1777:\d+::\/home\/app:\/usr\/sbin\/nologin$/m,
    );
    assert.equal(readFileSync("/etc/passwd", "utf8"), machinePasswd, "the machine's own accounts untouched");
    assert.equal(lstatSync(join(root, "srv", "app")).uid, 1777);
    assert.equal(lstatSync(join(root, "srv", "app", "hello.txt")).uid, 1777);
    const first = await eventually("the service to run", () =>
      alive(servicePid()) ? servicePid() : undefined,
    );
    assert.match(readFileSync(`/proc/${first}/status`, "utf8"), /^Uid:\s+1777\s/m, "run as app");

    // Killed: restarted after its pause, as a new process.
    process.kill(first, "SIGKILL");
    const second = await eventually("the service to be restarted", () => {
      const pid = servicePid();
      return pid !== first && alive(pid) ? pid : undefined;
    });
    // The agent restarted: the service is adopted, the same process.
    await agent.stop("SIGTERM");
    assert.equal(alive(second), true, "the service outlives its agent");
    await runAgentAgain(fleet, t, "ex-1", root);
    await eventually("the restarted agent to report", async () =>
      (await show(fleet, "ex-1")).account?.outcome === "applied" ? true : undefined,
    );
    assert.equal(servicePid(), second, "adopted, not restarted");

    // The user deleted by hand: put back at the next check, and reported as drift.
    const passwd = join(root, "etc", "passwd");
    writeFileSync(passwd, readFileSync(passwd, "utf8").replace(/^app:.*\n/m, ""));
    await eventually("the user to be put back", () =>
      /^app:x:1777:/m.test(readFileSync(passwd, "utf8")) ? true : undefined,
    );
    await eventually("the drift to be reported", async () => {
      const shown = await show(fleet, "ex-1");
      return shown.account?.items.some(
        (item) => item.id === "user:app" && /missing|not there|no such/i.test(item.drift ?? ""),
      )
        ? true
        : undefined;
    });
    assert.equal(servicePid(), second);
  });

  test("items — each kind's bad input is refused when the operator writes it, exit 2, nothing written", async (t) => {
    const fleet = await fleetForTest(t, "nats");
    const bad: Array<[string, string, RegExp]> = [
      [
        "both contents",
        "files:\n  - {path: /a, content: x, content_base64: eA==}\n",
        /content or content_base64/,
      ],
      ["a link without a target", "files:\n  - {path: /a, type: symlink}\n", /files\[0\]\.target/],
      [
        "not base64",
        "files:\n  - {path: /a, content_base64: '*'}\n",
        /files\[0\]\.content_base64: expected base64/,
      ],
      ["a bad owner", "files:\n  - {path: /a, content: x, owner: 'Bad Name'}\n", /files\[0\]\.owner/],
      ["a bad user name", "users:\n  - {name: 'Root!'}\n", /users\[0\]\.name: expected a user or group name/],
      [
        "a relative program",
        "services:\n  - {name: s, command: [sleep, '1']}\n",
        /services\[0\]\.command\[0\]/,
      ],
      [
        "an unknown restart",
        "services:\n  - {name: s, command: [/bin/true], restart: sometimes}\n",
        /services\[0\]\.restart/,
      ],
      [
        "two users of one name",
        "users:\n  - {name: app}\n  - {name: app}\n",
        /users\[1\]\.name: repeats an earlier user's name/,
      ],
      ["a bad gid", "groups:\n  - {name: ops, gid: -1}\n", /groups\[0\]\.gid/],
      ["an unknown group field", "groups:\n  - {name: ops, members: [a]}\n", /groups\[0\].*members/],
    ];
    for (const [what, text, reason] of bad) {
      const run = await fleet.cli(["declare", "nobody-yet", "-f", declareFile(fleet, "bad.yaml", text)]);
      assert.equal(run.code, 2, `${what}: ${run.stderr}`);
      assert.match(run.stderr, reason, what);
    }
    // The overlay is written in the plan: a network it cannot use is refused the same way.
    const plan = declareFile(fleet, "bad-plan.yaml", "units: []\noverlay: {cidr: 10.99.0.0/8}\n");
    const refused = await fleet.cli(["plan", "apply", "-f", plan]);
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /overlay\.cidr: expected an IPv4 network from \/16 to \/30/);
    const history = await fleet.cli(["plan", "history", "--json"]);
    assert.deepEqual(JSON.parse(history.stdout), [], "nothing was written");
  });
});
