import assert from "node:assert/strict";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import type { ItemResult } from "../../src/host/appliers.js";
import { ServiceApplier } from "../../src/host/service-applier.js";
import type { ServiceApplierOptions } from "../../src/host/service-applier.js";
import type { DeclaredItem } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import { procFile, zombieStat } from "../support/processes.js";
import { tempDir } from "../support/tmp.js";

type ServiceItem = Extract<DeclaredItem, { type: "service" }>;

const scratch = tempDir("mesh-service-applier-");
const appliers: ServiceApplier[] = [];
const stateDirs: string[] = [];
const pids = new Set<number>();
let cases = 0;

after(async () => {
  for (const applier of appliers) await applier.close();
  // Every process a test started, whether or not its applier still knows it: its whole process group.
  for (const dir of stateDirs) {
    const root = join(dir, "services");
    if (!existsSync(root)) continue;
    for (const name of readdirSync(root)) {
      const record = join(root, name, "pid.json");
      if (existsSync(record)) pids.add((JSON.parse(readFileSync(record, "utf8")) as { pid: number }).pid);
    }
  }
  for (const pid of pids) kill(-pid, "SIGKILL");
  scratch.remove();
});

/** A fresh state directory and an applier over it with short timers. */
function freshCase(options: Partial<ServiceApplierOptions> = {}): {
  stateDir: string;
  applier: ServiceApplier;
} {
  cases += 1;
  const stateDir = join(scratch.path, `case-${cases}`);
  mkdirSync(stateDir);
  stateDirs.push(stateDir);
  return { stateDir, applier: applierOver(stateDir, options) };
}

function applierOver(stateDir: string, options: Partial<ServiceApplierOptions> = {}): ServiceApplier {
  const applier = new ServiceApplier({
    stateDir,
    log: createLogger({ write: () => undefined, level: "error" }),
    backoffInitialMs: 200,
    backoffMaxMs: 5_000,
    stableAfterMs: 60_000,
    pollMs: 50,
    killWaitMs: 10_000,
    ...options,
  });
  appliers.push(applier);
  return applier;
}

/**
 * A service's command that (after `before`, if any) starts a child ignoring SIGTERM (an ignored signal stays ignored
 * across exec), appends the child's pid to `children`, then runs `then`.
 */
function leavingChild(children: string, then: string, before?: string): [string, ...string[]] {
  const start = `(trap "" TERM; exec sleep 1000) & echo $! >> ${children}; ${then}`;
  return ["/bin/sh", "-c", before === undefined ? start : `${before}; ${start}`];
}

/** The pids a service's runs appended to `file`, one a line. */
function pidsIn(file: string): number[] {
  return readFileSync(file, "utf8").trim().split("\n").map(Number);
}

function service(
  name: string,
  command: [string, ...string[]],
  extra: Partial<ServiceItem> = {},
): ServiceItem {
  return { id: `service:${name}`, type: "service", name, command, restart: "on-failure", ...extra };
}

function sleeper(name: string, extra: Partial<ServiceItem> = {}): ServiceItem {
  return service(name, ["/bin/sleep", "1000"], extra);
}

type Record = {
  pid: number;
  started_at: string;
  stop_grace_ms: number;
  ended?: { code: number | null; signal: string | null };
};

function recordOf(stateDir: string, name: string): Record | undefined {
  const path = join(stateDir, "services", name, "pid.json");
  return existsSync(path) ? (JSON.parse(readFileSync(path, "utf8")) as Record) : undefined;
}

/** The pid an applied result names ("running pid N since …"). */
function pidOf(result: ItemResult | undefined): number {
  assert.equal(result?.state, "applied", `expected applied, got ${JSON.stringify(result)}`);
  const match = /running pid (\d+)/.exec(result?.detail ?? "");
  assert.ok(match?.[1], `no pid in ${JSON.stringify(result)}`);
  const pid = Number(match[1]);
  pids.add(pid);
  return pid;
}

/** True while the process exists and is not a zombie. */
function isRunning(pid: number): boolean {
  const stat = procFile(pid, "stat");
  return stat !== undefined && !zombieStat(stat);
}

/** The pids in process group `group`, from /proc. */
function groupMembers(group: number): number[] {
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .flatMap((entry) => {
      const stat = procFile(entry, "stat");
      if (stat === undefined) return [];
      const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      return Number(rest[2]) === group && !zombieStat(stat) ? [Number(entry)] : [];
    });
}

function kill(target: number, signal: NodeJS.Signals): void {
  try {
    process.kill(target, signal);
  } catch (error) {
    if (!(error instanceof Error && "code" in error && error.code === "ESRCH")) throw error;
  }
}

/** Polls every 50 ms until `check` gives a value; the deadline guards against a hang, it measures nothing. */
async function eventually<T>(what: string, check: () => T | undefined | Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Waits until the record names a pid other than `old`, and gives it. */
function restartedFrom(stateDir: string, name: string, old: number): Promise<Record> {
  return eventually(`${name} restarted`, () => {
    const record = recordOf(stateDir, name);
    if (record === undefined || record.pid === old || record.ended !== undefined) return undefined;
    pids.add(record.pid);
    return record;
  });
}

void describe("service applier", () => {
  void test("service applier — starts a service, and applying it unchanged keeps the same process", async () => {
    const { stateDir, applier } = freshCase();
    const item = sleeper("sleeper");
    const [first] = await applier.apply([item]);
    const pid = pidOf(first);
    assert.ok(isRunning(pid));
    assert.match(first?.detail ?? "", /0 restarts/);
    assert.equal(recordOf(stateDir, "sleeper")?.pid, pid);

    const [again] = await applier.apply([item]);
    assert.equal(pidOf(again), pid);
    assert.deepEqual(await applier.verify([item]), []);

    // How it is restarted and stopped is the supervisor's business, not the process's: no restart for that.
    const retuned = { ...item, restart: "always" as const, stop_grace_ms: 2_000 };
    assert.equal(pidOf((await applier.apply([retuned]))[0]), pid);
    assert.equal(recordOf(stateDir, "sleeper")?.stop_grace_ms, 2_000);
  });

  void test("service applier — a killed service is restarted after its pause, which doubles", async () => {
    const { stateDir, applier } = freshCase({ backoffInitialMs: 300 });
    const item = sleeper("restarts", { restart: "always" });
    const pid = pidOf((await applier.apply([item]))[0]);

    const killedAt = Date.now();
    kill(pid, "SIGKILL");
    const second = await restartedFrom(stateDir, "restarts", pid);
    assert.ok(isRunning(second.pid));
    assert.ok(
      Date.parse(second.started_at) - killedAt >= 300,
      `restarted ${Date.parse(second.started_at) - killedAt} ms after the kill, before the first pause of 300 ms`,
    );

    const killedAgain = Date.now();
    kill(second.pid, "SIGKILL");
    const third = await restartedFrom(stateDir, "restarts", second.pid);
    assert.ok(
      Date.parse(third.started_at) - killedAgain >= 600,
      `restarted ${Date.parse(third.started_at) - killedAgain} ms after the kill, before the doubled pause of 600 ms`,
    );
    const [result] = await applier.apply([item]);
    assert.equal(pidOf(result), third.pid);
    assert.match(result?.detail ?? "", /2 restarts/);
  });

  void test("service applier — restart never stays down; verify and apply say how it ended", async () => {
    const { stateDir, applier } = freshCase();
    const item = service("once", ["/bin/sh", "-c", "echo starting; echo boom >&2; exit 3"], {
      restart: "never",
    });
    await applier.apply([item]);
    // Between the process ending and its exit being taken, verify says only that it is gone.
    const drifts = await eventually("the drift naming the exit", async () => {
      const found = await applier.verify([item]);
      return /code 3/.test(found[0]?.what ?? "") ? found : undefined;
    });
    assert.equal(drifts[0]?.id, "service:once");
    assert.match(drifts[0]?.what ?? "", /not running: failed: exited with code 3/);
    assert.match(drifts[0]?.what ?? "", /boom/);

    const before = recordOf(stateDir, "once");
    assert.equal(before?.ended?.code, 3);
    // Longer than several pauses: a restart, were there one, would have come by now.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const [result] = await applier.apply([item]);
    assert.equal(result?.state, "failed");
    assert.match(result?.reason ?? "", /exited with code 3 .*not restarted \(restart: never\); stderr: boom/);
    assert.equal(recordOf(stateDir, "once")?.pid, before?.pid);
  });

  void test("service applier — a crash loop reports the exit code and the end of stderr, bounded", async () => {
    const { applier } = freshCase({ backoffInitialMs: 2_000 });
    const noise = "x".repeat(2_000);
    const item = service("crashes", [
      "/bin/sh",
      "-c",
      `echo '${noise}' >&2; echo 'fatal: no config in /etc/crashes' >&2; exit 2`,
    ]);
    await applier.apply([item]);
    const failed = await eventually("a failed result", async () => {
      const [result] = await applier.apply([item]);
      return result?.state === "failed" ? result : undefined;
    });
    assert.match(failed.reason ?? "", /^exited with code 2 at .*; restart 1 in/);
    assert.match(failed.reason ?? "", /fatal: no config in \/etc\/crashes$/);
    assert.ok(Buffer.byteLength(failed.reason ?? "") <= 512);
  });

  void test("service applier — a changed definition stops the old process and starts the new", async () => {
    const { applier } = freshCase();
    const old = pidOf((await applier.apply([sleeper("changes")]))[0]);
    const changed = service("changes", ["/bin/sleep", "1001"], { env: { MODE: "new" } });
    const pid = pidOf((await applier.apply([changed]))[0]);
    assert.notEqual(pid, old);
    assert.ok(isRunning(pid));
    assert.equal(isRunning(old), false);
    assert.match(readFileSync(`/proc/${pid}/environ`, "utf8"), /MODE=new/);
    assert.deepEqual(await applier.verify([changed]), []);
    assert.deepEqual(await applier.verify([sleeper("changes")]), [
      { id: "service:changes", what: `running a different definition (pid ${pid})` },
    ]);
  });

  void test("service applier — a service no longer declared gets its stop signal and is forgotten", async () => {
    const { stateDir, applier } = freshCase();
    const item = service("polite", [
      "/bin/sh",
      "-c",
      'trap "echo got-term; exit 0" TERM; while :; do sleep 0.05; done',
    ]);
    const pid = pidOf((await applier.apply([item]))[0]);
    assert.deepEqual(await applier.apply([]), []);
    assert.equal(isRunning(pid), false);
    assert.deepEqual(groupMembers(pid), []);
    assert.equal(recordOf(stateDir, "polite"), undefined);
    assert.match(readFileSync(join(stateDir, "services", "polite", "stdout.log"), "utf8"), /got-term/);
  });

  void test("service applier — one that ignores SIGTERM is killed with its group after the grace", async () => {
    const { stateDir, applier } = freshCase();
    const item = service("stubborn", ["/bin/sh", "-c", 'trap "" TERM; sleep 1000'], { stop_grace_ms: 300 });
    const pid = pidOf((await applier.apply([item]))[0]);
    await eventually("sleep started under sh", () => (groupMembers(pid).length >= 2 ? true : undefined));
    const stoppingAt = Date.now();
    assert.deepEqual(await applier.apply([]), []);
    assert.ok(Date.now() - stoppingAt >= 300, "stopped before the grace was over: SIGTERM was not ignored");
    assert.equal(isRunning(pid), false);
    assert.deepEqual(groupMembers(pid), []);
    assert.equal(recordOf(stateDir, "stubborn"), undefined);
  });

  void test("service applier — a child that ignores SIGTERM is killed once the grace is over, though its leader ended at once", async () => {
    const { stateDir, applier } = freshCase();
    // The shell ends at SIGTERM; the sleep it started ignores it (an ignored signal stays ignored across exec).
    const item = service("leaves-child", ["/bin/sh", "-c", '(trap "" TERM; exec sleep 1000) & wait'], {
      stop_grace_ms: 300,
    });
    const pid = pidOf((await applier.apply([item]))[0]);
    await eventually("sleep started under sh", () => (groupMembers(pid).length >= 2 ? true : undefined));
    const child = groupMembers(pid).find((member) => member !== pid);
    assert.ok(child !== undefined);
    const stoppingAt = Date.now();
    assert.deepEqual(await applier.apply([]), []);
    assert.ok(
      Date.now() - stoppingAt >= 300,
      "stopped before the grace was over: the child was not waited for",
    );
    assert.equal(isRunning(pid), false);
    assert.equal(isRunning(child), false, "the child outlived the service");
    assert.deepEqual(groupMembers(pid), []);
    assert.equal(recordOf(stateDir, "leaves-child"), undefined);
  });

  void test("service applier — what an ended run left of its group is stopped before the service starts again", async () => {
    const { stateDir, applier } = freshCase();
    const children = join(stateDir, "children");
    // Each run starts a child that ignores SIGTERM, then fails: the child outlives it unless it is stopped.
    const item = service("crashes", leavingChild(children, "sleep 0.2; exit 3"), { stop_grace_ms: 300 });
    const pid = pidOf((await applier.apply([item]))[0]);
    const restarted = await restartedFrom(stateDir, "crashes", pid);
    const [first = 0] = pidsIn(children);
    assert.ok(first > 0, "the first run's child was started");
    assert.equal(isRunning(first), false, "the first run's child outlived it into the next run");
    assert.deepEqual(groupMembers(pid), []);
    await applier.apply([]);
    assert.deepEqual(groupMembers(restarted.pid), [], "nor does the last one's outlive the service");
  });

  for (const ending of ["removed", "let go of"] as const) {
    void test(`service applier — a service ${ending} while what its last run left is being stopped is not started again`, async () => {
      const { stateDir, applier } = freshCase({ backoffInitialMs: 50 });
      const runs = join(stateDir, "runs");
      const children = join(stateDir, "children");
      // Each run says it started, starts a child that ignores SIGTERM and fails: its restart comes due (50 ms) while
      // the child is waited for (3 s), and then the service is removed, or the agent closes.
      const item = service("ends-mid", leavingChild(children, "sleep 0.1; exit 3", `echo $$ >> ${runs}`), {
        restart: "always",
        stop_grace_ms: 3_000,
      });
      pidOf((await applier.apply([item]))[0]);
      await eventually("the first run ended", () =>
        recordOf(stateDir, "ends-mid")?.ended !== undefined ? true : undefined,
      );
      // Past its restart's pause, within the child's grace (a slow machine can only make this test pass late).
      await new Promise((resolve) => setTimeout(resolve, 400));
      const startedBefore = pidsIn(runs);
      if (ending === "removed") {
        assert.deepEqual(await applier.apply([]), []);
        assert.equal(recordOf(stateDir, "ends-mid"), undefined);
        assert.deepEqual(pidsIn(runs), startedBefore, "started again while it was being removed");
        for (const child of pidsIn(children))
          assert.equal(isRunning(child), false, `child ${child} outlived the service`);
      } else {
        await applier.close();
      }
      // Nor later: the restart that was due is gone with it.
      await new Promise((resolve) => setTimeout(resolve, 4_000));
      assert.deepEqual(pidsIn(runs), startedBefore, `started again after it was ${ending}`);
    });
  }

  void test("service applier — what a run left of its group while no agent watched is stopped before the next agent starts it", async () => {
    const { stateDir, applier: first } = freshCase();
    const children = join(stateDir, "children");
    const stop = join(stateDir, "stop");
    // The first run's child ignores SIGTERM; the run itself fails once told to, with no agent watching then.
    const item = service(
      "unwatched",
      leavingChild(children, `while [ ! -e ${stop} ]; do sleep 0.05; done; exit 3`),
      { stop_grace_ms: 300 },
    );
    const pid = pidOf((await first.apply([item]))[0]);
    await eventually("the child started", () => (existsSync(children) ? true : undefined));
    const [child = 0] = pidsIn(children);
    await first.close();
    writeFileSync(stop, "");
    await eventually("the run ended", () => (isRunning(pid) ? undefined : true));
    assert.ok(isRunning(child), "the child is left behind");

    const second = applierOver(stateDir);
    const [result] = await second.apply([item]);
    assert.notEqual(pidOf(result), pid);
    assert.equal(isRunning(child), false, "the child left behind outlived its run into the next");
    assert.deepEqual(groupMembers(pid), []);
    await second.apply([]);
  });

  void test("service applier — a new applier adopts the running process, and restarts it when it dies", async () => {
    const { stateDir, applier: first } = freshCase();
    const item = sleeper("adopted");
    const pid = pidOf((await first.apply([item]))[0]);
    await first.close();
    assert.ok(isRunning(pid), "close() stopped the service");

    const second = applierOver(stateDir);
    assert.deepEqual(await second.verify([item]), []);
    const [result] = await second.apply([item]);
    assert.equal(pidOf(result), pid);
    assert.match(result?.detail ?? "", /\(adopted\)/);

    kill(pid, "SIGKILL");
    const restarted = await restartedFrom(stateDir, "adopted", pid);
    assert.ok(isRunning(restarted.pid));
    const [after] = await second.apply([item]);
    assert.equal(pidOf(after), restarted.pid);
    assert.match(after?.detail ?? "", /1 restart$/);
  });

  void test("service applier — output goes to log files under the state dir, rotated", async () => {
    const { stateDir, applier } = freshCase({ logMaxBytes: 1_024, logKeep: 3 });
    const item = service("chatty", [
      "/bin/sh",
      "-c",
      'while :; do echo "a line of output to fill the log file"; echo "and one to stderr" >&2; sleep 0.01; done',
    ]);
    pidOf((await applier.apply([item]))[0]);
    const dir = join(stateDir, "services", "chatty");
    await eventually("three rotated stdout files", () =>
      existsSync(join(dir, "stdout.log.3")) ? true : undefined,
    );
    await eventually("a rotated stderr file", () =>
      existsSync(join(dir, "stderr.log.1")) ? true : undefined,
    );
    const files = readdirSync(dir).sort();
    assert.deepEqual(
      files.filter((name) => name.startsWith("stdout")),
      ["stdout.log", "stdout.log.1", "stdout.log.2", "stdout.log.3"],
    );
    assert.ok(statSync(join(dir, "stdout.log.1")).size >= 1_024);
    assert.match(readFileSync(join(dir, "stdout.log.1"), "utf8"), /a line of output to fill the log file/);
  });

  void test("service applier — a program that does not exist or cannot run fails the item", async () => {
    const { stateDir, applier } = freshCase();
    const notExecutable = join(stateDir, "not-executable");
    writeFileSync(notExecutable, "#!/bin/sh\n");
    chmodSync(notExecutable, 0o644);
    const missing = service("missing", ["/nonexistent/program", "--flag"]);
    const plain = service("plain", [notExecutable]);
    const results = await applier.apply([missing, plain]);
    assert.deepEqual(results, [
      { id: "service:missing", state: "failed", reason: "program /nonexistent/program does not exist" },
      {
        id: "service:plain",
        state: "failed",
        reason: `program ${notExecutable} is not executable (mode 0644)`,
      },
    ]);
    assert.deepEqual(await applier.verify([missing]), [
      { id: "service:missing", what: "not running: program /nonexistent/program does not exist" },
    ]);
    assert.equal(recordOf(stateDir, "missing"), undefined);
  });

  void test("service applier — runs as the declared user, and refuses one it cannot be", async () => {
    const { applier } = freshCase();
    const unknown = service("unknown-user", ["/bin/sleep", "1000"], { user: "no-such-user" });
    if (process.getuid?.() === 0) {
      const pid = pidOf((await applier.apply([sleeper("as-nobody", { user: "nobody" })]))[0]);
      const status = readFileSync(`/proc/${pid}/status`, "utf8");
      assert.match(status, /^Uid:\s+65534\s/m);
      const [refused] = await applier.apply([unknown]);
      assert.deepEqual(refused, {
        id: "service:unknown-user",
        state: "failed",
        reason: "no user named no-such-user in /etc/passwd",
      });
    } else {
      const [refused] = await applier.apply([sleeper("as-root", { user: 0 })]);
      assert.equal(refused?.state, "failed");
      assert.match(refused?.reason ?? "", /not root, so it cannot start a service as user 0/);
    }
  });
});
