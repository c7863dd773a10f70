/**
 * An operator's hands on a mesh's data dir, as the attack tests use them: the built `mesh` and `mesh-host`, a node
 * joined and running with a state dir of its own, a declaration of one file, and waits on what `node show` says.
 */
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Run } from "./cli.js";
import { mesh, meshHost } from "./cli.js";
import type { Running } from "./processes.js";
import { eventually, startBin } from "./processes.js";

/** What `mesh node show --json` says, as far as these tests read it. */
export interface Shown {
  declaration: { sequence: number; epoch: number; digest: string } | null;
  account: { outcome: string; sequence: number | null; report_sequence: number | null } | null;
  refused: Record<string, number>;
}

export interface Operator {
  cli: (args: string[]) => Promise<Run>;
  show: (node: string) => Promise<Shown>;
  /** Issues a token for `node` and returns the token string. */
  issue: (node: string) => Promise<string>;
  /** Joins `node` with a state dir of its own (`<dir>/<node>`) and runs its agent; returns the state dir. */
  joinAndRun: (node: string) => Promise<string>;
  /** Declares one file, `/etc/attack-test`, with `content` to `node`. */
  declare: (node: string, content: string) => Promise<void>;
  /** Waits until `node` has reported `sequence` applied; what `node show` then says. */
  applied: (node: string, sequence: number) => Promise<Shown>;
  /** Stops every agent it started. */
  stopAgents: () => Promise<void>;
}

export function operatorOf(data: string, dir: string): Operator {
  const agents: Running[] = [];
  const cli = (args: string[]) => mesh(["--data", data, ...args]);
  const show = async (node: string): Promise<Shown> => {
    const run = await cli(["node", "show", node, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return JSON.parse(run.stdout) as Shown;
  };
  const issue = async (node: string): Promise<string> => {
    const run = await cli(["token", "issue", node, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    return (JSON.parse(run.stdout) as { token: string }).token;
  };
  return {
    cli,
    show,
    issue,
    joinAndRun: async (node) => {
      const state = join(dir, node);
      const joined = await meshHost(["join", await issue(node), "--state", state]);
      assert.equal(joined.code, 0, joined.stderr);
      const root = join(dir, `${node}-root`);
      mkdirSync(root, { recursive: true });
      agents.push(startBin("mesh-host", ["run", "--state", state, "--root", root, "--alive-every", "300ms"]));
      return state;
    },
    declare: async (node, content) => {
      const file = join(dir, `${node}-${content.length}.yaml`);
      writeFileSync(file, `files:\n  - path: /etc/attack-test\n    content: ${JSON.stringify(content)}\n`);
      const run = await cli(["declare", node, "-f", file]);
      assert.equal(run.code, 0, run.stderr);
    },
    applied: (node, sequence) =>
      eventually(
        `${node}'s report of sequence ${sequence}`,
        async () => {
          const shown = await show(node);
          return shown.account?.outcome === "applied" && shown.account.sequence === sequence
            ? shown
            : undefined;
        },
        60_000,
      ),
    stopAgents: async () => {
      for (const agent of agents) await agent.stop("SIGTERM");
    },
  };
}
