/** `mesh-host join | run | status`. */
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import type { Command } from "commander";
import { parseDuration } from "../config/duration.js";
import { exitCodes, MeshError, UsageError } from "../errors.js";
import { createLogger, errorText } from "../log.js";
import { stdoutOutput } from "../program/output.js";
import { stopSignal } from "../program/stop-signal.js";
import { Agent } from "./agent.js";
import { join } from "./join.js";
import { parseLabel } from "./profile.js";
import { HostState, resolveStateDir } from "./state.js";

export function registerHostCommands(program: Command): void {
  program
    .command("join")
    .description("join a mesh with a one-time token: makes this node's keys and keeps its identity")
    .argument("[token]", "the token from `mesh token issue` (or --token-file, or MESH_TOKEN)")
    .option("--token-file <file>", "read the token from a file")
    .option("--state <dir>", "the agent's state dir (default: $MESH_HOST_STATE, /var/lib/mesh-host as root)")
    .option("--root <dir>", "where `mesh-host run` writes declared files (default /); kept for later runs")
    .option("--label <key=value>", "a label for this node's profile (repeatable)", collect, [])
    .option(
      "--timeout <duration>",
      "how long to wait for the control plane's answer (asking again meanwhile while none answers or it is busy)",
      "15s",
    )
    .option("--json", 'print {"node","broker"}')
    .action(async (tokenArg: string | undefined, flags: JoinFlags) => {
      const token = tokenFrom(tokenArg, flags.tokenFile);
      const labels = Object.fromEntries(flags.label.map(parseLabel).map(({ key, value }) => [key, value]));
      const stateDir = resolveStateDir(flags.state);
      const identity = await join({
        token,
        stateDir,
        labels,
        timeoutMs: parseDuration(flags.timeout, "--timeout"),
        askingAgain: (why, pauseMs) =>
          process.stderr.write(`mesh-host: ${why}; asking again in ${(pauseMs / 1000).toFixed(1)} s\n`),
      });
      if (flags.root !== undefined) new HostState(stateDir).saveSecret(rootFile, resolve(flags.root));
      const out = stdoutOutput(flags.json === true);
      if (out.json) out.document({ node: identity.node, broker: identity.broker.url });
      else out.line(identity.node);
    });

  program
    .command("run")
    .description("stay connected: apply declarations, report, say alive")
    .option("--state <dir>", "the agent's state dir")
    .option("--root <dir>", "where declared files are written (default: as given to join, else /)")
    .option("--alive-every <duration>", "how often to say alive", "15s")
    .option(
      "--verify-every <duration>",
      "how often to check what the node holds against its declaration and put back what drifted",
      "5m",
    )
    .action(async (flags: { state?: string; root?: string; aliveEvery: string; verifyEvery: string }) => {
      const aliveEveryMs = parseDuration(flags.aliveEvery, "--alive-every");
      const verifyEveryMs = parseDuration(flags.verifyEvery, "--verify-every");
      const log = createLogger({});
      const stateDir = resolveStateDir(flags.state);
      const root = runRoot(new HostState(stateDir), flags.root);
      // A root of the operator's choosing may not exist yet. One that exists but is unusable is reported with
      // each declaration instead, where the control plane sees it.
      if (!existsSync(root)) mkdirSync(root, { recursive: true });
      const agent = new Agent({ stateDir, root, aliveEveryMs, verifyEveryMs, log });
      // The declaration being applied is finished first; a signal that comes again meanwhile does not cut it short.
      void stopSignal()
        .then((signal) => {
          log.info("agent.stopping", { signal });
          return agent.stop();
        })
        .catch((error: unknown) => {
          // A stop that failed may leave the connection open, and with it the run: the agent ends here instead, as
          // it did when the failure went unhandled, and says why.
          log.error("agent.stop_failed", { error: errorText(error) });
          process.exit(exitCodes.failure);
        });
      await agent.run();
    });

  program
    .command("status")
    .description("whether this machine joined, as which node, and what it last applied")
    .option("--state <dir>", "the agent's state dir")
    .option("--json", 'print {"joined","node","broker","fingerprint","applied"}')
    .action((flags: { state?: string; json?: boolean }) => {
      const state = new HostState(resolveStateDir(flags.state));
      const identity = state.loadIdentity();
      const applied = state.lastApplied() ?? null;
      const shown = {
        joined: identity !== undefined,
        node: identity?.node ?? null,
        broker: identity?.broker.url ?? null,
        fingerprint: identity?.fingerprint ?? null,
        applied,
      };
      const out = stdoutOutput(flags.json === true);
      if (out.json) {
        out.document(shown);
        return;
      }
      if (identity === undefined) {
        out.line(`not joined (state dir ${state.dir})`);
        return;
      }
      out.line(`node         ${identity.node}`);
      out.line(`broker       ${identity.broker.url}`);
      out.line(`control key  ${identity.fingerprint}`);
      out.line(
        `applied      ${applied === null ? "nothing yet" : `sequence ${applied.sequence}, epoch ${applied.epoch}`}`,
      );
    });
}

/**
 * `mesh-host broker set URL`: where this node dials its broker, for when the operator moved the broker
 * (`mesh up --move-broker`). Only the address changes: the node's identity and keys stay, and the URL must be of
 * the same kind (nats:// or amqp://) as the one the node joined through.
 */
export function registerBrokerCommand(program: Command): void {
  program
    .command("broker")
    .description("where this node reaches its broker")
    .command("set")
    .description("point this node at its broker's new address (restart mesh-host run afterwards)")
    .argument("<url>", "the broker's new address: nats://host:port or amqp://host:port/vhost")
    .option("--state <dir>", "the agent's state dir")
    .action((url: string, flags: { state?: string }) => {
      const state = new HostState(resolveStateDir(flags.state));
      const identity = state.loadIdentity();
      if (identity === undefined) {
        throw new MeshError("not_joined", `this machine has not joined a mesh (no identity in ${state.dir})`);
      }
      const scheme = (text: string) => /^([a-z]+):\/\//.exec(text)?.[1];
      let parsed: URL;
      try {
        parsed = new URL(url);
      } catch (error) {
        throw new UsageError(`"${url}" is not a URL`, { cause: error });
      }
      if (scheme(url) !== scheme(identity.broker.url) || parsed.hostname === "") {
        throw new UsageError(
          `"${url}" is not a ${scheme(identity.broker.url) ?? "broker"}:// address with a host, as this node's broker is`,
        );
      }
      state.saveIdentity({ ...identity, broker: { ...identity.broker, url } });
      process.stdout.write(`${identity.node} now reaches its broker at ${url}; restart mesh-host run\n`);
    });
}

/** Where the root given to `join` is kept for `run`. */
const rootFile = "root";

/** Where `run` writes declared files: as given now, else as given to `join`, else /. */
export function runRoot(state: HostState, flag: string | undefined): string {
  return flag ?? state.loadSecret(rootFile) ?? "/";
}

interface JoinFlags {
  root?: string;
  tokenFile?: string;
  state?: string;
  label: string[];
  timeout: string;
  json?: boolean;
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** The token from the argument, a file, or MESH_TOKEN — the last two keep it out of shell history. */
function tokenFrom(argument: string | undefined, file: string | undefined): string {
  if (argument !== undefined && file !== undefined)
    throw new UsageError("give the token as an argument or --token-file, not both");
  if (argument !== undefined) return argument;
  if (file !== undefined) {
    try {
      return readFileSync(file, "utf8").trim();
    } catch (error) {
      throw new UsageError(`cannot read ${file}: ${(error as Error).message}`, { cause: error });
    }
  }
  const fromEnv = process.env.MESH_TOKEN;
  if (fromEnv !== undefined && fromEnv !== "") return fromEnv.trim();
  throw new UsageError("no token: give it as an argument, with --token-file, or in MESH_TOKEN");
}
