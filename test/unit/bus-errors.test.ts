import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  AuthorizationError,
  ConnectionError,
  NoRespondersError,
  PermissionViolationError,
  RequestError,
  TimeoutError,
  UserAuthenticationExpiredError,
} from "@nats-io/transport-node";
import { asAmqpError } from "../../src/bus/amqp/link.js";
import { BrokerRefusedIdentity, BusError } from "../../src/bus/errors.js";
import { asBusError } from "../../src/bus/nats/connect.js";

function withCode<T extends string | number>(message: string, code: T): Error & { code: T } {
  return Object.assign(new Error(message), { code });
}

describe("driver errors are read by class and code, never by their text", () => {
  test("bus errors — NATS refusals of who we are are BrokerRefusedIdentity", () => {
    for (const error of [
      new AuthorizationError("Authorization Violation"),
      new UserAuthenticationExpiredError("User Authentication Expired"),
      new PermissionViolationError("Permissions Violation for Publish to x", "publish", "x"),
      // A request whose reply subscription was refused: the client's RequestError, the server's error as its cause.
      new RequestError("Permissions Violation for Subscription to x", {
        cause: new PermissionViolationError(
          "Permissions Violation for Subscription to x",
          "subscription",
          "x",
        ),
      }),
    ]) {
      const read = asBusError(error, "nats://here");
      assert.ok(read instanceof BrokerRefusedIdentity, error.name);
      assert.equal(read.code, "broker_refused_identity");
      assert.equal(read.cause, error);
    }
  });

  test("bus errors — NATS connection failures are broker_unreachable", () => {
    for (const error of [
      new ConnectionError("connection refused", { cause: withCode("connect ECONNREFUSED", "ECONNREFUSED") }),
      new TimeoutError(),
      withCode("getaddrinfo ENOTFOUND nowhere", "ENOTFOUND"),
    ]) {
      assert.equal(asBusError(error, "nats://here").code, "broker_unreachable", error.message);
    }
  });

  test("bus errors — a NATS error's text alone decides nothing", () => {
    for (const text of ["authorization timeout", "expired", "ECONNREFUSED", "no responders"]) {
      assert.equal(asBusError(new Error(text), "nats://here").code, "broker", text);
    }
    const request = new RequestError("no responders", { cause: new NoRespondersError("x") });
    assert.equal(request.isNoResponders(), true);
    const mesh = new BusError("timeout", "given");
    assert.equal(asBusError(mesh, "nats://here"), mesh);
  });

  test("bus errors — AMQP refusals by reply code: 403 and 530, also in a refused handshake", () => {
    for (const error of [
      withCode("Channel closed by server: 403 (ACCESS-REFUSED) with message …", 403),
      withCode("Connection closed: 530 (NOT-ALLOWED) with message …", 530),
      new Error(
        'Handshake terminated by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - Login was refused"',
      ),
    ]) {
      const read = asAmqpError(error, "amqp://here");
      assert.ok(read instanceof BrokerRefusedIdentity, error.message);
      assert.equal(read.cause, error);
    }
    assert.equal(
      asAmqpError(withCode("Connection closed: 320 (CONNECTION-FORCED)", 320), "amqp://here").code,
      "broker",
    );
    assert.equal(asAmqpError(new Error("ACCESS_REFUSED 403"), "amqp://here").code, "broker");
  });

  test("bus errors — AMQP sockets that never got through are broker_unreachable, by Node's code", () => {
    for (const code of ["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ETIMEDOUT"]) {
      assert.equal(asAmqpError(withCode(`connect ${code}`, code), "amqp://here").code, "broker_unreachable");
    }
    assert.equal(asAmqpError(new Error("connect ETIMEDOUT"), "amqp://here").code, "broker_unreachable");
    assert.equal(asAmqpError(new Error("ECONNREFUSED somewhere in a message"), "amqp://here").code, "broker");
  });
});
