/**
 * `mesh up`: everything local on the embedded defaults — the mesh's own nats-server (operator mode, JetStream in
 * the data dir, 127.0.0.1) and the control plane (`mesh serve --under-up`), each a child process started again
 * when it ends; with `--broker`, the control plane alone on a broker that runs already (RabbitMQ, say). `mesh serve`: the control plane alone, against a
 * broker that already runs (`mesh broker config` prints what a nats-server needs).
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { spawn } from "node:child_process";
import { Option } from "commander";
import type { Command } from "commander";
import type { BrokerAccess, EmbeddedServer, RunningNatsServer } from "../bus/index.js";
import {
  brokerKindOf,
  freePort,
  openNatsIdentities,
  parseAmqpUrl,
  portIsFree,
  rabbitmqApiOf,
  startNatsServer,
  whoListens,
} from "../bus/index.js";
import { brokerConfigFragment } from "../bus/index.js";
import type { BrokerRecord } from "../control/broker-record.js";
import { readBrokerRecord, writeBrokerRecord } from "../control/broker-record.js";
import { currentRevocations } from "../control/revocations.js";
import { serve } from "../control/serve.js";
import type { Supervised } from "../control/supervise.js";
import { Supervisor } from "../control/supervise.js";
import type { MeshOptions } from "../config/options.js";
import { recordRunningSettings } from "../config/options.js";
import { MeshError, UsageError } from "../errors.js";
import type { Logger } from "../log.js";
import { createLogger, errorText } from "../log.js";
import { stopSignal } from "../program/stop-signal.js";
import type { GlobalFlags } from "./context.js";
import { optionsFrom, recordedAccess, withStore } from "./context.js";

const host = "127.0.0.1";
/** How long a stopping control plane waits for its own stop, and then for what it left open, before it ends. */
const stopWithinMs = 15_000;
const endWithinMs = 2000;
const defaultNatsPort = 4222;
const metricsFlag = "--metrics <host:port>";
const rabbitmqApiFlag = "--rabbitmq-api <url>";
const rabbitmqApiHelp =
  "RabbitMQ's management API, http://user:pass@host:15672 (default: the broker URL's credentials on port 15672)";
const metricsHelp =
  "serve Prometheus metrics at http://HOST:PORT/metrics (or off; default off, MESH_METRICS)";

/**
 * Records the broker every later command reaches (checked first: bad usage writes nothing), with the settings the
 * control plane runs with.
 */
function recordBroker(options: MeshOptions, url: string): BrokerAccess {
  const broker = { url, rabbitmqApi: options.rabbitmqApi };
  if (brokerKindOf(url) === "amqp") rabbitmqApiOf(broker);
  mkdirSync(options.dataDir, { recursive: true, mode: 0o700 });
  recordRunningSettings(options);
  const recorded = readBrokerRecord(options.dataDir);
  if (recorded?.url !== url || recorded.rabbitmq_api !== options.rabbitmqApi) {
    writeBrokerRecord(options.dataDir, {
      url,
      ...(options.rabbitmqApi === undefined ? {} : { rabbitmq_api: options.rabbitmqApi }),
    });
  }
  return broker;
}

function announcement(options: MeshOptions, url: string, embeddedDir?: string): string {
  const broker =
    embeddedDir === undefined
      ? brokerKindOf(url) === "amqp"
        ? `${parseAmqpUrl(url).url} (RabbitMQ)`
        : url
      : `${url} (nats-server, data in ${embeddedDir})`;
  return (
    `The mesh is up.\n  broker  ${broker}\n  data    ${options.dataDir}\n\n` +
    `Let a machine in:  npx mesh token issue <node-name>\n`
  );
}

/**
 * `mesh serve`: the control plane in this process until a signal (exit 0), or until it ends by itself (a lost
 * lease, a closed gate, a failure: exit 1, for whoever runs it to start it again). As the child of `mesh up` it
 * serves on the recorded broker, tells its parent when it acts, and stops when its parent is gone.
 */
async function serveHere(options: MeshOptions, broker: BrokerAccess, child: boolean): Promise<void> {
  const log = createLogger({});
  const plane = await serve({ options, broker, log });
  void plane.serving.then(() => {
    if (child) process.send?.({ kind: "serving" });
    else if (brokerKindOf(broker.url) === "amqp") process.stdout.write(announcement(options, broker.url));
  });
  const orphaned = new Promise<string>((resolve) => {
    if (child) process.once("disconnect", () => resolve("mesh up is gone"));
  });
  const reason = await Promise.race([
    stopSignal(),
    orphaned,
    plane.done.then(
      () => "control queue closed",
      (error: unknown) => `control plane failed: ${errorText(error)}`,
    ),
  ]);
  log.info("mesh.stopping", { reason });
  // A broker that does not answer (paused) may hold the stop, and a socket it never closes the process: neither may
  // keep a control plane that stopped acting from ending, for whoever restarts it. The exit code is set by then.
  const stopped = await Promise.race([
    plane.stop().then(() => true),
    new Promise<false>((resolve) => setTimeout(() => resolve(false), stopWithinMs).unref()),
  ]);
  if (!stopped) log.warn("control.stop_slow", { within_ms: stopWithinMs, note: "ending without waiting" });
  setTimeout(() => process.exit(), endWithinMs).unref();
  // The open channel to `mesh up` (listened on for its going) keeps this process alive: closed, the process ends
  // once the control plane has, and `mesh up` starts another.
  if (child && process.connected) process.disconnect();
  // Under `mesh up` only the control plane ends (the broker and the supervisor go on); alone, it is the mesh.
  const what = child ? "the control plane stopped (mesh up starts another)" : "the mesh stopped";
  if (!reason.startsWith("SIG")) throw new MeshError("stopped", `${what}: ${reason}`);
}

/** The flags a `mesh serve` child of `mesh up` is started with: the global ones as given, and its own. */
function childArguments(globals: GlobalFlags & { metrics?: string; rabbitmqApi?: string }): string[] {
  const given: Array<[string, string | undefined]> = [
    ["--data", globals.data],
    ["--store", globals.store],
    ["--out-of-touch-after", globals.outOfTouchAfter],
  ];
  const own: Array<[string, string | undefined]> = [
    ["--metrics", globals.metrics],
    ["--rabbitmq-api", globals.rabbitmqApi],
  ];
  const flags = (pairs: Array<[string, string | undefined]>) =>
    pairs.flatMap(([flag, value]) => (value === undefined ? [] : [flag, value]));
  return [...flags(given), "serve", "--under-up", ...flags(own)];
}

/**
 * The control plane as a child process of `mesh up`, so that anything that ends it — a lost lease, a closed gate,
 * a crash, a kill — ends only it. The child's output is this process's; it says over IPC when it acts.
 */
function controlPlaneChild(args: readonly string[], onServing: () => void): Supervised {
  const script = process.argv[1];
  if (script === undefined) throw new MeshError("internal", "the mesh's own script is not known");
  // Out of reach of the terminal's signals, like the broker: `mesh up` alone is told to stop, and stops the
  // control plane first (it gives the lease back through the broker), the broker after.
  const child = spawn(process.execPath, [...process.execArgv, script, ...args], {
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    detached: true,
  });
  child.on("message", (message: unknown) => {
    if (typeof message === "object" && message !== null && (message as { kind?: unknown }).kind === "serving")
      onServing();
  });
  const exited = new Promise<string>((resolve) =>
    child.once("exit", (code, signal) =>
      resolve(`the control plane exited (${signal === null ? `code ${code}` : `killed by ${signal}`})`),
    ),
  );
  const failed = new Promise<string>((resolve) =>
    child.once("error", (error) => resolve(`the control plane could not start: ${errorText(error)}`)),
  );
  return {
    ended: Promise.race([exited, failed]),
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      // A control plane that does not end (its broker paused, say) is ended: it no longer acts either way.
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** Supervises the control plane as a child until `stopping`; says the mesh is up the first time one acts. */
async function superviseControlPlane(
  log: Logger,
  args: readonly string[],
  announce: string,
  stopping: Promise<string>,
  broker?: Supervisor,
): Promise<void> {
  let announced = false;
  const onServing = () => {
    if (announced) return;
    announced = true;
    process.stdout.write(announce);
  };
  const control = new Supervisor({
    name: "control",
    log,
    // The child ends itself within its own stop; this is only the bound after which it is killed.
    stopWithinMs: 15_000,
    start: () => Promise.resolve(controlPlaneChild(args, onServing)),
  });
  const reason = await stopping;
  log.info("mesh.stopping", { reason });
  // The control plane first: it gives the lease back through the broker.
  await control.stop();
  await broker?.stop();
}

export function registerServeCommands(program: Command): void {
  program
    .command("up")
    .description(
      "run a whole mesh locally: its own nats-server and the control plane (or the control plane on --broker)",
    )
    .option(
      "--nats-port <port>",
      "the broker's port on the first run (0: any free port; default 4222 if free); later runs keep it",
    )
    .option("--move-broker", "let --nats-port move the broker to another port (every node must then be told)")
    .option("--broker <url>", "run on this broker instead of an own nats-server: nats://… or amqp://…")
    .option(rabbitmqApiFlag, rabbitmqApiHelp)
    .option(metricsFlag, metricsHelp)
    .action(async (flags: { natsPort?: string; broker?: string; moveBroker?: boolean }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags & { metrics?: string; rabbitmqApi?: string }>();
      const options = optionsFrom(globals);
      const log = createLogger({});
      // Listened for from the first: the children run out of the terminal's reach, and a signal that ended this
      // process while it starts them would leave them running.
      const stopping = stopSignal();
      if (flags.broker !== undefined) {
        if (flags.natsPort !== undefined) throw new UsageError("--nats-port and --broker exclude each other");
        if (flags.moveBroker === true)
          throw new UsageError("--move-broker moves this mesh's own nats-server only");
        recordBroker(options, flags.broker);
        await superviseControlPlane(
          log,
          childArguments(globals),
          announcement(options, flags.broker),
          stopping,
        );
        return;
      }
      const wanted = flags.natsPort === undefined ? undefined : parsePort(flags.natsPort);
      const embedded = await choosePort(options.dataDir, wanted, flags.moveBroker === true);
      mkdirSync(options.dataDir, { recursive: true, mode: 0o700 });
      recordRunningSettings(options);
      const url = `nats://${embedded.host}:${embedded.port}`;
      writeBrokerRecord(options.dataDir, { url, embedded: { host: embedded.host, port: embedded.port } });

      const identities = openNatsIdentities(options.dataDir, url, embedded);
      const logPath = join(embedded.dir, "nats-server.log");
      const configure = async () => {
        const revoked = await withStore(options, (store) => currentRevocations(store, new Date()));
        return identities.writeServerConfig(revoked);
      };
      const config = await configure();
      const watchedServer = (server: RunningNatsServer): Supervised => ({
        ended: server.exited.then(
          (code) => `nats-server exited (${code === null ? "killed by a signal" : `code ${code}`})`,
        ),
        stop: () => server.stop(),
      });
      const first = await startNatsServer(config, embedded, logPath, { ownProcessGroup: true });
      // Started again on the same port and data, with the accounts as the store has them now (or as the config
      // file last had them, when the store cannot be read).
      const broker = new Supervisor({
        name: "broker",
        log,
        initial: watchedServer(first),
        start: async () => {
          const current = await configure().catch((error: unknown) => {
            log.warn("broker.config_kept", {
              error: errorText(error),
              note: "started on the config file as it is",
            });
            return config;
          });
          const server = await startNatsServer(current, embedded, logPath, { ownProcessGroup: true });
          log.warn("broker.started_again", { pid: server.pid, url });
          return watchedServer(server);
        },
      });
      await superviseControlPlane(
        log,
        childArguments(globals),
        announcement(options, url, embedded.dir),
        stopping,
        broker,
      );
    });

  program
    .command("serve")
    .description("run the control plane against a broker that already runs")
    .option("--broker <url>", "the broker: nats://127.0.0.1:4222 or amqp://127.0.0.1:5672/VHOST (required)")
    .option(rabbitmqApiFlag, rabbitmqApiHelp)
    .option(metricsFlag, metricsHelp)
    .addOption(
      new Option("--under-up", "run as the control plane of `mesh up`, on its recorded broker").hideHelp(),
    )
    .action(async (flags: { broker?: string; underUp?: boolean }, command: Command) => {
      const options = optionsFrom(command.optsWithGlobals<GlobalFlags>());
      if (flags.underUp === true) {
        const access = recordedAccess(options);
        if (access === undefined) throw new MeshError("no_broker", "no broker is recorded for this mesh");
        await serveHere(options, access, true);
        return;
      }
      if (flags.broker === undefined) throw new UsageError("required option '--broker <url>' not specified");
      await serveHere(options, recordBroker(options, flags.broker), false);
    });

  const broker = program.command("broker").description("the broker the mesh runs on");
  broker
    .command("config")
    .description("print the nats-server config fragment this mesh needs (operator mode, its accounts)")
    .option("--json", "print {operator, system_account, resolver_preload}")
    .action(async (flags: { json?: boolean }, command: Command) => {
      const options = optionsFrom(command.optsWithGlobals<GlobalFlags>());
      const revoked = await withStore(options, (store) => currentRevocations(store, new Date()));
      const fragment = await brokerConfigFragment(options.dataDir, revoked);
      if (flags.json === true) {
        process.stdout.write(
          `${JSON.stringify({ operator: fragment.operatorJwt, system_account: fragment.systemAccount, resolver_preload: fragment.accounts }, null, 2)}\n`,
        );
        return;
      }
      const preload = Object.entries(fragment.accounts)
        .map(([key, jwt]) => `  ${key}: "${jwt}"`)
        .join("\n");
      process.stdout.write(
        `# nats-server config for this mesh (JetStream must be enabled too)\noperator: "${fragment.operatorJwt}"\n` +
          `system_account: "${fragment.systemAccount}"\nresolver: MEMORY\nresolver_preload: {\n${preload}\n}\n`,
      );
    });
}

function parsePort(text: string): number {
  const port = /^\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isInteger(port) || port < 0 || port > 65_535) {
    throw new UsageError(`--nats-port: "${text}" is not a port number (0 to 65535)`);
  }
  return port;
}

/**
 * The broker's port. The one recorded on the first run is the port, always: enrolled nodes hold that address, so a
 * different `--nats-port` is refused unless the operator says `--move-broker`, and a taken port is an error that
 * names who holds it.
 */
async function choosePort(
  dataDir: string,
  wanted: number | undefined,
  move: boolean,
): Promise<EmbeddedServer> {
  const dir = join(dataDir, "nats", "server");
  const recorded: BrokerRecord | undefined = readBrokerRecord(dataDir);
  const kept = recorded?.embedded?.port;
  if (move && wanted === undefined)
    throw new UsageError("--move-broker needs --nats-port: the port to move to");
  if (kept !== undefined && (wanted === undefined || wanted === kept)) {
    if (!(await portIsFree(host, kept))) await stopLeftBehind(kept, join(dir, "nats-server.conf"));
    if (!(await portIsFree(host, kept))) {
      throw new MeshError(
        "port_taken",
        `port ${kept}, where this mesh's nodes reach the broker, is taken${holder(kept)}; free it (moving the broker means telling every node)`,
      );
    }
    return { dir, host, port: kept };
  }
  if (kept !== undefined && !move) {
    throw new UsageError(
      `this mesh's broker is on port ${kept}, where its nodes reach it; --nats-port ${wanted} would move it: ` +
        `give --move-broker as well, then tell every node the new address`,
    );
  }
  let port: number;
  if (wanted !== undefined && wanted !== 0) {
    if (!(await portIsFree(host, wanted)))
      throw new MeshError("port_taken", `--nats-port ${wanted}: the port is taken${holder(wanted)}`);
    port = wanted;
  } else if (wanted === undefined && (await portIsFree(host, defaultNatsPort))) {
    port = defaultNatsPort;
  } else {
    port = await freePort(host);
  }
  if (kept !== undefined) {
    process.stderr.write(
      `mesh: the broker moves from port ${kept} to ${port}. Every enrolled node still dials ${host}:${kept}: on each ` +
        `one run \`mesh-host broker set nats://<this host>:${port}\` and restart mesh-host.\n`,
    );
  }
  return { dir, host, port };
}

/**
 * A nats-server of this very mesh, left running by a `mesh up` that was killed: it is stopped, to be started again
 * under this one (its nodes reconnect by themselves). Anything else on the port is left alone.
 */
async function stopLeftBehind(port: number, config: string): Promise<void> {
  const who = whoListens(port);
  const pid = Number(who?.split(" ")[0]);
  if (who === undefined || !who.includes(config) || !Number.isInteger(pid)) return;
  process.stderr.write(
    `mesh: this mesh's nats-server was left running (pid ${pid}); it is started again here\n`,
  );
  process.kill(pid, "SIGTERM");
  for (let waited = 0; waited < 10_000 && !(await portIsFree(host, port)); waited += 100)
    await new Promise((resolve) => setTimeout(resolve, 100));
}

/** ` (held by PID COMMAND)` when this host tells who holds the port. */
function holder(port: number): string {
  const who = whoListens(port);
  return who === undefined ? "" : ` (held by ${who})`;
}
