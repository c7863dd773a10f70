/**
 * A fresh RabbitMQ vhost per test run on the machine's broker (MESH_TEST_RABBITMQ, default
 * amqp://guest:guest@127.0.0.1:5672; management API MESH_TEST_RABBITMQ_API, default http://guest:guest@127.0.0.1:15672),
 * deleted afterwards with every account the mesh made for it.
 */
import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { RabbitManagement } from "../../src/bus/index.js";
import { MeshUsers } from "../../src/bus/amqp/users.js";

export const rabbitAdminUrl = process.env.MESH_TEST_RABBITMQ ?? "amqp://guest:guest@127.0.0.1:5672";
export const rabbitApiUrl = process.env.MESH_TEST_RABBITMQ_API ?? "http://guest:guest@127.0.0.1:15672";

export interface ScratchVhost {
  vhost: string;
  /** The broker URL with the administrator's credentials, as an operator gives it to `mesh serve`. */
  url: string;
  api: RabbitManagement;
  users: MeshUsers;
  drop(): Promise<void>;
}

export async function scratchVhost(): Promise<ScratchVhost> {
  const vhost = `mesh_test_${process.pid}_${randomBytes(4).toString("hex")}`;
  const api = new RabbitManagement(rabbitApiUrl);
  await api.ensureVhost(vhost);
  const admin = new URL(rabbitApiUrl);
  // The administrator may use the vhost too (test observers connect as it).
  await api.setPermissions(vhost, decodeURIComponent(admin.username), {
    configure: ".*",
    write: ".*",
    read: ".*",
    topic: { exchange: "mesh", write: ".*", read: ".*" },
  });
  const users = new MeshUsers(vhost);
  return {
    vhost,
    url: `${rabbitAdminUrl}/${encodeURIComponent(vhost)}`,
    api,
    users,
    drop: async () => {
      for (const user of await api.users()) {
        if (user.startsWith(`${users.prefix}.`)) await api.deleteUser(user);
      }
      await api.deleteVhost(vhost);
    },
  };
}

/** One GET on the management API as the administrator, for what RabbitManagement does not read (queue arguments). */
export async function managementGet<T>(path: string): Promise<{ status: number; body: T | undefined }> {
  const url = new URL(rabbitApiUrl);
  const authorization = `Basic ${Buffer.from(
    `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`,
  ).toString("base64")}`;
  const response = await fetch(`${url.origin}/api${path}`, {
    headers: { authorization },
    signal: AbortSignal.timeout(10_000),
  });
  if (response.status === 404) {
    await response.arrayBuffer();
    return { status: 404, body: undefined };
  }
  if (!response.ok) throw new Error(`GET /api${path}: ${response.status} ${await response.text()}`);
  return { status: response.status, body: (await response.json()) as T };
}

export interface ApiProxy {
  /** The management API URL through the proxy, with the administrator's credentials. */
  url: string;
  /** Ends every connection, answered or held, and stops listening. */
  close(): Promise<void>;
}

/**
 * A proxy in front of the machine's RabbitMQ management API: `intercept` may answer a call itself (or hold it, never
 * answering) by returning true; every other call is forwarded to the broker and its answer passed back.
 */
export async function startApiProxy(
  intercept: (request: http.IncomingMessage, response: http.ServerResponse) => boolean,
): Promise<ApiProxy> {
  const upstream = new URL(rabbitApiUrl);
  const server = http.createServer((request, response) => {
    if (intercept(request, response)) return;
    const forwarded = http.request(
      {
        host: upstream.hostname,
        port: upstream.port,
        method: request.method,
        path: request.url,
        headers: request.headers,
      },
      (answer) => {
        response.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(response);
      },
    );
    forwarded.on("error", (error) => response.destroy(error));
    request.pipe(forwarded);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = new URL(rabbitApiUrl);
  url.host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url: url.toString(),
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
