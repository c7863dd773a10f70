/**
 * Opening the broker by its URL. The rest of the mesh asks for a control side, a node side or an enrolment side
 * and never learns which client library sits behind it.
 */
import { join } from "node:path";
import { MeshError } from "../errors.js";
import type { Logger } from "../log.js";
import type {
  BrokerIdentities,
  ControlBus,
  EnrolmentBus,
  NodeBus,
  NodeCredential,
  TokenCredential,
} from "./bus.js";
import { loadOrCreateAuthority } from "./nats/authority.js";
import { connectNats } from "./nats/connect.js";
import { NatsControlBus } from "./nats/control-bus.js";
import { NatsKvLease } from "./nats/lease-kv.js";
import type { LeaseBackend } from "../lease/lease.js";
import type { EmbeddedServer } from "./nats/identities.js";
import { NatsBrokerIdentities, serverConfigFragment } from "./nats/identities.js";
import { NatsEnrolmentBus, NatsNodeBus } from "./nats/node-bus.js";

export type * from "./bus.js";
export { BrokerRefusedIdentity, BusError, NobodyAnswers } from "./errors.js";

export type BrokerKind = "nats" | "amqp";

export function brokerKindOf(url: string): BrokerKind {
  if (/^(nats|tls):\/\//.test(url)) return "nats";
  if (/^amqps?:\/\//.test(url)) return "amqp";
  throw new MeshError("usage", `broker URL "${url}" is neither nats://… nor amqp://…`);
}

/** Where the control plane keeps its broker authority keys. */
export function authorityDir(dataDir: string): string {
  return join(dataDir, "nats");
}

export interface ControlSide {
  bus: ControlBus;
  identities: BrokerIdentities;
  /** The controller lease in the broker's key-value store. */
  lease(ttlMs: number): Promise<LeaseBackend>;
  close(): Promise<void>;
}

/** The control plane's identities on the broker; enough for commands that mint or revoke but send nothing. */
export function openIdentities(
  dataDir: string,
  url: string,
  embedded?: EmbeddedServer,
): NatsBrokerIdentities {
  brokerKindOf(url);
  return new NatsBrokerIdentities(loadOrCreateAuthority(authorityDir(dataDir)), url, embedded);
}

/** Connects the control plane to its broker. */
export async function openControlSide(
  dataDir: string,
  url: string,
  log: Logger,
  options: { embedded?: EmbeddedServer; longLived: boolean },
): Promise<ControlSide> {
  const kind = brokerKindOf(url);
  if (kind !== "nats") throw new MeshError("unsupported_broker", "RabbitMQ is not supported yet");
  const identities = openIdentities(dataDir, url, options.embedded);
  // A control plane rides out broker restarts; a one-shot command fails at once when the broker is away.
  const nc = await connectNats({
    url,
    identity: await identities.controlIdentity(),
    name: "mesh control",
    reconnect: options.longLived,
  });
  const bus = new NatsControlBus(nc, log);
  return {
    bus,
    identities,
    lease: (ttlMs) => NatsKvLease.open(nc, ttlMs),
    close: async () => {
      await bus.close();
      await identities.close();
    },
  };
}

export async function openNodeSide(
  url: string,
  node: string,
  credential: NodeCredential,
  seed: string | undefined,
): Promise<NodeBus> {
  if (credential.type !== "nats" || seed === undefined) {
    throw new MeshError("unsupported_broker", "only NATS node credentials are supported yet");
  }
  return NatsNodeBus.open(url, node, { jwt: credential.jwt, seed });
}

export async function openEnrolmentSide(
  url: string,
  node: string,
  credential: TokenCredential,
): Promise<EnrolmentBus> {
  if (credential.type !== "nats")
    throw new MeshError("unsupported_broker", "only NATS tokens are supported yet");
  return NatsEnrolmentBus.open(url, node, { jwt: credential.jwt, seed: credential.seed });
}

export type { EmbeddedServer } from "./nats/identities.js";
export { newUserKey } from "./nats/authority.js";
export { findNatsServer, freePort, portIsFree, startNatsServer } from "./nats/server.js";
export type { RunningNatsServer } from "./nats/server.js";
export type { NatsBrokerIdentities } from "./nats/identities.js";

/** What a nats-server needs to serve this mesh: operator, system account, accounts to preload. */
export async function brokerConfigFragment(
  dataDir: string,
  revoked: ReadonlyMap<string, Date>,
): Promise<{ operatorJwt: string; systemAccount: string; accounts: Record<string, string> }> {
  return serverConfigFragment(loadOrCreateAuthority(authorityDir(dataDir)), revoked);
}
