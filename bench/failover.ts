/**
 * Failover: the time from killing the lease holder (kill -9) to the next controller acting, and from the killed
 * holder's lease expiring to the next controller acting, over several trials, with two `mesh serve` processes on one
 * operator-mode nats-server and one store. One part of `npm run bench` (`--only failover` runs it alone, with 10
 * trials on the production lease timings).
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { leaseBucket } from "../src/bus/nats/lease-kv.js";
import { parseHolderRecord } from "../src/link/index.js";
import { connectAsControl, startBenchBroker } from "./broker.js";
import { interrupted, once, stopWhenInterrupted } from "./interrupt.js";

export interface FailoverSettings {
  trials: number;
  ttl: string;
  renew: string;
  margin: string;
  log: (line: string) => void;
}

/** Each trial's two figures, in ms: kill -9 → next acting, and the killed holder's lease expiry → next acting. */
export interface FailoverTimes {
  killToActMs: number[];
  expiryToActMs: number[];
  /** The killed holder's lease life left at the kill: no standby may act sooner. */
  killToExpiryMs: number[];
  /** The broker's name and version, for the results. */
  broker: string;
}

export async function runFailover(values: FailoverSettings): Promise<FailoverTimes> {
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
    /** When it began to act: when this process read its `control.serving` line, and the time the line says. */
    serving: Promise<{ seenAt: number; saidAt: number }>;
    kill(signal: NodeJS.Signals): void;
    exited: Promise<unknown>;
  }

  /** Every controller started, for an interrupt to stop those still running. */
  const controllers = new Set<Controller>();

  function startController(url: string): Controller {
    // The interrupt's stop has gone through the controllers already: none is started after it.
    if (interrupted() !== undefined) throw new Error("failover: interrupted");
    const child = spawn(process.execPath, [`${root}bin/mesh.js`, "--data", data, "serve", "--broker", url], {
      env,
      stdio: ["ignore", "ignore", "pipe"],
    });
    let err = "";
    const serving = new Promise<{ seenAt: number; saidAt: number }>((resolve) => {
      child.stderr.on("data", (chunk: Buffer) => {
        err += chunk.toString("utf8");
        // Whole lines only: a chunk may end inside one.
        const line = err
          .split("\n")
          .slice(0, -1)
          .find((text) => text.includes('"event":"control.serving"'));
        if (line !== undefined)
          resolve({ seenAt: Date.now(), saidAt: Date.parse((JSON.parse(line) as { at: string }).at) });
      });
    });
    const controller: Controller = {
      pid: child.pid ?? 0,
      serving,
      kill: (signal) => child.kill(signal),
      exited: new Promise((resolve) => child.once("exit", resolve)),
    };
    controllers.add(controller);
    void controller.exited.then(() => controllers.delete(controller));
    return controller;
  }

  const server = await startBenchBroker("nats", data, dir);
  const stopServer = once(() => server.stop());
  const unname = stopWhenInterrupted(async () => {
    for (const controller of controllers) {
      controller.kill("SIGTERM");
      await controller.exited;
    }
    await stopServer();
    rmSync(dir, { recursive: true, force: true });
  });
  const times: FailoverTimes = {
    killToActMs: [],
    expiryToActMs: [],
    killToExpiryMs: [],
    broker: server.version,
  };
  let nc: NatsConnection | undefined;
  try {
    let holder = startController(server.url);
    await holder.serving;
    nc = await connectAsControl(data, server.url);
    const lease = await new Kvm(nc).open(leaseBucket);
    for (let trial = 1; trial <= trials; trial++) {
      const standby = startController(server.url);
      // Let the standby settle into waiting before the holder dies.
      await new Promise((resolve) => setTimeout(resolve, 1000));
      const killedAt = Date.now();
      holder.kill("SIGKILL");
      await holder.exited;
      // The killed holder's last renewal, read before the standby can take it (that waits for this expiry).
      const entry = await lease.get("holder");
      const left = entry?.operation === "PUT" ? parseHolderRecord(entry.string(), leaseBucket) : undefined;
      if (entry === null || left?.pid !== holder.pid || left.ttl_ms === undefined) {
        throw new Error(
          `failover trial ${trial}: the lease is not the killed holder's (${entry?.string() ?? "none"})`,
        );
      }
      const expiredAt = entry.created.getTime() + left.ttl_ms;
      const acted = await standby.serving;
      times.killToActMs.push(acted.seenAt - killedAt);
      // By the times the broker and the new holder wrote (one machine, one clock), not when this process heard.
      times.expiryToActMs.push(acted.saidAt - expiredAt);
      times.killToExpiryMs.push(expiredAt - killedAt);
      values.log(
        `failover trial ${trial}: kill → acting ${acted.seenAt - killedAt} ms, expiry → acting ${acted.saidAt - expiredAt} ms`,
      );
      holder = standby;
    }
    holder.kill("SIGTERM");
    await holder.exited;
  } finally {
    await nc?.close();
    await stopServer();
    unname();
    rmSync(dir, { recursive: true, force: true });
  }

  return times;
}
