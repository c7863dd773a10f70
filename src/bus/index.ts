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
import { defaultControlBusOptions, NatsControlBus } from "./nats/control-bus.js";
import { NatsKvLease } from "./nats/lease-kv.js";
import type { LeaseBackend, LeaseStore } from "../lease/lease.js";
import { AmqpControlBus } from "./amqp/control-bus.js";
import { AmqpBrokerIdentities } from "./amqp/identities.js";
import { AmqpLink, parseAmqpUrl } from "./amqp/link.js";
import { RabbitManagement } from "./amqp/management.js";
import { AmqpEnrolmentBus, AmqpNodeBus } from "./amqp/node-bus.js";
import type { EmbeddedServer } from "./nats/identities.js";
import { NatsBrokerIdentities, serverConfigFragment } from "./nats/identities.js";
import { NatsEnrolmentBus, NatsNodeBus } from "./nats/node-bus.js";
import { BrokerRefusedIdentity, BusError } from "./errors.js";

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
  identities: ControlIdentities;
  /** The controller lease: in the broker's key-value store (NATS) or in the mesh's store (RabbitMQ). */
  lease(ttlMs: number, store: LeaseStore): Promise<LeaseBackend>;
  close(): Promise<void>;
}

/** Broker identities as the control plane uses them, whichever the broker. */
export interface ControlIdentities extends BrokerIdentities {
  /**
   * Deletes the accounts of tokens not in `keep()` (token ids) on RabbitMQ; NATS tokens expire by themselves.
   * `keep` is asked after the accounts are listed: a token's row is written before its account, so a token issued
   * meanwhile is always kept. Returns how many were deleted.
   */
  sweepTokens(keep: () => Promise<ReadonlySet<string>>): Promise<number>;
  /**
   * Whether token accounts live on the broker until deleted (RabbitMQ: no account expires by itself), so the
   * control plane sweeps them at each token's expiry. False where a token's identity expires with it (NATS).
   */
  readonly sweepsTokens: boolean;
  /**
   * Ends one token's identity at once (`user` as kept for the token): on RabbitMQ its account is deleted, closing
   * its connections. On NATS the revocation list that `revoke` pushes carries it; nothing is kept apart to end.
   */
  endToken(user: string): Promise<void>;
  /** Removes what the broker keeps for a retired node (its RabbitMQ queue). */
  forget(node: string): Promise<void>;
}

/** How the control plane reaches its broker: the URL, and for RabbitMQ its management API. */
export interface BrokerAccess {
  url: string;
  /** `http://user:pass@host:15672`: RabbitMQ accounts are made through it. */
  rabbitmqApi?: string | undefined;
  /** The mesh's own nats-server, when it runs one. */
  embedded?: EmbeddedServer | undefined;
}

/** The management API of a RabbitMQ broker: as given, or beside the broker with the broker URL's credentials. */
export function rabbitmqApiOf(access: BrokerAccess): string {
  // The broker URL is checked even when the API is given: a bad one is bad usage now, not a failure later.
  const address = parseAmqpUrl(access.url);
  if (access.rabbitmqApi !== undefined) return access.rabbitmqApi;
  if (address.username === undefined) {
    throw new MeshError(
      "usage",
      `RabbitMQ accounts are made through its management API: give --rabbitmq-api http://user:pass@${address.hostname}:15672 ` +
        "(or put the administrator's credentials in the broker URL)",
    );
  }
  return `http://${encodeURIComponent(address.username)}:${encodeURIComponent(address.password ?? "")}@${address.hostname}:15672`;
}

/** The control plane's identities on the broker; enough for commands that mint or revoke but send nothing. */
export function openIdentities(dataDir: string, access: BrokerAccess): ControlIdentities {
  if (brokerKindOf(access.url) === "amqp") {
    return new AmqpBrokerIdentities(
      new RabbitManagement(rabbitmqApiOf(access)),
      parseAmqpUrl(access.url),
      join(dataDir, "rabbitmq"),
    );
  }
  return openNatsIdentities(dataDir, access.url, access.embedded);
}

/** The NATS identities of this mesh, for what only NATS has (the server config, the control user's JWT). */
export function openNatsIdentities(
  dataDir: string,
  url: string,
  embedded?: EmbeddedServer,
): NatsBrokerIdentities {
  return new NatsBrokerIdentities(loadOrCreateAuthority(authorityDir(dataDir)), url, embedded);
}

/**
 * Connects the control plane to its broker. `timeoutMs`: how long each wait for the broker may last (connecting,
 * the lease's operations, the flush after sending), a one-shot command's deadline; on RabbitMQ not yet applied.
 */
export async function openControlSide(
  dataDir: string,
  access: BrokerAccess,
  log: Logger,
  options: { longLived: boolean; ackWaitMs?: number; timeoutMs?: number },
): Promise<ControlSide> {
  if (brokerKindOf(access.url) === "amqp") return openAmqpControlSide(dataDir, access, log, options);
  const identities = openNatsIdentities(dataDir, access.url, access.embedded);
  // A control plane rides out broker restarts; a one-shot command fails at once when the broker is away.
  const nc = await connectNats({
    url: access.url,
    identity: await identities.controlIdentity(),
    name: "mesh control",
    reconnect: options.longLived,
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
  });
  // NATS redelivers what a consumer that died took after the ack wait; RabbitMQ as soon as the channel is gone.
  const bus = new NatsControlBus(nc, log, {
    ...defaultControlBusOptions,
    ...(options.ackWaitMs === undefined ? {} : { ackWaitMs: options.ackWaitMs }),
    answerWithinMs: options.timeoutMs,
  });
  return {
    bus,
    identities,
    lease: (ttlMs) => NatsKvLease.open(nc, ttlMs, undefined, options.timeoutMs),
    close: async () => {
      await bus.close();
      await identities.close();
    },
  };
}

async function openAmqpControlSide(
  dataDir: string,
  access: BrokerAccess,
  log: Logger,
  options: { longLived: boolean },
): Promise<ControlSide> {
  const address = parseAmqpUrl(access.url);
  const identities = new AmqpBrokerIdentities(
    new RabbitManagement(rabbitmqApiOf(access)),
    address,
    join(dataDir, "rabbitmq"),
  );
  const credential = await identities.controlCredential();
  const link = await AmqpLink.open({
    address,
    username: credential.username,
    password: credential.password,
    name: "mesh control",
    reconnect: options.longLived,
    log,
  });
  const bus = new AmqpControlBus(link, identities.users, log);
  return {
    bus,
    identities,
    // RabbitMQ has no compare-and-set store: the lease is a row in the mesh's store, with the same contract.
    lease: (ttlMs, store) => Promise.resolve(store.lease(ttlMs)),
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
  /** Told when the connection is lost and when it comes back. */
  log?: Logger,
): Promise<NodeBus> {
  if (credential.type === "amqp") return AmqpNodeBus.open(parseAmqpUrl(url), node, credential, log);
  if (seed === undefined) {
    throw new MeshError("not_joined", "this node's NATS user seed is missing from its state");
  }
  return NatsNodeBus.open(url, node, { jwt: credential.jwt, seed }, log);
}

export async function openEnrolmentSide(
  url: string,
  node: string,
  credential: TokenCredential,
  secret: string,
): Promise<EnrolmentBus> {
  const open = (): Promise<EnrolmentBus> =>
    credential.type === "amqp"
      ? AmqpEnrolmentBus.open(parseAmqpUrl(url), node, { username: credential.username, password: secret })
      : NatsEnrolmentBus.open(url, node, { jwt: credential.jwt, seed: credential.seed });
  return new EnrolmentSide(await open(), open);
}

/** The ways an ask ends when the connection is lost under it (not a refusal, a timeout or nobody answering). */
const droppedCodes: ReadonlySet<string> = new Set(["broker", "broker_unreachable"]);

/**
 * A token's identity ends when the token is spent and its grace is over: the broker then closes every connection
 * it has, and one may be a joiner using the spent token again, asking. To the joiner that is the broker refusing
 * the token, not a broker failure. Neither broker says so in a form of its own (NATS sends a protocol error's text
 * only, RabbitMQ closes the connection without a refusal's code), so when the connection is lost under a question the
 * broker is asked directly: a new connection with the same identity, refused, is the refusal; taken, the loss
 * was something else and is told as it was.
 */
class EnrolmentSide implements EnrolmentBus {
  constructor(
    private readonly bus: EnrolmentBus,
    private readonly reopen: () => Promise<EnrolmentBus>,
  ) {}

  async ask(body: Uint8Array, timeoutMs: number): Promise<Uint8Array> {
    try {
      return await this.bus.ask(body, timeoutMs);
    } catch (error) {
      if (!(error instanceof BusError) || !droppedCodes.has(error.code)) throw error;
      let again: EnrolmentBus;
      try {
        again = await this.reopen();
      } catch (refusal) {
        if (refusal instanceof BrokerRefusedIdentity) {
          throw new BrokerRefusedIdentity(
            `${refusal.message} (it ended this identity while the join waited)`,
            {
              cause: error,
            },
          );
        }
        // The broker is not taking connections at all now: the loss is told, which that explains as well.
        throw error;
      }
      await again.close();
      throw error;
    }
  }

  close(): Promise<void> {
    return this.bus.close();
  }
}

export type { EmbeddedServer } from "./nats/identities.js";
export { newUserKey } from "./nats/authority.js";
export { findNatsServer, freePort, portIsFree, startNatsServer, whoListens } from "./nats/server.js";
export type { RunningNatsServer } from "./nats/server.js";
export type { NatsBrokerIdentities } from "./nats/identities.js";
export type { AmqpBrokerIdentities } from "./amqp/identities.js";
export { parseAmqpUrl } from "./amqp/link.js";
export { RabbitManagement } from "./amqp/management.js";

/** What a nats-server needs to serve this mesh: operator, system account, accounts to preload. */
export async function brokerConfigFragment(
  dataDir: string,
  revoked: ReadonlyMap<string, Date>,
): Promise<{ operatorJwt: string; systemAccount: string; accounts: Record<string, string> }> {
  return serverConfigFragment(loadOrCreateAuthority(authorityDir(dataDir)), revoked);
}
