/** Connecting to NATS with a user JWT, with the client's failures turned into the mesh's errors. */
import type { Authenticator, NatsConnection } from "@nats-io/transport-node";
import {
  AuthorizationError,
  ConnectionError,
  NatsConnectionImpl,
  NoRespondersError,
  PermissionViolationError,
  RequestError,
  setTransportFactory,
  TimeoutError,
  UserAuthenticationExpiredError,
} from "@nats-io/transport-node";
import { nodeResolveHost, NodeTransport } from "@nats-io/transport-node/lib/node_transport.js";
import type { Socket } from "node:net";
import { encode, fromSeed } from "@nats-io/nkeys";
import { fastSigner } from "./authority.js";
import { BrokerRefusedIdentity, BusError, unreachableSocketCodes } from "../errors.js";

export interface NatsIdentity {
  jwt: string;
  /** The user's nkey seed (`SU…`): it signs the server's challenge and never leaves the holder. */
  seed: string;
}

export interface NatsConnectOptions {
  url: string;
  identity: NatsIdentity;
  /** A name for the server's connection list. */
  name: string;
  /** Replies to this connection's requests arrive under this prefix (a node's or token's own reply space). */
  inboxPrefix?: string;
  /** Keep reconnecting forever (agents and servers) or fail at the first loss (one-shot commands). */
  reconnect: boolean;
  /** How long to wait for the server's greeting and first answer (default 5 s). */
  timeoutMs?: number;
}

/**
 * The client's own socket transport, except that closing one that never finished connecting ends its socket. The
 * client (3.4) ignores close() on a transport that has not connected, so a connect that timed out waiting for the
 * server's greeting — a server that accepts sockets but does not answer, stopped or overloaded — left its socket
 * open, and that socket kept a one-shot command alive after it had failed.
 */
class ClosingTransport extends NodeTransport {
  override close(err?: Error): Promise<void> {
    if (!this.connected) this.discard();
    return super.close(err);
  }
}

/**
 * The socket a connection reads the server from now (a reconnect dials a new one), when it is this client's own
 * kind: what the lab pauses to hold a fleet.
 */
export function socketOf(nc: NatsConnection): Socket | undefined {
  if (!(nc instanceof NatsConnectionImpl)) return undefined;
  const transport = nc.protocol.transport;
  return transport instanceof NodeTransport ? transport.socket : undefined;
}

export async function connectNats(options: NatsConnectOptions): Promise<NatsConnection> {
  const timeoutMs = options.timeoutMs ?? 5000;
  // What the client's own connect() does, with the transport above: the factory is read as each dial begins.
  setTransportFactory({ factory: () => new ClosingTransport(), dnsResolveFn: nodeResolveHost });
  try {
    return await NatsConnectionImpl.connect({
      servers: options.url,
      name: options.name,
      authenticator: jwtSigner(options.identity),
      timeout: timeoutMs,
      ...(options.inboxPrefix === undefined ? {} : { inboxPrefix: options.inboxPrefix }),
      ...(options.reconnect
        ? // A process that lives on (an agent, a control plane) also waits for a broker that is not up yet.
          {
            reconnect: true,
            maxReconnectAttempts: -1,
            reconnectTimeWait: 1000,
            reconnectJitter: 1000,
            waitOnFirstConnect: true,
            // A server that stopped answering (paused, or cut off without a reset) is given up within about 30 s
            // and dialled again, instead of after the library's default of several minutes.
            pingInterval: 10_000,
            maxPingOut: 3,
          }
        : { reconnect: false }),
    });
  } catch (error) {
    // A server that took the socket but never answered: no answer in time, not a refusal nor an absence.
    if (error instanceof TimeoutError) throw noAnswer(options.url, timeoutMs, error);
    throw asBusError(error, options.url);
  }
}

/** The broker did not answer within `timeoutMs`: the mesh's `timeout`, with the client's error as the cause. */
export function noAnswer(url: string, timeoutMs: number, cause?: unknown): BusError {
  return new BusError("timeout", `no answer from the broker at ${url} within ${timeoutMs} ms`, { cause });
}

/**
 * Answers the server's challenge with the user's JWT and the nonce signed by node:crypto: the client library's own
 * pure-JS signing takes about 5 ms a connection, which a thousand nodes joining at once turn into seconds.
 */
function jwtSigner(identity: NatsIdentity): Authenticator {
  const pair = fastSigner(fromSeed(new TextEncoder().encode(identity.seed)));
  return (nonce?: string) => ({
    jwt: identity.jwt,
    nkey: pair.getPublicKey(),
    sig: nonce === undefined ? "" : encode(pair.sign(new TextEncoder().encode(nonce))),
  });
}

/** The mesh's reading of a NATS client error: by the client's error classes and Node's codes, never its text. */
export function asBusError(error: unknown, url: string): BusError {
  if (error instanceof BusError) return error;
  const message = error instanceof Error ? error.message : String(error);
  // A request's failure arrives as a RequestError with the server's error as its cause (a refused subscription to
  // the reply subject, say): the cause is what happened.
  const what = error instanceof RequestError && error.cause !== undefined ? error.cause : error;
  if (
    what instanceof AuthorizationError ||
    what instanceof UserAuthenticationExpiredError ||
    what instanceof PermissionViolationError
  ) {
    return new BrokerRefusedIdentity(`the broker at ${url} refused this identity: ${message}`, {
      cause: error,
    });
  }
  // The client turns a refused socket into a ConnectionError; other socket errors come through with Node's code.
  if (
    what instanceof ConnectionError ||
    what instanceof TimeoutError ||
    unreachableSocketCodes.has(errnoOf(what))
  ) {
    return new BusError("broker_unreachable", `cannot reach the broker at ${url}: ${message}`, {
      cause: error,
    });
  }
  return new BusError("broker", `broker error at ${url}: ${message}`, { cause: error });
}

function errnoOf(error: unknown): string {
  const code = error instanceof Error ? (error as NodeJS.ErrnoException).code : undefined;
  return typeof code === "string" ? code : "";
}

/** The JetStream client's own wait for an answer, when the caller gives none. */
const jetStreamTimeoutMs = 5000;
/** The longest pause between asking again while JetStream has no responder (it doubles up to this from 10 ms). */
const noResponderPauseMs = 200;

/**
 * Runs one operation of the JetStream API. The broker's silence past the timeout is the mesh's `timeout`. While
 * nats-server applies an update of the account's claims (the control plane pushes one at each revocation, so at every
 * join) the account's JetStream has no responder for a moment: the request reached nobody and did nothing, so it is
 * asked again, within the timeout, and only a JetStream that stays without one is a failure (the client calls that
 * "jetstream is not enabled"). Any other failure, a compare-and-set refused among them, is passed on as it is.
 */
export async function askJetStream<T>(
  nc: NatsConnection,
  timeoutMs: number | undefined,
  operation: () => Promise<T>,
): Promise<T> {
  const within = timeoutMs ?? jetStreamTimeoutMs;
  const giveUpAt = performance.now() + within;
  for (let pauseMs = 10; ; pauseMs = Math.min(pauseMs * 2, noResponderPauseMs)) {
    try {
      return await operation();
    } catch (error) {
      if (error instanceof TimeoutError) throw noAnswer(nc.getServer(), within, error);
      if (!noResponder(error)) throw error;
      if (performance.now() + pauseMs >= giveUpAt) {
        throw new BusError(
          "broker",
          `JetStream at ${nc.getServer()} had no responder for this account within ${within} ms ` +
            "(it is not enabled for it, or the server kept it unavailable that long)",
          { cause: error },
        );
      }
      await new Promise((resolve) => setTimeout(resolve, pauseMs));
    }
  }
}

/** Whether a request reached no responder: the client's own error, or its JetStream error caused by one. */
function noResponder(error: unknown): boolean {
  for (let at: unknown = error, depth = 0; at instanceof Error && depth < 3; at = at.cause, depth++) {
    if (at instanceof NoRespondersError || (at instanceof RequestError && at.isNoResponders())) return true;
  }
  return false;
}
