/** Long-running mesh processes for end-to-end tests: `mesh up` and `mesh-host run`, stopped as a person would. */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";

const root = new URL("../../", import.meta.url).pathname;

export interface Running {
  child: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** Sends SIGINT (or the given signal) and waits for the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
  exited: Promise<number | null>;
}

export function startBin(
  bin: "mesh" | "mesh-host",
  args: readonly string[],
  env: NodeJS.ProcessEnv = {},
  { ownProcessGroup = false }: { ownProcessGroup?: boolean } = {},
): Running {
  return startScript(`${root}bin/${bin}.js`, args, { env, cwd: root, ownProcessGroup });
}

/**
 * Starts a Node script (an executable of an installed package, say) from `cwd` (default: the project root), with
 * this process's environment less MESH_HOME, plus `env`.
 */
export function startScript(script: string, args: readonly string[], options: StartOptions = {}): Running {
  return startCommand(process.execPath, [script, ...args], options);
}

export interface StartOptions {
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Lead a process group of its own, as a command run from a terminal does (signalled as a group: `-pid`). */
  ownProcessGroup?: boolean;
}

/** Starts any command (`ip netns exec …`, say) as a Running, with the same environment as `startScript`. */
export function startCommand(command: string, args: readonly string[], options: StartOptions = {}): Running {
  const child = spawn(command, [...args], {
    cwd: options.cwd ?? root,
    env: { ...process.env, MESH_HOME: "", ...options.env },
    stdio: ["ignore", "pipe", "pipe"],
    detached: options.ownProcessGroup ?? false,
  });
  let out = "";
  let err = "";
  child.stdout?.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
  child.stderr?.on("data", (chunk: Buffer) => (err += chunk.toString("utf8")));
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return {
    child,
    stdout: () => out,
    stderr: () => err,
    exited,
    stop: async (signal = "SIGINT") => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
}

/**
 * Waits until `check` returns a value other than undefined, or fails after the timeout with `what` (and, when
 * given, `detail()`: a process's log, say, so a failure says what the process was doing). The deadline is generous
 * (a minute by default) because it is a guard against a hang, not a measurement: tests run on busy machines.
 */
export async function eventually<T>(
  what: string,
  check: () => Promise<T | undefined> | T | undefined,
  options: number | { timeoutMs?: number; detail?: () => string } = {},
): Promise<T> {
  const { timeoutMs = 60_000, detail } = typeof options === "number" ? { timeoutMs: options } : options;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}${detail === undefined ? "" : `\n${detail()}`}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** A process's log as the mesh writes it (one JSON object a line), each line parsed. */
export function logLines<Line extends { level: string; event: string }>(text: string): Line[] {
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as Line);
}

/**
 * A file of `/proc/<pid>/`, or undefined when the process has ended: any process of the machine may end between a
 * listing of /proc and the read, and that is an answer; any other error is not.
 */
export function procFile(pid: number | string, file: string): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/${file}`, "utf8");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ESRCH") return undefined;
    throw error;
  }
}

/** Whether the process's state, from its `stat`, is a zombie's (or a dead one's, on its way out). */
export function zombieStat(stat: string): boolean {
  const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  return state === "Z" || state === "X";
}

/** The wireguard-go processes serving `iface`, by /proc (zombies left to an init that does not reap are not counted). */
export function wireguardGoPids(iface: string): number[] {
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .flatMap((entry) => {
      const cmdline = procFile(entry, "cmdline");
      const stat = procFile(entry, "stat");
      if (cmdline === undefined || stat === undefined) return [];
      const argv = cmdline.split("\0");
      const served = argv[0]?.endsWith("wireguard-go") === true && argv.includes(iface);
      return served && !zombieStat(stat) ? [Number(entry)] : [];
    });
}
