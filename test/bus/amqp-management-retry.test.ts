/**
 * The management API failing inside a call (5xx): the call is made again and the broker's real answer is read; a
 * broker that keeps failing is an error naming the status and the tries; a refusal (4xx) is never made again. The
 * broker is the machine's RabbitMQ; a proxy in front of its API answers an empty 500 (what a crashed handler
 * answers) or drops the call unanswered for as many calls as a test asks, and forwards the rest. A call dropped
 * unanswered, and an address where nothing listens, each say what they suggest.
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { BusError } from "../../src/bus/index.js";
import { RabbitManagement } from "../../src/bus/amqp/management.js";
import type { ApiProxy } from "../support/rabbit.js";
import { rabbitApiUrl, startApiProxy } from "../support/rabbit.js";

describe("RabbitMQ management calls the broker failed inside", () => {
  const upstream = new URL(rabbitApiUrl);
  let proxy: ApiProxy | undefined;
  let failNext = 0;
  let hangUpNext = 0;
  const seen: string[] = [];
  let viaProxy: string;

  before(async () => {
    proxy = await startApiProxy((request, response) => {
      seen.push(`${request.method} ${request.url?.split("?")[0]}`);
      if (hangUpNext > 0) {
        hangUpNext -= 1;
        // Taken and dropped without an answer, as the broker's API does with a call it is still busy with.
        request.socket.destroy();
        return true;
      }
      if (failNext <= 0) return false;
      failNext -= 1;
      request.resume();
      response.writeHead(500, { "content-length": 0 }).end();
      return true;
    });
    viaProxy = proxy.url;
  });
  after(async () => {
    await proxy?.close();
  });

  test("management — a call the broker failed inside is made again, and the broker's answer is read", async () => {
    const api = new RabbitManagement(viaProxy, undefined, 5);
    try {
      seen.length = 0;
      failNext = 2;
      const users = await api.users();
      assert.ok(
        users.includes(decodeURIComponent(upstream.username)),
        "the real listing names the administrator",
      );
      assert.deepEqual(seen, ["GET /api/users", "GET /api/users", "GET /api/users"]);
    } finally {
      api.close();
    }
  });

  test("management — a broker that keeps failing is an error naming the status and the tries", async () => {
    const api = new RabbitManagement(viaProxy, undefined, 5);
    try {
      seen.length = 0;
      failNext = 100;
      await assert.rejects(api.users(), (error: unknown) => {
        assert.ok(error instanceof BusError);
        assert.equal(error.code, "broker");
        assert.match(error.message, /refused GET \/users: 500 \(4 tries\)/);
        return true;
      });
      assert.equal(seen.length, 4);
    } finally {
      failNext = 0;
      api.close();
    }
  });

  test("management — a refusal is not made again", async () => {
    const api = new RabbitManagement(viaProxy, undefined, 5);
    try {
      seen.length = 0;
      await assert.rejects(api.putQueue(`mesh_no_such_vhost_${process.pid}`, "q"), (error: unknown) => {
        assert.ok(error instanceof BusError);
        assert.match(error.message, /refused PUT \/queues\/.*: 404 .*vhost_not_found/);
        return true;
      });
      assert.equal(seen.length, 1);
    } finally {
      api.close();
    }
  });
  test("management — a call dropped unanswered: the broker may be busy with it, not the API off", async () => {
    const api = new RabbitManagement(viaProxy, undefined, 5);
    try {
      seen.length = 0;
      hangUpNext = 2;
      await assert.rejects(api.users(), (error: unknown) => {
        assert.ok(error instanceof BusError);
        assert.equal(error.code, "broker_unreachable");
        assert.match(error.message, /socket hang up .*took the call and gave no answer/);
        assert.doesNotMatch(error.message, /plugin/);
        return true;
      });
      assert.ok(seen.length >= 1 && seen.length <= 2, seen.join(", "));
    } finally {
      hangUpNext = 0;
      api.close();
    }
  });

  test("management — nothing listening at the address: the error asks whether the plugin is on", async () => {
    const closed = http.createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const url = new URL(rabbitApiUrl);
    url.host = `127.0.0.1:${(closed.address() as AddressInfo).port}`;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const api = new RabbitManagement(url.toString(), undefined, 5);
    try {
      await assert.rejects(api.users(), (error: unknown) => {
        assert.ok(error instanceof BusError);
        assert.equal(error.code, "broker_unreachable");
        assert.match(error.message, /ECONNREFUSED.*is the rabbitmq_management plugin enabled\?/);
        return true;
      });
    } finally {
      api.close();
    }
  });
});
