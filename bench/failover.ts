/**
 * Failover: the time from killing the lease holder (kill -9) to the next controller acting, over several trials,
 * with two `mesh serve` processes on one operator-mode nats-server and one store. One part of `npm run bench`
 * (`--only failover` runs it alone, with 10 trials on the production lease timings).
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startBenchBroker } from "./broker.js";

export interface FailoverSettings {
  trials: number;
  ttl: string;
  renew: string;
  margin: string;
  log: (line: string) => void;
}

export async function runFailover(values: FailoverSettings): Promise<number[]> {
  const trials = values.trials;
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

  const server = await startBenchBroker("nats", data, dir);
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
      values.log(`failover trial ${trial}: ${actedAt - killedAt} ms`);
      holder = standby;
    }
    holder.kill("SIGTERM");
    await holder.exited;
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }

  return times;
}
