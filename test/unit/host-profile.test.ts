import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { describe, test } from "node:test";
import { UsageError } from "../../src/errors.js";
import { machineProfile, parseLabel } from "../../src/host/profile.js";
import { parseEnrol } from "../../src/link/index.js";

void describe("machine profile", () => {
  void test("profile — carries the machine's facts, the labels given and its hostname", () => {
    const profile = machineProfile({ zone: "eu-west", "rack.example/row": "4" });
    assert.ok(Number.isInteger(profile.cpu) && profile.cpu >= 1);
    assert.ok(Number.isInteger(profile.memory_mb) && profile.memory_mb >= 1);
    assert.equal(profile.os, process.platform);
    assert.equal(profile.arch, process.arch);
    assert.deepEqual(profile.labels, { zone: "eu-west", "rack.example/row": "4", hostname: hostname() });
    assert.deepEqual(profile.roles, []);
    // The overlay only where WireGuard's tools are (the test set-up installs them).
    assert.deepEqual(profile.drivers.slice(0, 4), ["file", "user", "group", "service"]);
    assert.ok(profile.drivers.length === 4 || profile.drivers[4] === "overlay", profile.drivers.join(","));
  });

  void test("profile — an enrol message built with it is accepted by the contract", () => {
    const profile = machineProfile({ zone: "eu-west" });
    const enrol = parseEnrol({
      kind: "enrol",
      node: "web-1",
      token_id: "tok_0123456789ab",
      secret: randomBytes(32).toString("base64url"),
      keys: { signing: randomBytes(32).toString("base64"), overlay: randomBytes(32).toString("base64") },
      profile,
      agent_version: "0.1.0",
      sent_at: new Date().toISOString(),
    });
    assert.deepEqual(enrol.profile, profile);
  });

  void test("labels — key=value is read, and the value may hold '=' or be empty", () => {
    assert.deepEqual(parseLabel("zone=eu-west"), { key: "zone", value: "eu-west" });
    assert.deepEqual(parseLabel("app.example/tier=a=b"), { key: "app.example/tier", value: "a=b" });
    assert.deepEqual(parseLabel("spare="), { key: "spare", value: "" });
  });

  void test("labels — anything but key=value with a valid key is a usage error", () => {
    const refused = [
      "zone",
      "=eu",
      "_private=1",
      ".dot=1",
      "-dash=1",
      "bad key=1",
      "a-=1",
      `${"k".repeat(129)}=v`,
    ];
    for (const text of [...refused, `zone=${"v".repeat(1025)}`, "hostname=other"]) {
      assert.throws(
        () => parseLabel(text),
        (error: unknown) =>
          error instanceof UsageError && error.code === "usage" && /label/.test(error.message),
        text,
      );
    }
  });
});
