/** Runs the built executables as a person would, and returns what they printed and their exit code. */
import { spawn } from "node:child_process";

export interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

const root = new URL("../../", import.meta.url).pathname;

export function runBin(
  bin: "mesh" | "mesh-host",
  args: readonly string[],
  env: NodeJS.ProcessEnv = {},
): Promise<Run> {
  return runScript(`${root}bin/${bin}.js`, args, { env, cwd: root });
}

/** Runs a Node script (an executable of an installed package, say) from `cwd` (default: the project root). */
export function runScript(
  script: string,
  args: readonly string[],
  options: { env?: NodeJS.ProcessEnv; cwd?: string } = {},
): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, ...args], {
      cwd: options.cwd ?? root,
      env: { ...process.env, MESH_HOME: "", ...options.env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}

export const mesh = (args: readonly string[], env?: NodeJS.ProcessEnv) => runBin("mesh", args, env);
export const meshHost = (args: readonly string[], env?: NodeJS.ProcessEnv) => runBin("mesh-host", args, env);

/**
 * A token issued for `node` by `cli` (a `mesh` bound to one mesh's data dir) and joined with it into `state`, as an
 * operator and then the machine would; each step must succeed. `joinArgs` go to `mesh-host join` (`--root`, say).
 */
export async function enrolNode(
  cli: (args: string[]) => Promise<Run>,
  node: string,
  state: string,
  joinArgs: readonly string[] = [],
): Promise<void> {
  const issued = await cli(["token", "issue", node, "--json"]);
  if (issued.code !== 0) throw new Error(`mesh token issue ${node} failed: ${issued.stderr}`);
  const { token } = JSON.parse(issued.stdout) as { token: string };
  const joined = await meshHost(["join", token, "--state", state, ...joinArgs]);
  if (joined.code !== 0) throw new Error(`mesh-host join ${node} failed: ${joined.stderr}`);
}
