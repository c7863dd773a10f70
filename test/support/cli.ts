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
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [`${root}bin/${bin}.js`, ...args], {
      cwd: root,
      env: { ...process.env, MESH_HOME: "", ...env },
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
