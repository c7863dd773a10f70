import assert from "node:assert/strict";
import { hostname } from "node:os";
import { describe, test } from "node:test";
import fc from "fast-check";
import { UsageError } from "../../src/errors.js";
import { machineProfile } from "../../src/host/profile.js";
import type { ProfileSet } from "../../src/lab/profiles.js";
import {
  assignProfileSets,
  labJoinProfile,
  labJoinProfiles,
  maxProfileWeight,
  parseProfileFile,
} from "../../src/lab/profiles.js";
import { parseEnrol } from "../../src/link/index.js";

/** The UsageError `parseProfileFile` throws for `text`, for its message to be read. */
function refusal(text: string, fileName = "profiles.yaml"): string {
  try {
    parseProfileFile(text, fileName);
  } catch (error) {
    assert.ok(error instanceof UsageError, `expected a UsageError, got ${String(error)}`);
    assert.equal(error.code, "usage");
    return error.message;
  }
  assert.fail(`${JSON.stringify(text)} was accepted`);
}

void describe("lab profiles", () => {
  void test("profile file — the README's example reads as written, in YAML and in JSON", () => {
    const yaml =
      "[{labels: {role: web}, cpu: 4, memory_mb: 8192}, {labels: {role: db}, cpu: 8, memory_mb: 32768}]";
    const expected = [
      { labels: { role: "web" }, cpu: 4, memory_mb: 8192 },
      { labels: { role: "db" }, cpu: 8, memory_mb: 32768 },
    ];
    assert.deepEqual(parseProfileFile(yaml, "profiles.yaml"), expected);
    assert.deepEqual(parseProfileFile(JSON.stringify(expected), "profiles.json"), expected);
    const block =
      "- labels: {zone: eu-west, app.example/tier: front}\n  drivers: [file, docker]\n  weight: 3\n- {}\n";
    assert.deepEqual(parseProfileFile(block, "p.yaml"), [
      { labels: { zone: "eu-west", "app.example/tier": "front" }, drivers: ["file", "docker"], weight: 3 },
      {},
    ]);
  });

  void test("profile file — each bad file is a usage error naming the file, the line and the place", () => {
    const cases: [string, RegExp][] = [
      ["", /^profiles\.yaml: expected a list of profile sets/],
      ["{labels: {role: web}}", /^profiles\.yaml line 1: expected a list of profile sets/],
      ["[]", /^profiles\.yaml line 1: the list is empty: give at least one profile set$/],
      ["- cpu: 4\n- cpu: 0\n", /^profiles\.yaml line 2, \[1\]\.cpu: expected at least 1 CPU$/],
      ["- cpu: 1.5\n", /^profiles\.yaml line 1, \[0\]\.cpu: expected a whole number of CPUs$/],
      ["- memory_mb: lots\n", /^profiles\.yaml line 1, \[0\]\.memory_mb: expected a whole number of MiB$/],
      ["- cpu: 2\n  roles: [web]\n", /^profiles\.yaml line 2, \[0\]\.roles: Unrecognized key: "roles"$/],
      [
        "- labels:\n    bad key: x\n",
        /^profiles\.yaml line 2, \[0\]\.labels\["bad key"\]: expected a label key/,
      ],
      [
        "- labels: {hostname: other}\n",
        /^profiles\.yaml line 1, \[0\]\.labels: "hostname" is set from the machine/,
      ],
      ["- labels: {role: [web]}\n", /^profiles\.yaml line 1, \[0\]\.labels\.role: /],
      ["- drivers: [file, '']\n", /^profiles\.yaml line 1, \[0\]\.drivers\[1\]: /],
      ["- weight: 0\n", /^profiles\.yaml line 1, \[0\]\.weight: expected a weight from 1 to 1000$/],
      [`- weight: ${maxProfileWeight + 1}\n`, /\[0\]\.weight: expected a weight from 1 to 1000$/],
      ["[{cpu: 4}", /^profiles\.yaml line 1: is neither YAML nor JSON: /],
      ['[{"cpu": 4, "cpu": 8}]', /^profiles\.yaml line 1: is neither YAML nor JSON: .*unique/],
    ];
    for (const [text, expected] of cases) assert.match(refusal(text), expected, JSON.stringify(text));
    assert.match(refusal("[]", "/etc/lab/p.json"), /^\/etc\/lab\/p\.json line 1: /);
  });

  void test("assignment — without weights node i gets set i mod n", () => {
    const sets: ProfileSet[] = [{ cpu: 1 }, { cpu: 2 }, { cpu: 3 }];
    assert.deepEqual(assignProfileSets(sets, 7), [0, 1, 2, 0, 1, 2, 0]);
    assert.deepEqual(assignProfileSets([{}], 3), [0, 0, 0]);
    assert.deepEqual(assignProfileSets(sets, 0), []);
  });

  void test("assignment — weights 3:1 over 10 nodes interleave, 8 and 2 (each within 1 of 7.5 and 2.5)", () => {
    const order = assignProfileSets([{ weight: 3 }, { weight: 1 }], 10);
    assert.deepEqual(order, [0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
    // A set without a weight weighs 1: the same as writing it.
    assert.deepEqual(assignProfileSets([{ weight: 3 }, {}], 10), order);
  });

  void test("assignment — deterministic, prefix-stable, and every prefix holds each weighted set within 1 of its share", () => {
    const weightsArb = fc.array(fc.integer({ min: 1, max: maxProfileWeight }), {
      minLength: 1,
      maxLength: 12,
    });
    fc.assert(
      fc.property(weightsArb, fc.integer({ min: 0, max: 400 }), (weights, nodes) => {
        const sets = weights.map((weight) => ({ weight }));
        const order = assignProfileSets(sets, nodes);
        assert.equal(order.length, nodes);
        assert.deepEqual(assignProfileSets(sets, nodes), order);
        // A smaller lab is the start of a larger one: the same node gets the same set.
        assert.deepEqual(
          assignProfileSets(sets, Math.floor(nodes / 2)),
          order.slice(0, Math.floor(nodes / 2)),
        );
        const total = weights.reduce((sum, weight) => sum + weight, 0);
        const counts = weights.map(() => 0);
        order.forEach((index, i) => {
          counts[index] = (counts[index] ?? 0) + 1;
          weights.forEach((weight, set) => {
            const share = ((i + 1) * weight) / total;
            assert.ok(
              Math.abs((counts[set] ?? 0) - share) <= 1,
              `set ${set} after ${i + 1} nodes: ${counts[set]} against a share of ${share}`,
            );
          });
        });
      }),
      { numRuns: 300 },
    );
  });

  void test("assignment — equal weights are round-robin", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 1, max: 50 }),
        fc.integer({ min: 0, max: 200 }),
        (sets, weight, nodes) => {
          const weighted = Array.from({ length: sets }, () => ({ weight }));
          assert.deepEqual(
            assignProfileSets(weighted, nodes),
            Array.from({ length: nodes }, (_, i) => i % sets),
          );
        },
      ),
    );
  });

  void test("join profile — a set overrides only what it names; the lab's label stays; the contract accepts it", () => {
    assert.deepEqual(labJoinProfile(undefined), {
      labels: { lab: "true" },
      simulated: { drivers: ["file"] },
    });
    const web = labJoinProfile({ labels: { role: "web" }, cpu: 4, memory_mb: 8192, weight: 2 });
    assert.deepEqual(web, {
      labels: { lab: "true", role: "web" },
      simulated: { drivers: ["file"], cpu: 4, memory_mb: 8192 },
    });
    assert.deepEqual(labJoinProfile({ drivers: ["file", "docker"] }).simulated, {
      drivers: ["file", "docker"],
    });
    // What join sends: this machine's facts with the set's on top, hostname still the machine's.
    const profile = { ...machineProfile(web.labels), ...web.simulated };
    assert.equal(profile.cpu, 4);
    assert.equal(profile.memory_mb, 8192);
    assert.deepEqual(profile.labels, { lab: "true", role: "web", hostname: hostname() });
    const enrol = parseEnrol({
      kind: "enrol",
      node: "lab-1",
      token_id: "tok_0123456789ab",
      secret: Buffer.alloc(32, 1).toString("base64url"),
      keys: {
        signing: Buffer.alloc(32, 2).toString("base64"),
        overlay: Buffer.alloc(32, 3).toString("base64"),
      },
      profile,
      agent_version: "0.1.0",
      sent_at: new Date().toISOString(),
    });
    assert.deepEqual(enrol.profile, profile);
  });

  void test("join profiles — node order over the file's sets, the lab's defaults without a file", () => {
    const sets = parseProfileFile("[{labels: {role: web}, cpu: 4}, {labels: {role: db}, cpu: 8}]", "p.yaml");
    const profiles = labJoinProfiles(sets, 5);
    assert.deepEqual(
      profiles.map((p) => [p.labels.role, p.simulated.cpu]),
      [
        ["web", 4],
        ["db", 8],
        ["web", 4],
        ["db", 8],
        ["web", 4],
      ],
    );
    assert.deepEqual(labJoinProfiles(undefined, 2), [labJoinProfile(undefined), labJoinProfile(undefined)]);
  });
});
