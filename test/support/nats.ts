/** A nats-server in operator mode on a free port with a temp dir, started from the mesh's own authority. */
import { appendFileSync } from "node:fs";
import { join } from "node:path";
import type { NatsAuthority } from "../../src/bus/nats/authority.js";
import { Algorithms, encodeUser } from "@nats-io/jwt";
import {
  accountJwt,
  fastSigner,
  loadOrCreateAuthority,
  newUserKey,
  operatorJwt,
  systemAccountJwt,
} from "../../src/bus/nats/authority.js";
import type { RunningNatsServer } from "../../src/bus/nats/server.js";
import { freePort, startNatsServer, writeNatsServerConfig } from "../../src/bus/nats/server.js";
import { tempDir } from "./tmp.js";

export interface OperatorServer {
  authority: NatsAuthority;
  server: RunningNatsServer;
  url: string;
  stop(): Promise<void>;
}

/**
 * `account`: the mesh account's JWT to preload (default: as the control plane mints it now). `maxPayload`: a
 * server-wide `max_payload` other than nats-server's default, as an operator may set.
 */
export async function startOperatorServer(
  options: { account?: (authority: NatsAuthority) => Promise<string>; maxPayload?: number } = {},
): Promise<OperatorServer> {
  const dir = tempDir("mesh-nats-");
  const authority = loadOrCreateAuthority(join(dir.path, "keys"));
  const port = await freePort();
  const config = writeNatsServerConfig({
    dir: join(dir.path, "server"),
    host: "127.0.0.1",
    port,
    operatorJwt: await operatorJwt(authority),
    systemAccount: authority.system.getPublicKey(),
    accounts: {
      [authority.account.getPublicKey()]: await (options.account ?? accountJwt)(authority),
      [authority.system.getPublicKey()]: await systemAccountJwt(authority),
    },
  });
  if (options.maxPayload !== undefined) appendFileSync(config, `max_payload: ${options.maxPayload}\n`);
  const server = await startNatsServer(config, { host: "127.0.0.1", port }, join(dir.path, "nats.log"));
  return {
    authority,
    server,
    url: server.url,
    stop: async () => {
      await server.stop();
      dir.remove();
    },
  };
}

/** A test-only identity that may publish and subscribe to anything in the mesh account: it sees what reached the broker. */
export async function observerCredentials(
  authority: NatsAuthority,
): Promise<{ jwt: string; seed: string; publicKey: string }> {
  const key = newUserKey();
  const jwt = await encodeUser(
    "observer",
    key.publicKey,
    fastSigner(authority.account),
    { pub: { allow: [">"] }, sub: { allow: [">"] } },
    { algorithm: Algorithms.v2 },
  );
  return { jwt, seed: key.seed, publicKey: key.publicKey };
}
