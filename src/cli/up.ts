/**
 * `mesh up`: everything local on the embedded defaults — the mesh's own nats-server (operator mode, JetStream in
 * the data dir, 127.0.0.1) as a supervised child, and the control plane in this process; with `--broker`, the
 * control plane on a broker that runs already (RabbitMQ, say). `mesh serve`: the control plane alone, against a
 * broker that already runs (`mesh broker config` prints what a nats-server needs).
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Command } from "commander";
import type { EmbeddedServer } from "../bus/index.js";
import {
  brokerKindOf,
  freePort,
  openNatsIdentities,
  parseAmqpUrl,
  portIsFree,
  rabbitmqApiOf,
  startNatsServer,
} from "../bus/index.js";
import { brokerConfigFragment } from "../bus/index.js";
import type { BrokerRecord } from "../control/broker-record.js";
import { readBrokerRecord, writeBrokerRecord } from "../control/broker-record.js";
import { currentRevocations } from "../control/revocations.js";
import { serve } from "../control/serve.js";
import type { MeshOptions } from "../config/options.js";
import { recordRunningSettings } from "../config/options.js";
import { MeshError, UsageError } from "../errors.js";
import { createLogger, errorText } from "../log.js";
import type { GlobalFlags } from "./context.js";
import { optionsFrom, withStore } from "./context.js";

const host = "127.0.0.1";
const defaultNatsPort = 4222;
const metricsFlag = "--metrics <host:port>";
const rabbitmqApiFlag = "--rabbitmq-api <url>";
const rabbitmqApiHelp =
  "RabbitMQ's management API, http://user:pass@host:15672 (default: the broker URL's credentials on port 15672)";
const metricsHelp =
  "serve Prometheus metrics at http://HOST:PORT/metrics (or off; default off, MESH_METRICS)";

/** The control plane on a broker that runs already; the broker is recorded for every later command. */
async function serveOn(options: MeshOptions, url: string): Promise<void> {
  // Bad usage is found before anything is written: the URL's scheme, and on RabbitMQ how accounts will be made.
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
  const log = createLogger({});
  const plane = await serve({ options, broker, log });
  const announce =
    brokerKindOf(url) === "amqp"
      ? () =>
          process.stdout.write(
            `The mesh is up.\n  broker  ${parseAmqpUrl(url).url} (RabbitMQ)\n  data    ${options.dataDir}\n\n` +
              `Let a machine in:  npx mesh token issue <node-name>\n`,
          )
      : undefined;
  await runUntilStopped(log, plane, new Promise<never>(() => undefined), () => Promise.resolve(), announce);
}

export function registerServeCommands(program: Command): void {
  program
    .command("up")
    .description(
      "run a whole mesh locally: its own nats-server and the control plane (or the control plane on --broker)",
    )
    .option(
      "--nats-port <port>",
      "the broker's port (0: any free port; default 4222 if free on the first run)",
    )
    .option("--broker <url>", "run on this broker instead of an own nats-server: nats://… or amqp://…")
    .option(rabbitmqApiFlag, rabbitmqApiHelp)
    .option(metricsFlag, metricsHelp)
    .action(async (flags: { natsPort?: string; broker?: string }, command: Command) => {
      const options = optionsFrom(command.optsWithGlobals<GlobalFlags>());
      if (flags.broker !== undefined) {
        if (flags.natsPort !== undefined) throw new UsageError("--nats-port and --broker exclude each other");
        await serveOn(options, flags.broker);
        return;
      }
      const wanted = flags.natsPort === undefined ? undefined : parsePort(flags.natsPort);
      const embedded = await choosePort(options.dataDir, wanted);
      mkdirSync(options.dataDir, { recursive: true, mode: 0o700 });
      recordRunningSettings(options);
      const log = createLogger({});
      const url = `nats://${embedded.host}:${embedded.port}`;
      writeBrokerRecord(options.dataDir, { url, embedded: { host: embedded.host, port: embedded.port } });

      const identities = openNatsIdentities(options.dataDir, url, embedded);
      const revoked = await withStore(options, (store) => currentRevocations(store, new Date()));
      const config = await identities.writeServerConfig(revoked);
      const server = await startNatsServer(config, embedded, join(embedded.dir, "nats-server.log"));
      let plane;
      try {
        plane = await serve({ options, broker: { url, embedded }, log });
      } catch (error) {
        await server.stop();
        throw error;
      }
      await runUntilStopped(
        log,
        plane,
        server.exited,
        () => server.stop(),
        () =>
          process.stdout.write(
            `The mesh is up.\n  broker  ${url} (nats-server, data in ${embedded.dir})\n  data    ${options.dataDir}\n\n` +
              `Let a machine in:  npx mesh token issue <node-name>\n`,
          ),
      );
    });

  program
    .command("serve")
    .description("run the control plane against a broker that already runs")
    .requiredOption("--broker <url>", "the broker: nats://127.0.0.1:4222 or amqp://127.0.0.1:5672/VHOST")
    .option(rabbitmqApiFlag, rabbitmqApiHelp)
    .option(metricsFlag, metricsHelp)
    .action(async (flags: { broker: string }, command: Command) => {
      await serveOn(optionsFrom(command.optsWithGlobals<GlobalFlags>()), flags.broker);
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

/** The port chosen on the first run is kept: enrolled nodes hold that address. */
async function choosePort(dataDir: string, wanted: number | undefined): Promise<EmbeddedServer> {
  const dir = join(dataDir, "nats", "server");
  const recorded: BrokerRecord | undefined = readBrokerRecord(dataDir);
  if (wanted === undefined && recorded?.embedded !== undefined) {
    const { port } = recorded.embedded;
    if (!(await portIsFree(host, port))) {
      throw new MeshError(
        "port_taken",
        `port ${port}, where this mesh's nodes reach the broker, is taken; free it, or move with --nats-port (enrolled nodes then need new tokens)`,
      );
    }
    return { dir, host, port };
  }
  if (wanted !== undefined && wanted !== 0) {
    if (!(await portIsFree(host, wanted)))
      throw new MeshError("port_taken", `--nats-port ${wanted}: the port is taken`);
    return { dir, host, port: wanted };
  }
  if (wanted === undefined && (await portIsFree(host, defaultNatsPort)))
    return { dir, host, port: defaultNatsPort };
  return { dir, host, port: await freePort(host) };
}

async function runUntilStopped(
  log: ReturnType<typeof createLogger>,
  plane: { done: Promise<void>; serving: Promise<void>; stop(): Promise<void> },
  brokerExited: Promise<number | null>,
  stopBroker: () => Promise<void>,
  /** Said once the control plane acts (a standby says it when it takes over), not merely when it started. */
  announce?: () => void,
): Promise<void> {
  const signalled = new Promise<string>((resolve) => {
    process.once("SIGINT", () => resolve("SIGINT"));
    process.once("SIGTERM", () => resolve("SIGTERM"));
  });
  void plane.serving.then(announce);
  const reason = await Promise.race([
    signalled,
    brokerExited.then((code) => `broker exited (${code})`),
    plane.done.then(
      () => "control queue closed",
      (error: unknown) => `control plane failed: ${errorText(error)}`,
    ),
  ]);
  log.info("mesh.stopping", { reason });
  await plane.stop();
  await stopBroker();
  if (!reason.startsWith("SIG")) throw new MeshError("stopped", `the mesh stopped: ${reason}`);
}
