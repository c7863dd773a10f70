/**
 * One AMQP connection that comes back by itself. What a process owns on the broker (its topology, its consumers)
 * is registered as set-up work and done again on every new connection; channels die with their connection and are
 * made again. A refused login after a loss means the account was deleted (a retired node): the link then ends
 * for good instead of knocking forever.
 */
import { Socket } from "node:net";
import amqp, { IllegalOperationError } from "amqplib";
import type { Channel, ChannelModel, ConfirmChannel, Options, RecoveringChannelModel } from "amqplib";
import type { Logger } from "../../log.js";
import { errorText } from "../../log.js";
import { BrokerRefusedIdentity, BusError, unreachableSocketCodes } from "../errors.js";

export interface AmqpAddress {
  /** `amqp://host:port/vhost` without credentials: what nodes are told. */
  url: string;
  hostname: string;
  port: number;
  vhost: string;
  protocol: "amqp" | "amqps";
  /** Credentials written in the URL, if any (an operator's, for the management API). */
  username?: string;
  password?: string;
}

export function parseAmqpUrl(text: string): AmqpAddress {
  let url: URL;
  try {
    url = new URL(text);
  } catch (error) {
    throw new BusError("usage", `broker URL "${text}" is not a URL`, { cause: error });
  }
  const protocol = url.protocol === "amqps:" ? "amqps" : url.protocol === "amqp:" ? "amqp" : undefined;
  if (protocol === undefined)
    throw new BusError("usage", `broker URL "${text}" is not amqp://… or amqps://…`);
  const port = url.port === "" ? (protocol === "amqps" ? 5671 : 5672) : Number(url.port);
  const path = decodeURIComponent(url.pathname.replace(/^\//, ""));
  const vhost = path === "" ? "/" : path;
  const address: AmqpAddress = {
    url: `${protocol}://${url.hostname}:${port}/${encodeURIComponent(vhost)}`,
    hostname: url.hostname,
    port,
    vhost,
    protocol,
  };
  if (url.username !== "") {
    address.username = decodeURIComponent(url.username);
    address.password = decodeURIComponent(url.password);
  }
  return address;
}

export interface AmqpLinkOptions {
  address: AmqpAddress;
  username: string;
  password: string;
  /** Shown in the broker's connection list. */
  name: string;
  /** Keep reconnecting forever (agents, control plane) or fail at the first loss (one-shot commands). */
  reconnect: boolean;
  log?: Logger;
}

type SetUp = (connection: ChannelModel) => Promise<void>;

export class AmqpLink {
  private readonly setUps: SetUp[] = [];
  private readonly reconnectListeners: (() => void)[] = [];
  private current: ChannelModel | undefined;
  private connections = 0;
  private closing = false;
  /** Whether the attempts since the last connection have failed, and that was said. */
  private failing = false;
  /** Set when the broker refused the login: the reason the link ends. */
  private refusal: BrokerRefusedIdentity | undefined;
  private signalEnd: (error: Error | undefined) => void = () => undefined;
  private readonly ended: Promise<Error | undefined>;

  private constructor(
    private readonly options: AmqpLinkOptions,
    private readonly model: RecoveringChannelModel,
  ) {
    this.ended = new Promise((resolve) => (this.signalEnd = resolve));
  }

  static async open(options: AmqpLinkOptions): Promise<AmqpLink> {
    const { address } = options;
    const forever = options.reconnect ? Number.POSITIVE_INFINITY : 0;
    // The set-up work runs inside the connection's recovery, which exists before the link does.
    const made: { link?: AmqpLink } = {};
    const connect: Options.Connect = {
      protocol: address.protocol,
      hostname: address.hostname,
      port: address.port,
      vhost: address.vhost,
      username: options.username,
      password: options.password,
      heartbeat: 10,
    };
    const model = await amqp.connect(connect, {
      clientProperties: { connection_name: options.name },
      timeout: 5000,
      recovery: {
        initialDelay: 250,
        maxDelay: 5000,
        maxRetries: forever,
        // A long-lived process also waits for a broker that is not up yet; a refused login ends it at once.
        initialMaxRetries: forever,
        waitForConnect: false,
        setup: async (connection: ChannelModel) => {
          if (made.link === undefined) throw new BusError("internal", "the link is not ready");
          await made.link.setUp(connection);
        },
      },
    });
    const link = new AmqpLink(options, model);
    made.link = link;
    link.watch();
    try {
      await model.waitForConnect();
    } catch (error) {
      throw link.failure(error);
    }
    return link;
  }

  /** The broker's address, for messages. */
  get where(): string {
    return this.options.address.url;
  }

  /** Registers work done on this connection now (when connected) and again on every new connection. */
  async onEveryConnection(setUp: SetUp): Promise<void> {
    this.setUps.push(setUp);
    if (this.current !== undefined) await setUp(this.current);
  }

  /** Calls `listener` each time the connection comes back after a loss. */
  onReconnect(listener: () => void): void {
    this.reconnectListeners.push(listener);
  }

  /** A channel on the current connection (waiting for one while the broker is away). */
  channel(): Promise<Channel> {
    return this.model.createChannel();
  }

  confirmChannel(): Promise<ConfirmChannel> {
    return this.model.createConfirmChannel();
  }

  /** Resolves when the link ends for good: closed by us (undefined) or its identity refused (the error). */
  closed(): Promise<Error | undefined> {
    return this.ended;
  }

  async close(): Promise<void> {
    this.closing = true;
    // When the broker closes the connection at the same moment (an account deleted), amqplib waits for an answer
    // to its own close that never comes: the connection is gone either way, so the wait is bounded.
    let timer: NodeJS.Timeout | undefined;
    const bounded = new Promise<void>((resolve) => (timer = setTimeout(resolve, 2000)));
    try {
      await Promise.race([this.model.close(), bounded]);
    } finally {
      clearTimeout(timer);
    }
    this.signalEnd(undefined);
  }

  private async setUp(connection: ChannelModel): Promise<void> {
    // amqplib's recovery listens to a new connection's errors only once this set-up is done, and an error event
    // nobody listens to ends the process: a connection reset while it is being set up (a broker taking thousands of
    // connections at once) would take the whole process down. Said here while setting up; the set-up then fails and
    // the recovery connects again. Once set up, the recovery passes its errors on to the link (`watch`).
    let settingUp = true;
    connection.on("error", (error: Error) => {
      // Said once for a run of attempts that fail, as `broker.connect_failed` is: a broker that resets every set-up
      // does not fill the log with one line per attempt.
      if (settingUp && !this.failing) {
        this.options.log?.warn("broker.connection_error", {
          broker: this.where,
          while: "setting up the connection",
          error: errorText(error),
        });
      }
    });
    writeTogether(connection);
    try {
      // By index: work registered while a reconnection is being set up is still done on it.
      for (let index = 0; index < this.setUps.length; index += 1) {
        const setUp = this.setUps[index];
        if (setUp !== undefined) await setUp(connection);
      }
    } finally {
      settingUp = false;
    }
    this.current = connection;
  }

  private watch(): void {
    const log = this.options.log;
    this.model.on("connect-failed", (error: Error) => {
      // Tried again and again until it connects (a set-up that failed, a broker that closed the connection as it
      // opened): said once for the run of failures, not at every attempt.
      if (this.failing || this.closing) return;
      this.failing = true;
      log?.warn("broker.connect_failed", {
        broker: this.where,
        error: errorText(error),
        note: "trying again until it connects",
      });
    });
    this.model.on("connect", () => {
      this.failing = false;
      this.connections += 1;
      if (this.connections > 1) {
        log?.info("broker.reconnected", { broker: this.where });
        for (const listener of this.reconnectListeners) listener();
      }
    });
    this.model.on("disconnect", (error: Error) => {
      this.current = undefined;
      if (!this.closing) log?.warn("broker.disconnected", { broker: this.where, error: errorText(error) });
    });
    this.model.on("error", (error: Error) => {
      log?.warn("broker.connection_error", { broker: this.where, error: errorText(error) });
    });
    this.model.on("reconnect-scheduled", ({ error }: { error: Error }) => {
      if (!isRefusedLogin(error)) return;
      // The account is gone (deleted at retirement, or never made): no amount of retrying brings it back.
      this.refusal = new BrokerRefusedIdentity(
        `the broker at ${this.where} refused this identity: ${error.message}`,
        {
          cause: error,
        },
      );
      const refusal = this.refusal;
      void this.model.close().then(() => this.signalEnd(refusal));
    });
    this.model.on("reconnect-failed", (error: Error) => this.signalEnd(asAmqpError(error, this.where)));
  }

  private failure(error: unknown): BusError {
    if (this.refusal !== undefined) return this.refusal;
    // A link that is not tried again (a join) takes a close in answer to its opening as the refusal it is: a
    // long-lived one keeps trying, as a broker still starting its vhosts answers so too.
    if (!this.options.reconnect && error instanceof Error && closedAtOpen.test(error.message)) {
      return new BrokerRefusedIdentity(
        `the broker at ${this.where} refused this account the vhost (it closed the connection as it opened)`,
        { cause: error },
      );
    }
    return asAmqpError(error, this.where);
  }
}

/**
 * amqplib hands its socket each frame apart — every publish, acknowledgement and heartbeat a write and a system call
 * of its own. Corked for the rest of the turn, what one turn writes (a batch's acknowledgement and receipts, a chunk
 * of declarations) goes out as one. amqplib 2.3 keeps the socket as its connection's `stream`; a model without one
 * is left as it is.
 */
export function writeTogether(model: ChannelModel): void {
  const socket = (model as unknown as { connection?: { stream?: unknown } }).connection?.stream;
  if (!(socket instanceof Socket)) return;
  const write = socket.write.bind(socket) as (...args: Parameters<Socket["write"]>) => boolean;
  let corked = false;
  const uncork = () => {
    corked = false;
    socket.uncork();
  };
  socket.write = ((...args: Parameters<Socket["write"]>): boolean => {
    if (!corked) {
      corked = true;
      socket.cork();
      process.nextTick(uncork);
    }
    return write(...args);
  }) as Socket["write"];
}

/**
 * amqplib's words for a broker that answered connection.open by closing the connection, without the broker's reply
 * code: RabbitMQ does so to an account that may not use the vhost (530 NOT_ALLOWED), such as a token's account whose
 * permissions are gone a moment before the account itself.
 */
const closedAtOpen = /^Expected ConnectionOpenOk; got <ConnectionClose /;

/** AMQP reply codes (amqplib's `code` on a closed channel or connection) that refuse who we are or what we did. */
const refusedCodes: ReadonlySet<number> = new Set([
  403, // ACCESS_REFUSED: a wrong password, a deleted account, a publish or consume outside the account's permissions
  530, // NOT_ALLOWED: no access to the vhost
]);

function isRefusedLogin(error: Error): boolean {
  const code = replyCodeOf(error);
  return code !== undefined && refusedCodes.has(code);
}

/**
 * The AMQP reply code of an amqplib error. A channel or connection closed by the broker carries it as `code`; a
 * refusal during the opening handshake (a wrong password, a deleted account) does not in amqplib 2.3, whose only
 * record of the broker's code is its "Handshake terminated by server: 403 (ACCESS-REFUSED) …" message.
 */
export function replyCodeOf(error: unknown): number | undefined {
  if (!(error instanceof Error)) return undefined;
  const code: unknown = (error as { code?: unknown }).code;
  if (typeof code === "number") return code;
  const handshake = /^Handshake terminated by server: (\d{3}) /.exec(error.message);
  return handshake?.[1] === undefined ? undefined : Number(handshake[1]);
}

/** Whether the socket never got through: Node's code, or amqplib's own connect timeout (which carries none). */
function isUnreachable(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code: unknown = (error as NodeJS.ErrnoException).code;
  return (
    (typeof code === "string" && unreachableSocketCodes.has(code)) || error.message === "connect ETIMEDOUT"
  );
}

/** The mesh's reading of an amqplib error: by the broker's reply code and Node's error code, not the text. */
export function asAmqpError(error: unknown, where: string): BusError {
  if (error instanceof BusError) return error;
  const message = error instanceof Error ? error.message : String(error);
  const replyCode = replyCodeOf(error);
  if (replyCode !== undefined && refusedCodes.has(replyCode)) {
    return new BrokerRefusedIdentity(`the broker at ${where} refused this: ${message}`, { cause: error });
  }
  if (isUnreachable(error)) {
    return new BusError("broker_unreachable", `cannot reach the broker at ${where}: ${message}`, {
      cause: error,
    });
  }
  return new BusError("broker", `the broker at ${where}: ${message}`, { cause: error });
}

/**
 * A confirm channel for publishing, made on first use and again after it closed (a refused publish closes the
 * channel; a lost connection closes them all). The broker's reason for a close is kept for the error it causes.
 */
export class PublishChannel {
  private channel: Promise<ConfirmChannel> | undefined;
  private lastError: Error | undefined;

  constructor(private readonly link: AmqpLink) {}

  async publish(
    exchange: string,
    routingKey: string,
    body: Uint8Array,
    options: Options.Publish,
  ): Promise<void> {
    let channel: ConfirmChannel;
    try {
      channel = await this.open();
    } catch (error) {
      this.channel = undefined;
      throw asAmqpError(error, this.link.where);
    }
    try {
      await new Promise<void>((resolve, reject) => {
        channel.publish(exchange, routingKey, Buffer.from(body), options, (error: unknown) =>
          error === null || error === undefined
            ? resolve()
            : reject(
                error instanceof Error ? error : new Error(`publish not confirmed: ${JSON.stringify(error)}`),
              ),
        );
      });
    } catch (error) {
      throw asAmqpError(this.lastError ?? error, this.link.where);
    }
  }

  async close(): Promise<void> {
    const channel = this.channel;
    this.channel = undefined;
    if (channel === undefined) return;
    const open = await channel;
    await open.close().catch((error: unknown) => {
      // Closed with its connection in the meantime: there is nothing left to close.
      if (!(error instanceof IllegalOperationError)) throw error;
      this.lastError = error;
    });
  }

  private open(): Promise<ConfirmChannel> {
    if (this.channel !== undefined) return this.channel;
    this.lastError = undefined;
    const opening = this.link.confirmChannel().then((channel) => {
      channel.on("error", (error: Error) => (this.lastError = error));
      channel.on("close", () => {
        if (this.channel === opening) this.channel = undefined;
      });
      return channel;
    });
    this.channel = opening;
    return opening;
  }
}
