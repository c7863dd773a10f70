/**
 * `mesh lab --profiles FILE` against `mesh serve` on an operator's nats-server: each simulated node joins with the
 * profile set its place gives it, and the control plane keeps that profile; a bad file is refused before any node
 * is joined.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { mesh } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { serveForSuite } from "../support/serve-suite.js";

interface ShownProfile {
  cpu: number;
  memory_mb: number;
  labels: Record<string, string>;
  drivers: string[];
}
interface Listed {
  name: string;
}

describe("mesh lab --profiles", () => {
  const labs: Running[] = [];
  const suite = serveForSuite("mesh-lab-profiles-", async () => {
    for (const lab of labs) await lab.stop("SIGTERM");
  });
  const { dir, data } = suite;
  const cli = (args: string[]) => mesh(["--data", data, ...args]);

  /** Runs a lab of `nodes` named `<prefix>-<n>` with `file` until every node joined, then stops it. */
  async function runLab(prefix: string, nodes: number, file: string): Promise<void> {
    const lab = startBin("mesh", [
      "--data",
      data,
      "lab",
      "--nodes",
      String(nodes),
      "--prefix",
      prefix,
      "--profiles",
      file,
      "--alive-every",
      "300ms",
      "--summary-every",
      "300ms",
    ]);
    labs.push(lab);
    const joined = new RegExp(`joined ${nodes}/${nodes}`);
    await eventually("the lab's nodes to join", () => (joined.test(lab.stdout()) ? true : undefined), 60_000);
    assert.equal(await lab.stop("SIGTERM"), 0, lab.stderr());
  }

  async function profileOf(node: string): Promise<ShownProfile> {
    const run = await cli(["node", "show", node, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    const shown = JSON.parse(run.stdout) as { profile: ShownProfile | null };
    assert.ok(shown.profile !== null, `${node} has a profile`);
    return shown.profile;
  }

  test("lab profiles — 6 nodes over the README's two sets take them in turn, and the control plane keeps them", async () => {
    const file = join(dir.path, "profiles.yaml");
    writeFileSync(
      file,
      "[{labels: {role: web}, cpu: 4, memory_mb: 8192}, {labels: {role: db}, cpu: 8, memory_mb: 32768}]\n",
    );
    await runLab("rr", 6, file);
    const expected = [
      { role: "web", cpu: 4, memory_mb: 8192 },
      { role: "db", cpu: 8, memory_mb: 32768 },
    ];
    for (let i = 1; i <= 6; i++) {
      const profile = await profileOf(`rr-${i}`);
      const want = expected[(i - 1) % 2];
      assert.deepEqual(
        [profile.labels.role, profile.labels.lab, profile.cpu, profile.memory_mb],
        [want?.role, "true", want?.cpu, want?.memory_mb],
        `rr-${i}`,
      );
      // What the set leaves out stays as the lab has it: the file driver, the machine's hostname.
      assert.deepEqual(profile.drivers, ["file"], `rr-${i}`);
      assert.equal(typeof profile.labels.hostname, "string", `rr-${i}`);
    }
  });

  test("lab profiles — with weights 3:1 the nodes take the sets interleaved, and drivers are claimed as given", async () => {
    const file = join(dir.path, "weighted.json");
    writeFileSync(
      file,
      JSON.stringify([
        { labels: { tier: "front" }, weight: 3 },
        { labels: { tier: "back" }, drivers: ["file", "docker"], cpu: 999 },
      ]),
    );
    await runLab("weighted", 4, file);
    const tiers: [string | undefined, number, string[]][] = [];
    for (let i = 1; i <= 4; i++) {
      const profile = await profileOf(`weighted-${i}`);
      tiers.push([profile.labels.tier, profile.cpu, profile.drivers]);
    }
    const front = tiers[0]?.[1] ?? 0;
    assert.notEqual(front, 999, "the front set names no cpu: the machine's own count");
    assert.deepEqual(tiers, [
      ["front", front, ["file"]],
      ["front", front, ["file"]],
      ["back", 999, ["file", "docker"]],
      ["front", front, ["file"]],
    ]);
  });

  test("lab profiles — a bad or unreadable file exits 2 naming the file and the place, and joins nobody", async () => {
    const bad = join(dir.path, "bad.yaml");
    writeFileSync(bad, "- labels: {role: web}\n  cpu: 4\n- labels: {role: db}\n  cpu: many\n");
    const empty = join(dir.path, "empty.yaml");
    writeFileSync(empty, "[]\n");
    const runs: [string, RegExp][] = [
      [bad, /bad\.yaml line 4, \[1\]\.cpu: expected a whole number of CPUs/],
      [empty, /empty\.yaml line 1: the list is empty/],
      [join(dir.path, "missing.yaml"), /--profiles: cannot read .*missing\.yaml: .*ENOENT/],
    ];
    for (const [file, expected] of runs) {
      const run = await cli(["lab", "--nodes", "3", "--prefix", "refused", "--profiles", file]);
      assert.equal(run.code, 2, run.stderr);
      assert.match(run.stderr, expected);
    }
    const listed = JSON.parse((await cli(["node", "list", "--json"])).stdout) as Listed[];
    assert.deepEqual(
      listed.filter((node) => node.name.startsWith("refused-")),
      [],
      "no token was issued, no node joined",
    );
  });
});
