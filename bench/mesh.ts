/**
 * The mesh as the benchmarks run it: `mesh serve` as its own process (so its CPU and memory are its own, and it
 * can run under --cpu-prof), and other `mesh` commands as an operator runs them (the fleet's declaration may run
 * under --cpu-prof too).
 */
import { execFileSync, spawn } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const root = new URL("../", import.meta.url).pathname;

export function meshCli(data: string, args: readonly string[]): string {
  return execFileSync(process.execPath, [`${root}bin/mesh.js`, "--data", data, ...args], {
    env: { ...process.env, MESH_HOME: "" },
    encoding: "utf8",
  });
}

/**
 * Runs a `mesh` command in a process of its own without blocking this one (its simulated nodes keep running). What
 * it prints goes to files, read once it has exited: a pipe to this process would be read only between the simulated
 * nodes' work, and a command printing more than a pipe holds (`mesh declare --all --json` to 10,000 nodes prints half
 * a megabyte) would wait for that before it could exit, as no operator's terminal makes it wait.
 */
export async function runMesh(data: string, args: readonly string[], profileDir?: string): Promise<string> {
  return (await runMeshTimed(data, args, profileDir)).stdout;
}

/**
 * Runs a command as `runMesh` does, and says when it exited, on this process's `performance.now()` clock. The time is
 * taken by a shell waiting for the command, not by this process: this one hears of the exit only between the simulated
 * nodes' work, which at 10,000 nodes taking a declaration was a second or more after it.
 */
export async function runMeshTimed(
  data: string,
  args: readonly string[],
  profileDir?: string,
): Promise<{ stdout: string; endedAt: number }> {
  const flags = profileDir === undefined ? [] : ["--cpu-prof", "--cpu-prof-dir", profileDir];
  const outDir = mkdtempSync(join(tmpdir(), "mesh-bench-run-"));
  const outPath = join(outDir, "stdout");
  const errPath = join(outDir, "stderr");
  const endPath = join(outDir, "ended");
  const out = openSync(outPath, "w");
  const err = openSync(errPath, "w");
  let done = false;
  const read = () => {
    // Node may tell both a failure to start and an exit: the files are read and removed once.
    if (done) return { stdout: "", stderr: "", ended: "" };
    done = true;
    closeSync(out);
    closeSync(err);
    const said = {
      stdout: readFileSync(outPath, "utf8"),
      stderr: readFileSync(errPath, "utf8"),
      // Absent when the command could not start: read as empty (the file is made for it).
      ended: readFileSync(endPath, { encoding: "utf8", flag: "a+" }).trim(),
    };
    rmSync(outDir, { recursive: true, force: true });
    return said;
  };
  return new Promise((resolve, reject) => {
    // `date +%s%N`: the wall clock in nanoseconds, as the shell saw the command end.
    const waiter = '"$@"; code=$?; date +%s%N >"$0"; exit $code';
    const command = [process.execPath, ...flags, `${root}bin/mesh.js`, "--data", data, ...args];
    const child = spawn("/bin/sh", ["-c", waiter, endPath, ...command], {
      env: { ...process.env, MESH_HOME: "" },
      stdio: ["ignore", out, err],
    });
    child.once("error", (error) => {
      read();
      reject(new Error(`mesh ${args.join(" ")} could not start: ${error.message}`));
    });
    child.once("exit", (code, signal) => {
      const { stdout, stderr, ended } = read();
      if (code !== 0) {
        reject(new Error(`mesh ${args.join(" ")} failed (exit ${code ?? signal}):\n${stderr.slice(-2000)}`));
        return;
      }
      if (!/^\d+$/.test(ended)) {
        reject(
          new Error(`mesh ${args.join(" ")}: the shell did not say when it ended (it wrote "${ended}")`),
        );
        return;
      }
      const endedAt = Number(BigInt(ended) / 1000n) / 1000 - performance.timeOrigin;
      resolve({ stdout, endedAt });
    });
  });
}

export interface ServeProcess {
  pid: number;
  /** Resolves when the control plane says it is serving. */
  serving: Promise<void>;
  stop(): Promise<void>;
  stderr(): string;
  /** How serve ended and the end of what it said, or undefined while it runs. */
  ended(): string | undefined;
}

export function startServe(
  data: string,
  url: string,
  profileDir?: string,
  metricsAddress?: string,
  env: Record<string, string> = {},
): ServeProcess {
  const flags = profileDir === undefined ? [] : ["--cpu-prof", "--cpu-prof-dir", profileDir];
  const metrics = metricsAddress === undefined ? [] : ["--metrics", metricsAddress];
  const child = spawn(
    process.execPath,
    [...flags, `${root}bin/mesh.js`, "--data", data, "serve", "--broker", url, ...metrics],
    { env: { ...process.env, MESH_HOME: "", ...env }, stdio: ["ignore", "ignore", "pipe"] },
  );
  let err = "";
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const serving = new Promise<void>((resolve, reject) => {
    child.stderr.on("data", (chunk: Buffer) => {
      // Keep only the tail: a long run logs liveness crossings.
      err = (err + chunk.toString("utf8")).slice(-200_000);
      if (err.includes('"event":"control.serving"')) resolve();
    });
    void exited.then(() => reject(new Error(`mesh serve exited before serving: ${err.slice(-2000)}`)));
  });
  return {
    pid: child.pid ?? 0,
    serving,
    stderr: () => err,
    ended: () =>
      child.exitCode === null && child.signalCode === null
        ? undefined
        : `exited with ${child.exitCode ?? child.signalCode}: ${err.slice(-2000)}`,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        // A serve stopped (SIGSTOP) for a backlog takes the signal only once let go.
        child.kill("SIGCONT");
      }
      await exited;
    },
  };
}

/** CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat. */
export function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(fields[11]) + Number(fields[12]);
  return ticks / clockTicks();
}

/**
 * CPU seconds (user + system) used by the children this process has waited for: the `mesh` commands it ran, each
 * counted once it has exited.
 */
export function childrenCpuSeconds(): number {
  const stat = readFileSync("/proc/self/stat", "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[13]) + Number(fields[14])) / clockTicks();
}

/** Resident memory of a process in MiB, from /proc/<pid>/status. */
export function rssMiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const match = /VmRSS:\s+(\d+) kB/.exec(status);
  if (match === null) throw new Error(`no VmRSS for process ${pid}`);
  return Number(match[1]) / 1024;
}

let ticks: number | undefined;
function clockTicks(): number {
  ticks ??= Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
  return ticks;
}

/** CPU seconds used by each party to a fan-out round (readings are running totals; `cpuSince` takes the difference). */
export interface RoundCpu {
  /** `mesh declare --all`: the children this process ran. */
  declare: number;
  serve: number;
  /** This process: the lab's simulated fleet, and the bench's own counting. */
  fleet: number;
  broker: number | null;
}

export function roundCpu(servePid: number, brokerPid: number | undefined): RoundCpu {
  const own = process.cpuUsage();
  return {
    declare: childrenCpuSeconds(),
    serve: cpuSeconds(servePid),
    fleet: (own.user + own.system) / 1e6,
    broker: brokerPid === undefined ? null : brokerCpuSeconds(brokerPid),
  };
}

/** The broker's CPU so far, or null once its process is gone (a broker restarted is not the one measured). */
export function brokerCpuSeconds(pid: number): number | null {
  try {
    return cpuSeconds(pid);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
}

export function cpuSince(before: RoundCpu, after: RoundCpu): RoundCpu {
  return {
    declare: after.declare - before.declare,
    serve: after.serve - before.serve,
    fleet: after.fleet - before.fleet,
    broker: after.broker === null || before.broker === null ? null : after.broker - before.broker,
  };
}

export function roundCpuTotal(cpu: RoundCpu): number {
  return cpu.declare + cpu.serve + cpu.fleet + (cpu.broker ?? 0);
}

/**
 * The least a round could take were the control plane to use no CPU at all: what the simulated fleet (with the
 * bench's own counting) and the broker used in it, spread over every core. The mesh's own share of the round is what
 * its time adds to this; undefined when the broker's CPU was not measured.
 */
export function roundFloorMs(cpu: RoundCpu, cores: number): number | undefined {
  return cpu.broker === null ? undefined : ((cpu.fleet + cpu.broker) / cores) * 1000;
}

export function cpuText(cpu: RoundCpu): string {
  const total = roundCpuTotal(cpu);
  const broker = cpu.broker === null ? "broker not measured" : `broker ${cpu.broker.toFixed(1)} s`;
  return (
    `declare ${cpu.declare.toFixed(1)} s, serve ${cpu.serve.toFixed(1)} s, fleet ${cpu.fleet.toFixed(1)} s, ` +
    `${broker}; ${total.toFixed(1)} s in all`
  );
}
