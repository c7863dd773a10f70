/**
 * The RabbitMQ management HTTP API, for what AMQP itself cannot do: users, their permissions on the mesh's vhost,
 * and the vhost. Every failure names the call and what the broker answered.
 */
import http from "node:http";
import https from "node:https";
import { setTimeout as delay } from "node:timers/promises";
import { z } from "zod";
import { BusError } from "../errors.js";
import { controlQueue, escapeRegex } from "../../link/index.js";
import type { RabbitPermissions } from "../../link/index.js";
import { controlQueueBacklogBytes } from "../../link/limits.js";

/** A whole answer of the management API: its status and its body, read to the end. */
interface Answer {
  status: number;
  ok: boolean;
  text: string;
}

/** How long one call may take before it counts as the API being unreachable. */
const callTimeoutMs = 10_000;
/**
 * Connections kept open to the API: a join makes several calls, and a new connection for each (TCP set-up on both
 * sides, a new handler process in the broker) cost more than the call. Bounded, because each is a file descriptor
 * of the broker's, which its AMQP connections need.
 */
const apiSockets = 16;
/**
 * Users deleted per bulk-delete call. The broker takes a bulk delete as one piece of work (~0.6 ms a user here, more
 * with connections to close): 10,000 in one call outlasted the call's timeout, so a sweep after a large fleet's
 * enrolment failed every time; 500 take a few hundred ms.
 */
const bulkDeleteMax = 500;
/**
 * How long deleting a vhost may take: the broker deletes every queue in it within the one call, and a vhost of
 * 9,800 node queues outlasted the 10 s every other call gets.
 */
const vhostDeleteTimeoutMs = 120_000;

/** How many times a call the broker failed inside (5xx) is made again, and the first pause; each pause is 4× the last. */
const serverErrorRetries = 3;
const serverErrorPauseDefaultMs = 150;

/** A call the API took and did not answer in its time. */
class NoAnswer extends Error {}

/**
 * What a call that got no answer suggests: refused, that nothing listens there (the plugin off); taken and then
 * dropped or left unanswered, that the broker is busy with it (deleting a vhost of thousands of users takes it many
 * minutes) and may have done part of it.
 */
function unansweredHint(error: unknown): string {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === "ECONNREFUSED") return " (is the rabbitmq_management plugin enabled?)";
  if (code === "ECONNRESET" || error instanceof NoAnswer)
    return " (the API took the call and gave no answer: the broker may be busy with it, and may have done part of it)";
  return "";
}

export class RabbitManagement {
  private readonly base: URL;
  private readonly agent: http.Agent;
  private readonly authorization: string;
  /** The API's address without its password, for messages. */
  readonly shown: string;

  constructor(
    apiUrl: string,
    /** Users deleted per bulk-delete call (the default suits every fleet; tests make it small). */
    private readonly usersPerDelete = bulkDeleteMax,
    /** The first pause before a call that failed inside the broker is made again (tests make it short). */
    private readonly serverErrorPauseMs = serverErrorPauseDefaultMs,
  ) {
    let url: URL;
    try {
      url = new URL(apiUrl);
    } catch (error) {
      throw new BusError("usage", `the RabbitMQ management API "${apiUrl}" is not a URL`, { cause: error });
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new BusError("usage", `the RabbitMQ management API must be http(s)://user:pass@host:15672`);
    }
    if (url.username === "") {
      throw new BusError(
        "usage",
        `the RabbitMQ management API URL names no user: http://user:pass@${url.host}`,
      );
    }
    this.authorization = `Basic ${Buffer.from(
      `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`,
    ).toString("base64")}`;
    url.username = "";
    url.password = "";
    this.base = new URL(`${url.origin}${url.pathname.replace(/\/$/, "")}/api`);
    this.shown = url.origin;
    // Idle connections closed well before the broker closes them (its own idle timeout), so a call rarely meets a
    // connection the broker is closing at that moment; one that does is made again (see `request`).
    const agentOptions = { keepAlive: true, maxSockets: apiSockets, timeout: 30_000 };
    this.agent = url.protocol === "https:" ? new https.Agent(agentOptions) : new http.Agent(agentOptions);
  }

  async ensureVhost(vhost: string): Promise<void> {
    await this.call("PUT", `/vhosts/${enc(vhost)}`, {});
  }

  /**
   * Creates or replaces a policy on the vhost: `definition` applies to the queues whose name matches `pattern`, also
   * those that already exist (queue arguments cannot change once a queue is declared; a policy can).
   */
  async putQueuePolicy(
    vhost: string,
    name: string,
    policy: { pattern: string; priority: number; definition: Readonly<Record<string, string | number>> },
  ): Promise<void> {
    await this.call("PUT", `/policies/${enc(vhost)}/${enc(name)}`, { ...policy, "apply-to": "queues" });
  }

  async deleteVhost(vhost: string): Promise<void> {
    await this.call("DELETE", `/vhosts/${enc(vhost)}`, undefined, {
      missingIsFine: true,
      timeoutMs: vhostDeleteTimeoutMs,
    });
  }

  /** Creates the user or sets its password; no tags, so it cannot use the management API itself. */
  async putUser(user: string, password: string): Promise<void> {
    await this.call("PUT", `/users/${enc(user)}`, { password, tags: "" });
  }

  /** Deletes a user, which also closes its connections. Returns whether there was one. */
  async deleteUser(user: string): Promise<boolean> {
    return this.call("DELETE", `/users/${enc(user)}`, undefined, { missingIsFine: true });
  }

  /**
   * Deletes many users, closing their connections, `usersPerDelete` to a call. The broker deletes a call's users in
   * the order given and stops at the first that no longer exists, naming it: those before it are gone, and the call
   * is made again with those after. Returns how many were deleted.
   */
  async deleteUsers(users: readonly string[]): Promise<number> {
    const distinct = [...new Set(users)];
    let deleted = 0;
    for (let start = 0; start < distinct.length; start += this.usersPerDelete) {
      deleted += await this.deleteSomeUsers(distinct.slice(start, start + this.usersPerDelete));
    }
    return deleted;
  }

  /** One bulk delete, made again past each user that no longer exists. */
  private async deleteSomeUsers(users: readonly string[]): Promise<number> {
    let rest = [...users];
    let deleted = 0;
    while (rest.length > 0) {
      const response = await this.request("POST", "/users/bulk-delete", { users: rest }, [400]);
      if (response.ok) return deleted + rest.length;
      const text = response.text;
      const refused = () =>
        `the RabbitMQ management API refused POST /users/bulk-delete: 400 ${text.slice(0, 300)}`;
      let answer: unknown;
      try {
        answer = JSON.parse(text);
      } catch (error) {
        throw new BusError("broker", refused(), { cause: error });
      }
      const missing = missingUserIn(answer);
      const at = missing === undefined ? -1 : rest.indexOf(missing);
      if (at < 0) throw new BusError("broker", refused());
      deleted += at;
      rest = rest.slice(at + 1);
    }
    return deleted;
  }

  /** The names of every user on the broker. */
  async users(): Promise<string[]> {
    const response = await this.request("GET", "/users?columns=name");
    const body = answerOf(response, "GET /users", usersAnswer);
    return body.map((user) => user.name);
  }

  async setPermissions(vhost: string, user: string, permissions: RabbitPermissions): Promise<void> {
    const { configure, write, read, topic } = permissions;
    await Promise.all([
      this.call("PUT", `/permissions/${enc(vhost)}/${enc(user)}`, { configure, write, read }),
      this.call("PUT", `/topic-permissions/${enc(vhost)}/${enc(user)}`, topic),
    ]);
  }

  async putQueue(vhost: string, queue: string): Promise<void> {
    await this.call("PUT", `/queues/${enc(vhost)}/${enc(queue)}`, { durable: true, auto_delete: false });
  }

  async deleteQueue(vhost: string, queue: string): Promise<boolean> {
    return this.call("DELETE", `/queues/${enc(vhost)}/${enc(queue)}`, undefined, { missingIsFine: true });
  }

  async queue(
    vhost: string,
    queue: string,
  ): Promise<{ consumers: number; messages: number; active_consumer?: string } | undefined> {
    const response = await this.request("GET", `/queues/${enc(vhost)}/${enc(queue)}`, undefined, [404]);
    if (response.status === 404) return undefined;
    const body = answerOf(response, "GET /queues", queueAnswer);
    return {
      consumers: body.consumers ?? 0,
      messages: body.messages ?? 0,
      // The broker answers null while no consumer is active.
      ...(typeof body.single_active_consumer_tag === "string"
        ? { active_consumer: body.single_active_consumer_tag }
        : {}),
    };
  }

  /** The connections of one user: what deleting a user closes. */
  async connectionsOf(user: string): Promise<number> {
    const response = await this.request("GET", "/connections?columns=user");
    const body = answerOf(response, "GET /connections", connectionsAnswer);
    return body.filter((connection) => connection.user === user).length;
  }

  /** The connections open on a vhost, by name and user. The broker lists a new connection some seconds late. */
  async connectionsIn(vhost: string): Promise<{ name: string; user: string }[]> {
    const response = await this.request("GET", `/vhosts/${enc(vhost)}/connections?columns=name,user`);
    const body = answerOf(response, "GET /vhosts/…/connections", connectionsAnswer);
    return body.flatMap((connection) =>
      // A connection still opening is listed before its name and user are known: it is not one to report yet.
      connection.name !== undefined && connection.user !== undefined
        ? [{ name: connection.name, user: connection.user }]
        : [],
    );
  }

  /** Closes one connection, as a broker restart or a network cut would. */
  async closeConnection(name: string): Promise<boolean> {
    return this.call("DELETE", `/connections/${enc(name)}`, undefined, { missingIsFine: true });
  }

  private async call(
    method: string,
    path: string,
    body: unknown,
    options: { missingIsFine?: boolean; timeoutMs?: number } = {},
  ): Promise<boolean> {
    const response = await this.request(
      method,
      path,
      body,
      options.missingIsFine === true ? [404] : [],
      options.timeoutMs,
    );
    return response.status !== 404;
  }

  /** Closes the connections kept open to the API (a process that is done with it need not wait for them). */
  close(): void {
    this.agent.destroy();
  }

  /**
   * One call; a status outside 2xx is an error unless `answers` lists it as an answer for the caller to read. An
   * answer of 5xx is the broker failing inside the call, not refusing it (a listing of users crashed with an empty
   * 500 while other clients created and deleted users): the call is made again after a pause, up to
   * `serverErrorRetries` times, and the last answer is the error. Every call here may be made twice.
   */
  private async request(
    method: string,
    path: string,
    body?: unknown,
    answers: readonly number[] = [],
    timeoutMs = callTimeoutMs,
  ): Promise<Answer> {
    const text = body === undefined ? undefined : JSON.stringify(body);
    let response = await this.attempt(method, path, text, timeoutMs);
    for (let retry = 0; response.status >= 500 && retry < serverErrorRetries; retry += 1) {
      await delay(this.serverErrorPauseMs * 4 ** retry);
      response = await this.attempt(method, path, text, timeoutMs);
    }
    if (response.ok || answers.includes(response.status)) return response;
    const tried = response.status >= 500 ? ` (${serverErrorRetries + 1} tries)` : "";
    throw new BusError(
      response.status === 401 ? "broker_refused_identity" : "broker",
      `the RabbitMQ management API refused ${method} ${path.split("?")[0]}: ${response.status}${tried} ` +
        response.text.slice(0, 300),
    );
  }

  /** One try of a call: its answer, whatever the status; no answer at all is the API being unreachable. */
  private async attempt(
    method: string,
    path: string,
    body: string | undefined,
    timeoutMs: number,
  ): Promise<Answer> {
    try {
      return await this.send(method, path, body, timeoutMs);
    } catch (error) {
      throw new BusError(
        "broker_unreachable",
        `cannot reach the RabbitMQ management API at ${this.shown} (${method} ${path.split("?")[0]}): ` +
          `${(error as Error).message}${unansweredHint(error)}`,
        { cause: error },
      );
    }
  }

  /**
   * Sends one request on a kept connection and reads its whole answer. A kept connection the broker closed just as
   * it was reused fails before any answer: the call is made once more on a new one (every call here is idempotent).
   */
  private send(
    method: string,
    path: string,
    body: string | undefined,
    timeoutMs: number,
    retried = false,
  ): Promise<Answer> {
    const url = new URL(`${this.base.pathname}${path}`, this.base);
    const client = url.protocol === "https:" ? https : http;
    return new Promise<Answer>((resolve, reject) => {
      const request = client.request(
        url,
        {
          method,
          agent: this.agent,
          headers: {
            authorization: this.authorization,
            "content-type": "application/json",
            ...(body === undefined ? {} : { "content-length": Buffer.byteLength(body) }),
          },
        },
        (response) => {
          const chunks: Buffer[] = [];
          response.on("data", (chunk: Buffer) => chunks.push(chunk));
          response.on("error", (error) => {
            clearTimeout(timer);
            reject(error);
          });
          response.on("end", () => {
            clearTimeout(timer);
            const status = response.statusCode ?? 0;
            resolve({
              status,
              ok: status >= 200 && status < 300,
              text: Buffer.concat(chunks).toString("utf8"),
            });
          });
        },
      );
      const timer = setTimeout(
        () => request.destroy(new NoAnswer(`no answer within ${timeoutMs} ms`)),
        timeoutMs,
      );
      request.on("error", (error: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        if (request.reusedSocket && error.code === "ECONNRESET" && !retried) {
          resolve(this.send(method, path, body, timeoutMs, true));
          return;
        }
        reject(error);
      });
      request.end(body);
    });
  }
}

/** The policy that bounds the control queue; its name says whose it is on a vhost an operator may also use. */
export const controlQueuePolicy = "mesh-control-queue-bounds";

/**
 * Bounds what the control queue holds, for a queue already declared as for one to come. RabbitMQ 3.10 has no
 * per-vhost, per-user or per-queue limit on one message's size (only the server-wide `max_message_size`, 128 MiB by
 * default), so the control plane bounds the queue's total instead, and a publish that would go past it is refused
 * (nacked to the node, whose agent sends its report again later) rather than pushing out what other nodes sent
 * before it. A single message larger than the bound is refused even by an empty queue.
 */
export async function boundControlQueue(
  management: RabbitManagement,
  vhost: string,
  /** The bound; tests give a small one so as not to fill gigabytes to reach it. */
  bytes: number = controlQueueBacklogBytes,
): Promise<void> {
  await management.putQueuePolicy(vhost, controlQueuePolicy, {
    pattern: `^${escapeRegex(controlQueue)}$`,
    priority: 0,
    definition: { "max-length-bytes": bytes, overflow: "reject-publish" },
  });
}

/** What the management API answers, as far as the mesh reads it (it sends much more; the rest is ignored). */
const usersAnswer = z.array(z.object({ name: z.string() }));
const queueAnswer = z.object({
  consumers: z.number().int().nonnegative().optional(),
  messages: z.number().int().nonnegative().optional(),
  single_active_consumer_tag: z.string().nullish(),
});
const connectionsAnswer = z.array(z.object({ name: z.string().optional(), user: z.string().optional() }));
/** A bulk delete that stopped at a user that no longer exists: `{"reason": ["no_such_user", name]}`. */
const missingUserAnswer = z.object({ reason: z.tuple([z.literal("no_such_user"), z.string()]) });

/** The answer's body, checked against what the mesh reads from it; an answer of another shape names the call. */
function answerOf<T>(response: Answer, call: string, schema: z.ZodType<T>): T {
  const text = response.text;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new BusError("broker", `the RabbitMQ management API's answer to ${call} is not JSON`, {
      cause: error,
    });
  }
  const result = schema.safeParse(value);
  if (!result.success) {
    const issue = result.error.issues[0];
    const where = issue === undefined || issue.path.length === 0 ? "" : `${issue.path.join(".")}: `;
    throw new BusError(
      "broker",
      `the RabbitMQ management API's answer to ${call} is not what the mesh reads: ${where}${issue?.message ?? "invalid"}`,
    );
  }
  return result.data;
}

/** The user a bulk delete stopped at, or undefined when the broker refused it for another reason. */
function missingUserIn(answer: unknown): string | undefined {
  const result = missingUserAnswer.safeParse(answer);
  return result.success ? result.data.reason[1] : undefined;
}

function enc(part: string): string {
  return encodeURIComponent(part);
}
