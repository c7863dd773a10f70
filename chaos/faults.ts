/**
 * The faults, each done to a running mesh as an outage would do it. A fault returns when it is over: when the broker
 * runs again (SIGCONT), when the kill is done, when the store is reachable again, when RabbitMQ's application is
 * started again. Whatever fails, a fault leaves nothing broken behind (a stopped process is continued, a cut proxy
 * forwards, RabbitMQ's application is started).
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import type { FaultName } from "./args.js";
import type { Fleet } from "./fleet.js";
import { sleep } from "./fleet.js";
import type { CuttableProxy } from "./proxy.js";

const run = promisify(execFile);

/** Which mesh a fault is done to: what it breaks must be there. */
export const meshKinds = ["nats", "postgres", "rabbitmq"] as const;
export type MeshKind = (typeof meshKinds)[number];

export interface FaultContext {
  fleet: Fleet;
  /** The proxy between the control plane and PostgreSQL (the postgres mesh only). */
  proxy?: CuttableProxy;
  pauseMs: number;
  say: (line: string) => void;
}

/** When the fault began and ended (ms since the epoch), and what else is worth keeping. */
export interface FaultDone {
  startedAt: number;
  endedAt: number;
  notes: Record<string, unknown>;
}

export interface Fault {
  name: FaultName;
  /** What is done, for the table and the results. */
  what: string;
  mesh: MeshKind;
  /**
   * How many times the control plane may end through the fault (undefined: as it must). A store or broker that
   * comes back within the lease's lifetime pauses the control plane, it does not end it.
   */
  controlMayEnd?: number;
  inject(context: FaultContext): Promise<FaultDone>;
}

export const faults: Record<FaultName, Fault> = {
  "broker-stop": {
    name: "broker-stop",
    what: "nats-server SIGSTOP, then SIGCONT",
    mesh: "nats",
    // Paused past the lease's gate, the acting control plane ends and another takes over.
    inject: async ({ fleet, pauseMs, say }) => {
      const pid = brokerOf(fleet);
      process.kill(pid, "SIGSTOP");
      const startedAt = Date.now();
      try {
        say(`nats-server ${pid} stopped (SIGSTOP) for ${pauseMs / 1000} s`);
        await sleep(pauseMs);
      } finally {
        process.kill(pid, "SIGCONT");
      }
      return { startedAt, endedAt: Date.now(), notes: { pid } };
    },
  },
  "broker-kill": {
    name: "broker-kill",
    what: "nats-server kill -9 (mesh up starts it again)",
    mesh: "nats",
    controlMayEnd: 0,
    inject: ({ fleet, say }) => {
      const pid = brokerOf(fleet);
      process.kill(pid, "SIGKILL");
      const at = Date.now();
      say(`nats-server ${pid} killed (SIGKILL)`);
      return Promise.resolve({ startedAt: at, endedAt: at, notes: { pid } });
    },
  },
  "control-kill": {
    name: "control-kill",
    what: "control plane kill -9 (mesh up starts another)",
    mesh: "nats",
    controlMayEnd: 1,
    inject: ({ fleet, say }) => {
      const pid = fleet.controlPid();
      if (pid === undefined) throw new Error("mesh up runs no control plane (serve --under-up) to kill");
      process.kill(pid, "SIGKILL");
      const at = Date.now();
      say(`control plane ${pid} killed (SIGKILL)`);
      return Promise.resolve({ startedAt: at, endedAt: at, notes: { pid } });
    },
  },
  "store-cut": {
    name: "store-cut",
    what: "PostgreSQL unreachable (connections cut, new ones refused)",
    mesh: "postgres",
    controlMayEnd: 0,
    inject: async ({ proxy, pauseMs, say }) => {
      if (proxy === undefined) throw new Error("store-cut needs the proxy in front of PostgreSQL");
      const refusedBefore = proxy.refused;
      proxy.cutOff();
      const startedAt = Date.now();
      try {
        say(`PostgreSQL cut off from the control plane for ${pauseMs / 1000} s`);
        await sleep(pauseMs);
      } finally {
        proxy.restore();
      }
      return {
        startedAt,
        endedAt: Date.now(),
        notes: { connections_refused: proxy.refused - refusedBefore },
      };
    },
  },
  "rabbitmq-stop": {
    name: "rabbitmq-stop",
    what: "rabbitmqctl stop_app, then start_app",
    mesh: "rabbitmq",
    controlMayEnd: 0,
    inject: async ({ pauseMs, say }) => {
      const startedAt = Date.now();
      let startMs: number;
      let endedAt: number;
      try {
        await rabbitmqctl("stop_app");
        say(`RabbitMQ's application stopped (took ${((Date.now() - startedAt) / 1000).toFixed(1)} s)`);
        await sleep(Math.max(0, startedAt + pauseMs - Date.now()));
      } finally {
        endedAt = Date.now();
        await rabbitmqctl("start_app");
        startMs = Date.now() - endedAt;
      }
      say(`RabbitMQ's application started again (took ${(startMs / 1000).toFixed(1)} s)`);
      return { startedAt, endedAt, notes: { start_app_ms: startMs } };
    },
  },
};

function brokerOf(fleet: Fleet): number {
  const pid = fleet.brokerPid();
  if (pid === undefined) throw new Error("mesh up runs no nats-server to break");
  return pid;
}

/** The machine's RabbitMQ, told as root; a minute is far more than its application takes to stop or start. */
export async function rabbitmqctl(command: "stop_app" | "start_app"): Promise<void> {
  await run("rabbitmqctl", [command], { timeout: 120_000 });
}
