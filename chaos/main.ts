/**
 * `npm run chaos`: faults done to a running mesh under a lab fleet — the broker paused and killed, the control
 * plane killed, PostgreSQL cut off, RabbitMQ's application stopped — with, for each, the time until every node is
 * here again, reports lost, false out-of-touch calls and the time a declaration made after recovery takes to
 * converge. One table, the same as JSON under chaos/results/, and a non-zero exit when any check fails.
 *
 *   npm run chaos -- [--nodes 200] [--pause 30s] [--faults broker-stop,broker-kill,control-kill,store-cut,rabbitmq-stop]
 *                    [--out-of-touch-after 10s] [--alive-every 2s] [--deadline 5m] [--short] [--keep]
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { root } from "../bench/mesh.js";
import type { ChaosOptions } from "./args.js";
import { ChaosUsageError, faultNames, parseChaosArgs } from "./args.js";
import { runChaos } from "./suite.js";
import { formatChaosTable } from "./table.js";

const say = (line: string) => process.stderr.write(`${line}\n`);

let options: ChaosOptions;
try {
  options = parseChaosArgs(process.argv.slice(2));
} catch (error) {
  if (!(error instanceof ChaosUsageError)) throw error;
  say(`chaos: ${error.message}`);
  process.exit(2);
}

const started = Date.now();
const results = await runChaos(options, say);
const git = (...args: string[]) => execFileSync("git", args, { cwd: root, encoding: "utf8" }).trim();
const document = {
  suite: "mesh chaos",
  commit: git("rev-parse", "--short", "HEAD"),
  dirty: git("status", "--porcelain", "--untracked-files=no") !== "",
  date: new Date().toISOString(),
  node: process.version,
  cores: cpus().length,
  cpu_model: cpus()[0]?.model ?? "unknown",
  nodes: options.nodes,
  short: options.short,
  out_of_touch_after_ms: options.outOfTouchAfterMs,
  alive_every_ms: options.aliveEveryMs,
  minutes: Math.round((Date.now() - started) / 6000) / 10,
  results,
};
const out = join(root, "chaos", "results");
mkdirSync(out, { recursive: true });
// One current file per configuration (fleet size, form, faults), replaced by each run of it: figures of the code as
// it is, not a history (git keeps that).
const allFaults = options.faults.length === faultNames.length;
const file = join(
  out,
  `chaos-${options.nodes}${options.short ? "-short" : ""}${allFaults ? "" : `-${options.faults.join("+")}`}.json`,
);
writeFileSync(file, `${JSON.stringify(document, null, 2)}\n`);
process.stdout.write(
  `mesh chaos, ${options.nodes} nodes, out of touch after ${options.outOfTouchAfterMs / 1000} s — commit ` +
    `${document.commit}${document.dirty ? " (with local changes)" : ""}, ${document.node}, ${document.cores} cores, ` +
    `${document.minutes} min\n\n${formatChaosTable(results)}\nresults written to ${file}\n`,
);
if (results.some((result) => result.failures.length > 0)) process.exitCode = 1;
