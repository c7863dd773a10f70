/**
 * `mesh lab` against `mesh serve` on an operator's nats-server: every simulated node joins with its own token,
 * applies what is declared to it and reports, on its own connection and on shared lab connections alike.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { declarationChunk } from "../../src/control/declarations.js";
import { mesh } from "../support/cli.js";
import type { Running } from "../support/processes.js";
import { eventually, startBin } from "../support/processes.js";
import { serveForSuite } from "../support/serve-suite.js";

interface Shown {
  declaration: { sequence: number } | null;
  account: { outcome: string; sequence: number | null } | null;
}
interface Listed {
  name: string;
  state: string;
  liveness: string;
}

describe("mesh lab", () => {
  const labs: Running[] = [];
  const suite = serveForSuite("mesh-lab-", async () => {
    for (const lab of labs) await lab.stop("SIGTERM");
  });
  const { dir, data } = suite;
  const cli = (args: string[]) => mesh(["--data", data, ...args]);

  /** Declares one file to each node, a few `mesh declare` at a time. */
  async function declareTo(nodes: readonly string[]): Promise<void> {
    const file = join(dir.path, "lab.yaml");
    writeFileSync(file, "files:\n  - path: /etc/lab\n    content: from the mesh\n");
    for (let i = 0; i < nodes.length; i += 5) {
      const runs = await Promise.all(nodes.slice(i, i + 5).map((node) => cli(["declare", node, "-f", file])));
      for (const run of runs) assert.equal(run.code, 0, run.stderr);
    }
  }

  async function everyNodeApplied(nodes: readonly string[]): Promise<void> {
    for (const node of nodes) {
      const shown = await eventually(`${node} to report applied`, async () => {
        const s = JSON.parse((await cli(["node", "show", node, "--json"])).stdout) as Shown;
        return s.account?.outcome === "applied" && s.account.sequence === s.declaration?.sequence
          ? s
          : undefined;
      });
      assert.equal(shown.account?.outcome, "applied", node);
    }
  }

  test("lab — 20 nodes on their own connections join, apply what is declared to each, report and stay here", async () => {
    const lab = startBin("mesh", [
      "--data",
      data,
      "lab",
      "--nodes",
      "20",
      "--alive-every",
      "300ms",
      "--summary-every",
      "300ms",
    ]);
    labs.push(lab);
    await eventually(
      "the lab's nodes to join",
      () => (/joined 20\/20/.test(lab.stdout()) ? true : undefined),
      60_000,
    );
    assert.match(lab.stdout(), /lab: 20 nodes, one broker connection per node/);
    const nodes = Array.from({ length: 20 }, (_, i) => `lab-${String(i + 1).padStart(2, "0")}`);
    await declareTo(nodes);
    await everyNodeApplied(nodes);
    await eventually("the lab to count every node applied and reporting", () =>
      /20 applied \(20 hold epoch \d+ sequence 1\), 20 reporting/.test(lab.stdout()) ? true : undefined,
    );
    const listed = JSON.parse((await cli(["node", "list", "--json"])).stdout) as Listed[];
    const labNodes = listed.filter((n) => n.name.startsWith("lab-"));
    assert.equal(labNodes.length, 20);
    for (const node of labNodes)
      assert.deepEqual([node.state, node.liveness], ["enrolled", "here"], node.name);

    assert.equal(await lab.stop("SIGTERM"), 0, lab.stderr());
    assert.match(lab.stdout(), /stopped \(SIGTERM\)\. lab: 20\/20 joined/);
  });

  test("lab — nodes sharing connections on the lab identity apply and report the same way", async () => {
    const lab = startBin("mesh", [
      "--data",
      data,
      "lab",
      "--nodes",
      "9",
      "--prefix",
      "shared",
      "--connections",
      "shared",
      "--group-size",
      "4",
      "--alive-every",
      "300ms",
      "--summary-every",
      "300ms",
    ]);
    labs.push(lab);
    await eventually(
      "the lab's nodes to join",
      () => (/joined 9\/9/.test(lab.stdout()) ? true : undefined),
      60_000,
    );
    assert.match(lab.stdout(), /9 nodes sharing 3 broker connection\(s\), 4 nodes each/);
    const nodes = Array.from({ length: 9 }, (_, i) => `shared-${i + 1}`);
    await declareTo(nodes);
    await everyNodeApplied(nodes);
    assert.equal(await lab.stop("SIGINT"), 0, lab.stderr());
    assert.match(lab.stdout(), /9 applied \(9 hold epoch \d+ sequence 1\)/);
  });
  test("lab — `declare --all` to a fleet of two chunks in groups of 100, sent a chunk at a time, reaches each node signed for it", async () => {
    // A whole chunk and part of a second (a fleet of three chunks is sent part-way in declare-in-part).
    const count = declarationChunk + 100;
    const groups = count / 100;
    assert.ok(Number.isInteger(groups), "the fleet is whole groups of 100");
    const lab = startBin("mesh", [
      "--data",
      data,
      "lab",
      "--nodes",
      String(count),
      "--prefix",
      "many",
      // 100 names make an identity longer than a CONNECT line holds: each group is split over several connections.
      "--group-size",
      "100",
      "--alive-every",
      "5s",
      "--summary-every",
      "300ms",
    ]);
    labs.push(lab);
    const running = await eventually(
      "the lab's nodes to join and run",
      () => /lab: (\d+) nodes running on (\d+) broker connection\(s\)/.exec(lab.stdout()) ?? undefined,
      240_000,
    ).catch((error: unknown) => {
      throw new Error(
        `${String(error)}; the lab printed:\n${lab.stdout()}\n${lab.stderr().slice(-20_000)}\nthe control plane logged:\n${suite.serve.stderr().slice(-20_000)}`,
      );
    });
    assert.match(lab.stdout(), new RegExp(`joined ${count}/${count}`));
    assert.match(
      lab.stdout(),
      new RegExp(`${count} nodes sharing ${groups} broker connection\\(s\\), 100 nodes each`),
    );
    // Each group of 100 was split in four, each identity inside a CONNECT line.
    assert.deepEqual(running.slice(1), [String(count), String(4 * groups)]);
    assert.equal(
      lab.stderr().match(/"event":"lab\.group_split","nodes":100,"connections":4/g)?.length,
      groups,
    );
    const file = join(dir.path, "everyone.yaml");
    writeFileSync(file, "files:\n  - path: /etc/everyone\n    content: all of you\n");
    const run = await cli(["declare", "--all", "-f", file, "--json"]);
    assert.equal(run.code, 0, run.stderr);
    const sent = JSON.parse(run.stdout) as { node: string; sequence: number }[];
    const listed = JSON.parse((await cli(["node", "list", "--json"])).stdout) as Listed[];
    const enrolled = listed.filter((node) => node.state === "enrolled").map((node) => node.name);
    assert.deepEqual(
      sent.map((one) => one.node).sort(),
      enrolled.sort(),
      "one declaration per enrolled node",
    );
    const many = sent.filter((one) => one.node.startsWith("many-"));
    assert.equal(many.length, count);
    assert.ok(
      many.every((one) => one.sequence === 1),
      "each new node's first declaration",
    );
    // Every simulated node verified its own envelope, applied it and had its report kept, and none refused one.
    const everyone = new RegExp(
      `${count} applied \\(${count} hold epoch \\d+ sequence 1\\), ${count} reporting.*`,
    );
    const summary = await eventually(
      "every lab node to apply and be receipted",
      () => everyone.exec(lab.stdout())?.[0],
      120_000,
    );
    assert.match(summary, /, 0 refusal\(s\);/);
    assert.equal(await lab.stop("SIGINT"), 0, lab.stderr());
  });
});
