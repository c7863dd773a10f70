/**
 * A nats-server run the way an operator would run one for `mesh serve`: configured from `mesh broker config`, on a
 * free port, with its own JetStream dir. `restart()` starts it again from the same config on the same port.
 */
import { join } from "node:path";
import { freePort, startNatsServer } from "../../src/bus/index.js";
import type { RunningNatsServer } from "../../src/bus/index.js";
import { writeNatsServerConfig } from "../../src/bus/nats/server.js";
import { mesh } from "./cli.js";

export interface OperatorBroker {
  url: string;
  restart(): Promise<void>;
  stop(): Promise<void>;
}

export async function startOperatorBroker(dataDir: string, dir: string): Promise<OperatorBroker> {
  const printed = await mesh(["--data", dataDir, "broker", "config", "--json"]);
  if (printed.code !== 0) throw new Error(`mesh broker config failed: ${printed.stderr}`);
  const fragment = JSON.parse(printed.stdout) as {
    operator: string;
    system_account: string;
    resolver_preload: Record<string, string>;
  };
  const port = await freePort();
  const listen = { host: "127.0.0.1", port };
  const config = writeNatsServerConfig({
    dir: join(dir, "nats"),
    ...listen,
    operatorJwt: fragment.operator,
    systemAccount: fragment.system_account,
    accounts: fragment.resolver_preload,
  });
  let server: RunningNatsServer = await startNatsServer(config, listen, join(dir, "nats.log"));
  return {
    url: server.url,
    restart: async () => {
      await server.stop();
      server = await startNatsServer(config, listen, join(dir, "nats.log"));
    },
    stop: () => server.stop(),
  };
}
