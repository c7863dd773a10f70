import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";

import {
  ContractError,
  assertNodeName,
  controlQueue,
  controlQueueKinds,
  controlRoutingKey,
  controlSubject,
  declarationSubject,
  eventRoutingKey,
  eventSubject,
  inboxPrefix,
  isNodeName,
  mayPublish,
  meshExchange,
  natsPermissions,
  nodeOfSubject,
  nodeQueue,
  nodeSubjects,
  publishedKinds,
  rabbitPermissions,
  readControlSubject,
  roles,
  writersTable,
} from "../../src/link/index.js";
import type { PublishedKind, Role, WritersTable } from "../../src/link/index.js";

/** NATS subject matching: `*` is one token, `>` one or more trailing tokens. */
function subjectAllowed(pattern: string, subject: string): boolean {
  const wanted = pattern.split(".");
  const given = subject.split(".");
  for (let index = 0; index < wanted.length; index += 1) {
    const token = wanted[index];
    if (token === ">") return given.length > index;
    if (index >= given.length || (token !== "*" && token !== given[index])) return false;
  }
  return wanted.length === given.length;
}

const anyAllows = (patterns: readonly string[], subject: string) =>
  patterns.some((pattern) => subjectAllowed(pattern, subject));

/** RabbitMQ matches the whole resource name against the regex. */
const regexAllows = (pattern: string, name: string) => new RegExp(pattern).test(name);

function assertContractError(action: () => unknown, part: string): void {
  assert.throws(action, (error: unknown) => error instanceof ContractError && error.reason.includes(part));
}

/** Every subject a message to or from `node` can travel on. */
function subjectsOf(node: string): string[] {
  return [
    ...controlQueueKinds.map((kind) => controlSubject(kind, node)),
    declarationSubject(node),
    `${inboxPrefix(node)}.Zx81.1`,
  ];
}

const nodeName = fc.stringMatching(/^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/);
/** Two distinct names, often one a prefix of the other, where a loose pattern would leak. */
const twoNodes = fc
  .oneof(
    fc.tuple(nodeName, nodeName),
    nodeName.chain((name) =>
      fc.tuple(fc.constant(name), fc.constantFrom(`${name}0`, `${name}-x`, `x${name}`)),
    ),
  )
  .filter(([a, b]) => a !== b && isNodeName(b));

void describe("link names", () => {
  void test("names — node names are DNS labels", () => {
    for (const good of ["a", "web-1", "0", "a".repeat(63), "x-y-z"])
      assert.equal(isNodeName(good), true, good);
    for (const bad of ["", "-a", "a-", "Web", "a_b", "a.b", "a*", "a>", "a".repeat(64), " a", 7]) {
      assert.equal(isNodeName(bad), false, String(bad));
    }
  });

  void test("names — assertNodeName says what is wrong", () => {
    assertContractError(() => assertNodeName(""), "must not be empty");
    assertContractError(() => assertNodeName("a".repeat(64)), "at most 63");
    assertContractError(() => assertNodeName("web.1"), "only a-z, 0-9 and '-'");
    assertContractError(() => assertNodeName("web-"), "must not start or end with '-'");
    assertContractError(() => assertNodeName(undefined), "expected a string");
    assert.doesNotThrow(() => assertNodeName("web-1"));
  });

  void test("names — NATS subjects of one node", () => {
    assert.equal(controlSubject("enrol", "web-1"), "mesh.enrol.web-1");
    assert.equal(controlSubject("report", "web-1"), "mesh.report.web-1");
    assert.equal(controlSubject("alive", "web-1"), "mesh.alive.web-1");
    assert.equal(declarationSubject("web-1"), "node.web-1.declaration");
    assert.equal(inboxPrefix("web-1"), "node.web-1.reply");
    assert.equal(nodeSubjects("web-1"), "node.web-1.>");
    assert.equal(eventSubject("node.enrolled"), "mesh.event.node.enrolled");
    assertContractError(() => declarationSubject("*"), "node name");
    assertContractError(() => eventSubject("a.>"), "event kind");
  });

  void test("names — RabbitMQ exchange, routing keys and queues", () => {
    assert.equal(meshExchange, "mesh");
    assert.equal(controlQueue, "control");
    assert.deepEqual(
      controlQueueKinds.map((kind) => controlRoutingKey(kind)),
      ["enrol", "report", "alive"],
    );
    assert.equal(nodeQueue("web-1"), "node.web-1");
    assert.equal(eventRoutingKey("lease.taken"), "event.lease.taken");
    assertContractError(() => nodeQueue("web_1"), "node name");
  });

  void test("names — the node of a node-published subject, or undefined", () => {
    assert.equal(nodeOfSubject("mesh.report.web-1"), "web-1");
    assert.equal(nodeOfSubject("mesh.alive.web-1", "alive"), "web-1");
    assert.equal(nodeOfSubject("mesh.alive.web-1", "report"), undefined);
    assert.deepEqual(readControlSubject("mesh.enrol.db-2"), { kind: "enrol", node: "db-2" });
    for (const other of [
      "mesh.event.x",
      "mesh.report",
      "mesh.report.web-1.x",
      "node.web-1.declaration",
      "mesh.report.Web",
    ]) {
      assert.equal(nodeOfSubject(other), undefined, other);
    }
  });

  void test("names — property: a node's subjects read back to that node", () => {
    fc.assert(
      fc.property(nodeName, fc.constantFrom(...controlQueueKinds), (node, kind) => {
        assert.deepEqual(readControlSubject(controlSubject(kind, node)), { kind, node });
      }),
      { numRuns: 300 },
    );
  });
});

void describe("link writers", () => {
  void test("writers — a node publishes exactly enrol (with its token), report and alive", () => {
    const nodeSide = new Set([...writersTable.token.publishes, ...writersTable.node.publishes]);
    assert.deepEqual([...nodeSide].sort(), ["alive", "enrol", "report"]);
    // What a node sends is exactly what lands in the control queue.
    assert.deepEqual([...nodeSide].sort(), [...controlQueueKinds].sort());
    assert.equal(mayPublish("node", "report"), true);
    assert.equal(mayPublish("node", "declaration_envelope"), false);
    assert.equal(mayPublish("token", "report"), false);
    assert.deepEqual(
      publishedKinds.filter((kind) => mayPublish("control", kind)),
      ["enrol_reply", "declaration_envelope", "receipt", "event"],
    );
  });

  void test("writers — token permissions on NATS are exactly its enrol subject and its replies", () => {
    assert.deepEqual(natsPermissions("token", "web-1"), {
      pub: { allow: ["mesh.enrol.web-1"] },
      sub: { allow: ["node.web-1.reply.>"] },
    });
  });

  void test("writers — node permissions on NATS are exactly its report and alive subjects and its own space", () => {
    assert.deepEqual(natsPermissions("node", "web-1"), {
      pub: { allow: ["mesh.report.web-1", "mesh.alive.web-1"] },
      sub: { allow: ["node.web-1.>"] },
    });
  });

  void test("writers — token permissions on RabbitMQ are exactly as specified", () => {
    assert.deepEqual(rabbitPermissions("token", "web-1"), {
      configure: "^$",
      write: "^mesh$",
      read: "^$",
      topic: { exchange: "mesh", write: "^enrol$", read: "^$" },
    });
  });

  void test("writers — node permissions on RabbitMQ are exactly as specified", () => {
    assert.deepEqual(rabbitPermissions("node", "web-1"), {
      configure: "^$",
      write: "^mesh$",
      read: "^node\\.web-1$",
      topic: { exchange: "mesh", write: "^(report|alive)$", read: "^$" },
    });
  });

  void test("writers — control permissions span the fleet and cover what it sends, reads and sets up", () => {
    const nats = natsPermissions("control");
    for (const subject of [
      declarationSubject("web-1"),
      `${inboxPrefix("web-1")}.abc`,
      eventSubject("lease.taken"),
    ]) {
      assert.ok(anyAllows(nats.pub.allow, subject), subject);
    }
    assert.ok(
      !anyAllows(nats.pub.allow, controlSubject("report", "web-1")),
      "control never speaks for a node",
    );
    for (const kind of controlQueueKinds) assert.ok(anyAllows(nats.sub.allow, controlSubject(kind, "web-1")));
    assert.ok(nats.pub.allow.includes("$JS.API.>") && nats.pub.allow.includes("$KV.>"));

    const rabbit = rabbitPermissions("control");
    for (const name of ["mesh", "control", "node.web-1"])
      assert.ok(regexAllows(rabbit.configure, name), name);
    for (const name of ["mesh", "amq.default", "control"]) assert.ok(regexAllows(rabbit.write, name), name);
    assert.ok(regexAllows(rabbit.read, "control"));
    assert.ok(!regexAllows(rabbit.read, "node.web-1"), "control never consumes a node's queue");
    assert.ok(regexAllows(rabbit.topic.write, eventRoutingKey("node.enrolled")));
    assert.ok(!regexAllows(rabbit.topic.write, "report"));
  });

  void test("writers — node-scoped roles need a valid node name; control takes none", () => {
    for (const role of ["token", "node"] as const) {
      assertContractError(() => natsPermissions(role), "need the node's name");
      assertContractError(() => rabbitPermissions(role), "need the node's name");
      assertContractError(() => natsPermissions(role, "web.*"), "node name");
      assertContractError(() => rabbitPermissions(role, "Web-1"), "node name");
    }
    assertContractError(() => natsPermissions("control", "web-1"), "take no node name");
    assertContractError(() => rabbitPermissions("control", "web-1"), "take no node name");
  });

  void test("writers — property: a node's or token's permissions never reach another node", () => {
    fc.assert(
      fc.property(twoNodes, fc.constantFrom<Role>("token", "node"), ([mine, theirs], role) => {
        const nats = natsPermissions(role, mine);
        for (const subject of subjectsOf(theirs)) {
          assert.ok(!anyAllows(nats.pub.allow, subject), `${role} ${mine} may publish ${subject}`);
          assert.ok(!anyAllows(nats.sub.allow, subject), `${role} ${mine} may read ${subject}`);
        }
        assert.ok(anyAllows(nats.sub.allow, `${inboxPrefix(mine)}.abc`), "its own replies stay readable");
        const rabbit = rabbitPermissions(role, mine);
        assert.ok(
          !regexAllows(rabbit.read, nodeQueue(theirs)),
          `${role} ${mine} may read ${nodeQueue(theirs)}`,
        );
        // A node reads its own queue; a token reads no queue at all (its answer comes by direct reply-to).
        assert.equal(regexAllows(rabbit.read, nodeQueue(mine)), role === "node");
        assert.equal(rabbit.configure, "^$");
      }),
      { numRuns: 500 },
    );
  });

  void test("writers — everything published to a node is readable by that node and nobody else's identity", () => {
    const sentToNode = [declarationSubject("web-1"), `${inboxPrefix("web-1")}.abc`];
    for (const subject of sentToNode) {
      assert.ok(anyAllows(natsPermissions("node", "web-1").sub.allow, subject), subject);
      assert.ok(!anyAllows(natsPermissions("node", "web-2").sub.allow, subject), subject);
    }
  });

  /** The subject each kind is published on for node `web-1`, as the contract states it. */
  const subjectOfKind: Record<PublishedKind, string> = {
    enrol: "mesh.enrol.web-1",
    report: "mesh.report.web-1",
    alive: "mesh.alive.web-1",
    enrol_reply: "node.web-1.reply.>",
    declaration_envelope: "node.web-1.declaration",
    receipt: "node.web-1.receipt",
    event: "mesh.event.>",
  };

  void test("writers — property: compiled publish rights are the table's kinds and nothing else", () => {
    fc.assert(
      fc.property(fc.subarray([...publishedKinds]), fc.constantFrom<Role>("token", "node"), (kinds, role) => {
        const variant: WritersTable = {
          ...writersTable,
          [role]: { ...writersTable[role], publishes: kinds },
        };
        assert.deepEqual(
          natsPermissions(role, "web-1", variant).pub.allow,
          kinds.map((kind) => subjectOfKind[kind]),
        );
        const keys = kinds.filter((kind) => (controlQueueKinds as readonly string[]).includes(kind));
        const topicWrite = rabbitPermissions(role, "web-1", variant).topic.write;
        for (const kind of controlQueueKinds)
          assert.equal(regexAllows(topicWrite, kind), keys.includes(kind), kind);
      }),
      { numRuns: 300 },
    );
  });

  void test("writers — changing only a row's reads changes only what that role reads", () => {
    const variant: WritersTable = {
      ...writersTable,
      node: { ...writersTable.node, reads: ["node_replies"] },
    };
    const compiled = natsPermissions("node", "web-1", variant);
    assert.deepEqual(compiled.sub.allow, ["node.web-1.reply.>"]);
    assert.deepEqual(compiled.pub, natsPermissions("node", "web-1").pub);
    const controlReadsReplies: WritersTable = {
      ...writersTable,
      token: { ...writersTable.token, reads: ["control_queue"] },
    };
    assert.deepEqual(natsPermissions("token", "web-1", controlReadsReplies).sub.allow, [
      "mesh.enrol.web-1",
      "mesh.report.web-1",
      "mesh.alive.web-1",
    ]);
    assert.equal(rabbitPermissions("token", "web-1", controlReadsReplies).read, "^control$");
  });

  void test("writers — only a role that sets up the broker gets JetStream and configure rights", () => {
    for (const role of roles) {
      const nats = natsPermissions(role, role === "control" ? undefined : "web-1");
      const rabbit = rabbitPermissions(role, role === "control" ? undefined : "web-1");
      const setsUp = writersTable[role].managesBroker;
      assert.equal(nats.pub.allow.includes("$JS.API.>"), setsUp, role);
      assert.equal(rabbit.configure !== "^$", setsUp, role);
    }
  });

  void test("writers — the lab role acts for each node of its group as that node may, and for no other", () => {
    fc.assert(
      fc.property(fc.uniqueArray(nodeName, { minLength: 1, maxLength: 5 }), nodeName, (group, outsider) => {
        fc.pre(!group.includes(outsider));
        const lab = natsPermissions("lab", group);
        for (const member of group) {
          const node = natsPermissions("node", member);
          for (const pattern of node.pub.allow) assert.ok(lab.pub.allow.includes(pattern), pattern);
          for (const pattern of node.sub.allow) assert.ok(lab.sub.allow.includes(pattern), pattern);
        }
        for (const subject of subjectsOf(outsider)) {
          assert.ok(!anyAllows(lab.pub.allow, subject), `lab may publish ${subject}`);
          assert.ok(!anyAllows(lab.sub.allow, subject), `lab may read ${subject}`);
        }
        assert.ok(!lab.pub.allow.some((pattern) => pattern.includes("*") || pattern.startsWith("$")));
      }),
    );
    assertContractError(() => natsPermissions("lab"), "need the node's name");
    assertContractError(() => natsPermissions("lab", []), "need the node's name");
    assertContractError(() => natsPermissions("node", ["web-1", "web-2"]), "one node, not a list");
    assertContractError(() => rabbitPermissions("lab", ["web-1", "web-2"]), "exactly one node");
  });

  void test("writers — node names are regex-escaped in RabbitMQ permissions", () => {
    // A dot in a pattern would match any character; the escaped one matches only the name itself.
    const read = rabbitPermissions("node", "web-1").read;
    assert.ok(!regexAllows(read, "nodeXweb-1"));
    assert.ok(regexAllows(read, "node.web-1"));
  });
});
