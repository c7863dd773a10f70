/**
 * Failover: the time from killing the lease holder (kill -9) to the next controller acting, over several trials,
 * with two `mesh serve` processes on one operator-mode nats-server and one store. Prints a table and writes the
 * figures as JSON under bench/results/.
 *
 *   node --import tsx bench/failover.ts [--trials 10] [--ttl 15s] [--renew 5s] [--margin 3s]
 */
import { spawn } from "node:child_process";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { freePort, startNatsServer } from "../src/bus/index.js";
import { writeNatsServerConfig } from "../src/bus/nats/server.js";

const { values } = parseArgs({
  options: {
    trials: { type: "string", default: "10" },
    ttl: { type: "string", default: "15s" },
    renew: { type: "string", default: "5s" },
    margin: { type: "string", default: "3s" },
  },
});
const trials = Number(values.trials);
if (!Number.isInteger(trials) || trials < 1) throw new Error(`--trials: "${values.trials}" is not a count`);
const root = new URL("../", import.meta.url).pathname;
const env = {
  ...process.env,
  MESH_HOME: "",
  MESH_LEASE_TTL: values.ttl,
  MESH_LEASE_RENEW_EVERY: values.renew,
  MESH_LEASE_MARGIN: values.margin,
};
const dir = mkdtempSync(join(tmpdir(), "mesh-bench-failover-"));
const data = join(dir, "data");

function mesh(args: string[]): string {
  return execFileSync(process.execPath, [`${root}bin/mesh.js`, "--data", data, ...args], {
    env,
    encoding: "utf8",
  });
}

interface Controller {
  pid: number;
  serving: Promise<number>;
  kill(signal: NodeJS.Signals): void;
  exited: Promise<unknown>;
}

function startController(url: string): Controller {
  const child = spawn(process.execPath, [`${root}bin/mesh.js`, "--data", data, "serve", "--broker", url], {
    env,
    stdio: ["ignore", "ignore", "pipe"],
  });
  let err = "";
  const serving = new Promise<number>((resolve) => {
    child.stderr.on("data", (chunk: Buffer) => {
      err += chunk.toString("utf8");
      if (err.includes('"event":"control.serving"')) resolve(Date.now());
    });
  });
  return {
    pid: child.pid ?? 0,
    serving,
    kill: (signal) => child.kill(signal),
    exited: new Promise((resolve) => child.once("exit", resolve)),
  };
}

const fragment = JSON.parse(mesh(["broker", "config", "--json"])) as {
  operator: string;
  system_account: string;
  resolver_preload: Record<string, string>;
};
const port = await freePort();
mkdirSync(join(dir, "nats"), { recursive: true });
const config = writeNatsServerConfig({
  dir: join(dir, "nats"),
  host: "127.0.0.1",
  port,
  operatorJwt: fragment.operator,
  systemAccount: fragment.system_account,
  accounts: fragment.resolver_preload,
});
const server = await startNatsServer(config, { host: "127.0.0.1", port }, join(dir, "nats.log"));
const times: number[] = [];
try {
  let holder = startController(server.url);
  await holder.serving;
  for (let trial = 1; trial <= trials; trial++) {
    const standby = startController(server.url);
    // Let the standby settle into waiting before the holder dies.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const killedAt = Date.now();
    holder.kill("SIGKILL");
    await holder.exited;
    const actedAt = await standby.serving;
    times.push(actedAt - killedAt);
    process.stderr.write(`trial ${trial}: ${actedAt - killedAt} ms\n`);
    holder = standby;
  }
  holder.kill("SIGTERM");
  await holder.exited;
} finally {
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
}

const sorted = [...times].sort((a, b) => a - b);
const median =
  sorted.length % 2 === 1
    ? sorted[(sorted.length - 1) / 2]!
    : (sorted[sorted.length / 2 - 1]! + sorted[sorted.length / 2]!) / 2;
const figures = {
  benchmark: "failover",
  commit: execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd: root, encoding: "utf8" }).trim(),
  date: new Date().toISOString(),
  node: process.version,
  nats_server: execFileSync("/usr/sbin/nats-server", ["--version"], { encoding: "utf8" }).trim(),
  cores: cpus().length,
  lease: { ttl: values.ttl, renew_every: values.renew, margin: values.margin },
  trials,
  median_ms: median,
  min_ms: sorted[0],
  max_ms: sorted[sorted.length - 1],
  times_ms: times,
};
const out = join(root, "bench", "results");
mkdirSync(out, { recursive: true });
writeFileSync(
  join(out, `failover-${figures.date.replace(/[:.]/g, "-")}.json`),
  `${JSON.stringify(figures, null, 2)}\n`,
);
process.stdout.write(
  `failover (kill -9 of the holder → next controller acting), ${trials} trials, lease ${values.ttl}/${values.renew}/${values.margin}\n` +
    `  median ${median} ms   min ${figures.min_ms} ms   max ${figures.max_ms} ms\n`,
);
