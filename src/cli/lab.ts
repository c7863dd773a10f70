/**
 * `mesh lab --nodes N`: N simulated nodes in this process against a running control plane (`mesh up` or
 * `mesh serve` on the same data dir), each joining with its own token and running the agent's own code.
 */
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { openIdentities } from "../bus/index.js";
import type { BrokerIdentities } from "../bus/index.js";
import { MeshError, UsageError } from "../errors.js";
import { Lab } from "../lab/lab.js";
import type { LabStatus } from "../lab/lab.js";
import type { LabFlags } from "../lab/options.js";
import { compileLabOptions } from "../lab/options.js";
import { spread } from "../lab/figures.js";
import type { ProfileSet } from "../lab/profiles.js";
import { parseProfileFile } from "../lab/profiles.js";
import { createLogger, errorText } from "../log.js";
import { parseDuration } from "../config/duration.js";
import type { GlobalFlags } from "./context.js";
import { optionsFrom, recordedBroker, signingIdentity, withStore } from "./context.js";
import { stdoutOutput } from "../program/output.js";
import { stopSignal } from "../program/stop-signal.js";

interface Flags extends LabFlags {
  broker?: string;
  root?: string;
  profiles?: string;
  summaryEvery: string;
}

export function registerLabCommand(program: Command): void {
  program
    .command("lab")
    .description(
      "run N simulated nodes against a running control plane (same --data), until Ctrl-C; with --profiles FILE " +
        "(YAML or JSON: [{labels, cpu, memory_mb, drivers, weight}, …]) the nodes take its profile sets in turn",
    )
    .requiredOption("--nodes <n>", "how many nodes (1 to 100000)")
    .option("--broker <url>", "the broker (default: the one `mesh up` or `mesh serve` recorded)")
    .option("--alive-every <duration>", "how often each node says alive", "15s")
    .option("--prefix <name>", "node names are <prefix>-<number>", "lab")
    .option(
      "--connections <mode>",
      "auto (own up to 500 nodes, else shared), own (one per node), shared (groups on a lab identity)",
      "auto",
    )
    .option("--group-size <n>", "nodes per shared connection", "20")
    .option("--join-concurrency <n>", "how many nodes join at once", "100")
    .option("--join-timeout <duration>", "how long a join waits for the control plane", "60s")
    .option("--root <dir>", "keep each node's state and files on disk under <dir>/<node>/ (default: memory)")
    .option(
      "--profiles <file>",
      "profile sets the nodes join with, in node order (round-robin, or by each set's weight); " +
        "what a set leaves out stays as this machine has it",
    )
    .option("--summary-every <duration>", "how often to print the summary while running", "10s")
    .option("--json", "print each summary as one JSON line")
    .action(async (flags: Flags, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const labOptions = compileLabOptions(flags);
      const summaryEveryMs = parseDuration(flags.summaryEvery, "--summary-every");
      // Read and checked before any token is issued: a bad file changes nothing in the mesh.
      const profiles = flags.profiles === undefined ? undefined : readProfiles(flags.profiles);
      const options = optionsFrom(globals);
      const out = stdoutOutput(globals.json === true);
      const say = (text: string, document: Record<string, unknown>) =>
        out.json ? out.line(JSON.stringify(document)) : out.line(text);

      const broker: BrokerIdentities | undefined =
        flags.broker !== undefined
          ? openIdentities(options.dataDir, { url: flags.broker, rabbitmqApi: options.rabbitmqApi })
          : recordedBroker(options);
      if (broker === undefined) {
        throw new MeshError(
          "no_broker",
          "no broker is recorded for this mesh: start it with `mesh up` or `mesh serve` on this --data dir, or give --broker",
        );
      }
      const lab = new Lab({
        ...labOptions,
        dataDir: options.dataDir,
        log: createLogger({ level: "warn" }),
        ...(flags.root === undefined ? {} : { root: flags.root }),
        ...(profiles === undefined ? {} : { profiles }),
      });
      say(modeLine(labOptions.nodes, labOptions.connections, labOptions.groupSize), {
        event: "lab.mode",
        nodes: labOptions.nodes,
        connections: labOptions.connections,
        group_size: labOptions.connections === "shared" ? labOptions.groupSize : 1,
      });

      const signalled = stopSignal();

      const signing = signingIdentity(options);
      const tokens = await withStore(options, (store) =>
        lab.issueTokens(store, broker, signing.fingerprint, options.tokenTtlMs),
      ).finally(() => broker.close());
      const joinedAt = performance.now();
      const joins = await lab.join(tokens);
      const seconds = (performance.now() - joinedAt) / 1000;
      const ok = joins.filter((j) => j.error === undefined);
      const failed = joins.filter((j) => j.error !== undefined);
      const times = spread(ok.map((j) => j.ms));
      say(
        `joined ${ok.length}/${joins.length} in ${seconds.toFixed(1)} s` +
          (times === undefined
            ? ""
            : ` (per join p50 ${times.p50.toFixed(0)} ms, p99 ${times.p99.toFixed(0)} ms, max ${times.max.toFixed(0)} ms)`),
        {
          event: "lab.joined",
          joined: ok.length,
          failed: failed.length,
          seconds,
          per_join_ms: times ?? null,
        },
      );
      if (!out.json) {
        for (const failure of failed.slice(0, 5)) out.line(`  ${failure.node}: ${failure.error ?? ""}`);
        if (failed.length > 5) out.line(`  … and ${failed.length - 5} more`);
      }
      if (ok.length === 0) throw new MeshError("lab_failed", "no lab node could join");

      await lab.start();
      if (labOptions.connections === "shared") {
        const connections = lab.sharedConnections();
        say(`lab: ${ok.length} nodes running on ${connections} broker connection(s)`, {
          event: "lab.connections",
          nodes: ok.length,
          connections,
        });
      }
      const summary = (status: LabStatus) => say(summaryLine(status), { event: "lab.summary", ...status });
      summary(lab.status());
      let last = "";
      const timer = setInterval(() => {
        const status = lab.status();
        const line = summaryLine(status);
        if (line !== last) summary(status);
        last = line;
      }, summaryEveryMs);
      const reason = await signalled;
      clearInterval(timer);
      await lab.stop().catch((error: unknown) => out.line(`lab: stopping: ${errorText(error)}`));
      const final = lab.status();
      say(`stopped (${reason}). ${summaryLine(final)}`, { event: "lab.stopped", reason, ...final });
    });
}

function readProfiles(file: string): ProfileSet[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    throw new UsageError(`--profiles: cannot read ${file}: ${errorText(error)}`, { cause: error });
  }
  return parseProfileFile(text, file);
}

export function modeLine(nodes: number, connections: "own" | "shared", groupSize: number): string {
  if (connections === "own")
    return `lab: ${nodes} nodes, one broker connection per node, each on its own identity`;
  const groups = Math.ceil(nodes / groupSize);
  return (
    `lab: ${nodes} nodes sharing ${groups} broker connection(s), ${groupSize} nodes each, on the writers table's ` +
    `lab identity (each may act only for its group's nodes); one connection per node is too many for one process`
  );
}

export function summaryLine(status: LabStatus): string {
  const latest =
    status.latest === null
      ? "none applied"
      : `${status.applied} applied (${status.latest.nodes} hold epoch ${status.latest.epoch} sequence ${status.latest.sequence})`;
  return (
    `lab: ${status.joined}/${status.nodes} joined, ${status.running} running, ${latest}, ` +
    `${status.reporting} reporting (no report waiting for its receipt), ${status.refused} refusal(s); ` +
    `sent ${status.alivesSent} alive(s), ${status.reportsSent} report(s)` +
    (status.stopped.length === 0
      ? ""
      : `; ${status.stopped.length} stopped: ${status.stopped[0]?.error ?? ""}`)
  );
}
