/**
 * The lab: many simulated nodes in one process, each doing what `mesh-host` does with the agent's own code — it
 * joins with its own one-time token (issued as `mesh token issue` issues it), keeps its own identity and keys,
 * verifies and applies declarations, reports and says alive. Only what is around the agent differs: its state is
 * kept in memory (or in a dir per node), its files in memory (or under a root per node), and above a few hundred
 * nodes groups of nodes share a broker connection on the writers table's `lab` identity.
 */
import { join as joinPath } from "node:path";
import type { BrokerIdentities, NodeBus } from "../bus/index.js";
import { openNodeSide } from "../bus/index.js";
import type { LabConnection } from "../bus/lab.js";
import { openLabConnection } from "../bus/lab.js";
import { issueToken } from "../control/tokens.js";
import type { AppliedDeclaration, HostIdentity, StateStorage } from "../host/state.js";
import { diskStorage, HostState, memoryStorage } from "../host/state.js";
import { Agent } from "../host/agent.js";
import type { AgentEvent, OpenNodeBus } from "../host/agent.js";
import { join } from "../host/join.js";
import { compareDeclarationOrder } from "../link/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Store } from "../store/index.js";
import { MemoryApplier } from "./memory-applier.js";
import type { LabOptions } from "./options.js";
import { labNodeName } from "./options.js";
import type { LabJoinProfile, ProfileSet } from "./profiles.js";
import { labJoinProfiles } from "./profiles.js";

export interface LabSettings extends LabOptions {
  /** The control plane's data dir: a shared connection's identity is minted with its account key. */
  dataDir: string;
  log: Logger;
  /** Files and state on disk under `<root>/<node>/` instead of in memory. */
  root?: string;
  /** The profile sets the nodes join with, assigned in node order (default: the lab's label on this machine's facts). */
  profiles?: readonly ProfileSet[];
  /** Told what each node's agent does, as it does it. */
  onEvent?: (node: string, event: AgentEvent) => void;
}

/** What became of one node's join. */
export interface JoinOutcome {
  node: string;
  ms: number;
  error?: string;
}

export interface LabStatus {
  connections: LabSettings["connections"];
  nodes: number;
  joined: number;
  joinFailed: number;
  running: number;
  /** Nodes holding a declaration they applied. */
  applied: number;
  /** Nodes holding the newest declaration any lab node holds. */
  latest: { epoch: number; sequence: number; nodes: number } | null;
  /** Running nodes whose every report the control plane has taken (no report waiting for its receipt). */
  reporting: number;
  alivesSent: number;
  reportsSent: number;
  refused: number;
  stopped: { node: string; error: string }[];
}

interface LabNode {
  name: string;
  stateDir: string;
  storage: StateStorage;
  profile: LabJoinProfile;
  agent?: Agent;
}

export class Lab {
  readonly names: string[];
  private readonly nodes = new Map<string, LabNode>();
  private readonly connections: LabConnection[] = [];
  private readonly runs: Promise<void>[] = [];
  private readonly stopped: { node: string; error: string }[] = [];
  private joins: JoinOutcome[] = [];
  private whenStopped: Promise<void> | undefined;
  private stopping = false;
  /** While held: let go by `release`. */
  private held: { released: Promise<void>; release: () => void } | undefined;
  /** Nodes whose next delivery reached them while the lab was held and waits to be let go. */
  private waiting = 0;

  constructor(private readonly settings: LabSettings) {
    this.names = Array.from({ length: settings.nodes }, (_, i) =>
      labNodeName(settings.prefix, i + 1, settings.nodes),
    );
    const root = settings.root;
    const profiles = labJoinProfiles(settings.profiles, this.names.length);
    this.names.forEach((name, i) => {
      const profile = profiles[i];
      if (profile === undefined) throw new Error(`${name} has no profile`);
      this.nodes.set(name, {
        name,
        stateDir: root !== undefined ? joinPath(root, name, "state") : `/lab/${name}`,
        storage: root !== undefined ? diskStorage : memoryStorage(),
        profile,
      });
    });
  }

  /** One token per node, issued exactly as `mesh token issue` issues it. Returns node → token string. */
  async issueTokens(
    store: Store,
    broker: BrokerIdentities,
    fingerprint: string,
    ttlMs: number,
  ): Promise<Map<string, string>> {
    const tokens = new Map<string, string>();
    for (const node of this.names) {
      const issued = await issueToken(store, { node, ttlMs, fingerprint, now: new Date(), broker });
      tokens.set(node, issued.token);
    }
    return tokens;
  }

  /**
   * Every node given joins with its own token, `joinConcurrency` at a time; each join is timed. Called again with
   * other nodes, those join too: `start` starts every node that joined.
   */
  async join(tokens: ReadonlyMap<string, string>): Promise<JoinOutcome[]> {
    const outcomes = await mapLimit([...tokens], this.settings.joinConcurrency, async ([node, token]) => {
      const labNode = this.nodes.get(node);
      if (labNode === undefined) throw new Error(`${node} is not a node of this lab`);
      const started = performance.now();
      try {
        await join({
          token,
          stateDir: labNode.stateDir,
          labels: labNode.profile.labels,
          simulated: labNode.profile.simulated,
          timeoutMs: this.settings.joinTimeoutMs,
          storage: labNode.storage,
        });
        return { node, ms: performance.now() - started };
      } catch (error) {
        return { node, ms: performance.now() - started, error: errorText(error) };
      }
    });
    this.joins.push(...outcomes);
    return outcomes;
  }

  /** Starts the agent of every node that joined; returns once each has connected and said alive once. */
  async start(): Promise<void> {
    const joined = this.joins.filter((outcome) => outcome.error === undefined).map((outcome) => outcome.node);
    const opens = new Map<string, OpenNodeBus>();
    if (this.settings.connections === "shared") {
      for (let i = 0; i < joined.length; i += this.settings.groupSize) {
        const group = joined.slice(i, i + this.settings.groupSize);
        const url = this.brokerUrlOf(group[0]);
        const connection = await openLabConnection(this.settings.dataDir, url, group);
        this.connections.push(connection);
        if (connection.parts > 1) {
          this.settings.log.warn("lab.group_split", {
            nodes: group.length,
            connections: connection.parts,
            why: "the group's identity is longer than one CONNECT line holds",
          });
        }
        for (const node of group) opens.set(node, () => Promise.resolve(connection.nodeBus(node)));
      }
    }
    // `startsAtOnce` agents connect at a time, each until it is ready: thousands of handshakes begun at once on this
    // process's one thread outlast the broker's handshake timeout, and each retry adds to the crowd (9,800 nodes
    // never got connected).
    await mapLimit(joined, startsAtOnce, async (node) => {
      const labNode = this.nodes.get(node);
      if (labNode === undefined || this.stopping) return;
      const agent = new Agent({
        stateDir: labNode.stateDir,
        root: this.settings.root === undefined ? "/nonexistent" : joinPath(this.settings.root, node, "root"),
        aliveEveryMs: this.settings.aliveEveryMs,
        log: this.settings.log,
        storage: labNode.storage,
        ...(this.settings.root === undefined ? { applier: new MemoryApplier() } : {}),
        openBus: this.holdable(opens.get(node) ?? openOwn(this.settings.log)),
        ...(this.settings.onEvent === undefined
          ? {}
          : { onEvent: (event: AgentEvent) => this.settings.onEvent?.(node, event) }),
      });
      labNode.agent = agent;
      let ready: () => void = () => undefined;
      const readied = new Promise<void>((resolve) => (ready = resolve));
      const run = agent.run(ready).then(
        () => {
          // A run that ended before it was ready (stopped as it began) must not leave start() waiting for it.
          ready();
          if (!this.stopping) this.stopped.push({ node, error: "the connection closed" });
        },
        (error: unknown) => {
          ready();
          this.stopped.push({ node, error: errorText(error) });
          this.settings.log.warn("lab.node_stopped", { node, error: errorText(error) });
        },
      );
      this.runs.push(run);
      await readied;
    });
  }

  /**
   * Holds the fleet as if its machines were paused: what the broker sends waits, in order, until `release`. Shared
   * connections stop reading from the broker meanwhile (it waits in their sockets); what a node had read already,
   * and what a node on a connection of its own is delivered, waits at the node. The nodes' alives go on. A
   * roll-out sent to a held fleet is the control plane's alone: the simulated nodes verifying and applying beside
   * it, or only reading and holding what it sends them, would otherwise share this machine's cores with it, which a
   * fleet of real machines does not. A hold is for seconds: a connection that reads nothing for about half a minute
   * takes its server for gone (its pings go unanswered) and dials again.
   */
  hold(): void {
    if (this.held !== undefined) return;
    let release: () => void = () => undefined;
    const released = new Promise<void>((resolve) => (release = resolve));
    this.held = { released, release };
    for (const connection of this.connections) connection.pauseReading();
  }

  /**
   * How many nodes have a delivery waiting to be let go. A node takes its deliveries one at a time: the first waits
   * here, any later ones wait behind it at the broker connection.
   */
  heldNodes(): number {
    return this.waiting;
  }

  /** Lets a held fleet go: each node then handles what was sent to it meanwhile, in the order it was sent. */
  release(): void {
    if (this.held === undefined) return;
    for (const connection of this.connections) connection.resumeReading();
    this.held.release();
    this.held = undefined;
  }

  /** A node's bus whose deliveries wait while the lab is held. */
  private holdable(open: OpenNodeBus): OpenNodeBus {
    return async (identity, seed) => {
      const bus = await open(identity, seed);
      return {
        consumeNode: (handle) =>
          bus.consumeNode(async (message) => {
            const held = this.held;
            if (held !== undefined) {
              this.waiting++;
              await held.released;
              this.waiting--;
            }
            await handle(message);
          }),
        publishReport: (body) => bus.publishReport(body),
        publishAlive: (body) => bus.publishAlive(body),
        closed: () => bus.closed(),
        close: () => bus.close(),
      };
    };
  }

  /** How many broker connections the running nodes share (shared mode), once started. */
  sharedConnections(): number {
    return this.connections.reduce((sum, connection) => sum + connection.parts, 0);
  }

  /** Where a joined node's identity says its broker is. */
  private brokerUrlOf(node: string | undefined): string {
    if (node === undefined) throw new Error("no joined node to take the broker's address from");
    return this.identityOf(node).broker.url;
  }

  /** The identity a node keeps since it joined. */
  identityOf(node: string): HostIdentity {
    const labNode = this.nodes.get(node);
    if (labNode === undefined) throw new Error(`${node} is not a node of this lab`);
    const identity = new HostState(labNode.stateDir, labNode.storage).loadIdentity();
    if (identity === undefined) throw new Error(`node ${labNode.name} joined but keeps no identity`);
    return identity;
  }

  /** The nodes whose agent runs now: joined, started and not stopped since. */
  runningNodes(): Set<string> {
    const stoppedNodes = new Set(this.stopped.map((s) => s.node));
    return new Set(
      [...this.nodes.values()].flatMap((node) =>
        node.agent === undefined || stoppedNodes.has(node.name) ? [] : [node.name],
      ),
    );
  }

  status(): LabStatus {
    const agents = [...this.nodes.values()].flatMap((node) => (node.agent === undefined ? [] : [node.agent]));
    const stoppedNodes = new Set(this.stopped.map((s) => s.node));
    let applied = 0;
    let reporting = 0;
    const holds = new Map<string, number>();
    let newest: AppliedDeclaration | undefined;
    const counts = { alives: 0, reports: 0, refused: 0 };
    for (const agent of agents) {
      const status = agent.status();
      counts.alives += agent.counters.alives;
      counts.reports += agent.counters.reports;
      counts.refused += agent.counters.refused;
      if (!stoppedNodes.has(agent.node) && !status.reportPending) reporting++;
      if (status.applied === undefined) continue;
      applied++;
      const key = `${status.applied.epoch}/${status.applied.sequence}`;
      holds.set(key, (holds.get(key) ?? 0) + 1);
      if (newest === undefined || compareDeclarationOrder(status.applied, newest) > 0)
        newest = status.applied;
    }
    return {
      connections: this.settings.connections,
      nodes: this.names.length,
      joined: this.joins.filter((j) => j.error === undefined).length,
      joinFailed: this.joins.filter((j) => j.error !== undefined).length,
      running: agents.length - stoppedNodes.size,
      applied,
      latest:
        newest === undefined
          ? null
          : {
              epoch: newest.epoch,
              sequence: newest.sequence,
              nodes: holds.get(`${newest.epoch}/${newest.sequence}`) ?? 0,
            },
      reporting,
      alivesSent: counts.alives,
      reportsSent: counts.reports,
      refused: counts.refused,
      stopped: [...this.stopped],
    };
  }

  /** The agent of a node, once started (the bench watches applies through it). */
  agentOf(node: string): Agent | undefined {
    return this.nodes.get(node)?.agent;
  }

  /** Stops every node and closes the connections; stopping again waits for the first stop. */
  stop(): Promise<void> {
    this.whenStopped ??= (async () => {
      this.stopping = true;
      // A held node would never see its connection close.
      this.release();
      await Promise.all([...this.nodes.values()].map((node) => node.agent?.stop() ?? Promise.resolve()));
      await Promise.all(this.runs);
      await Promise.all(this.connections.map((connection) => connection.close()));
    })();
    return this.whenStopped;
  }
}

/** How many of the lab's agents connect at once when it starts. */
const startsAtOnce = 200;

/** A node's own connection, telling `log` when it is lost, comes back, or cannot be set up. */
const openOwn =
  (log: Logger): OpenNodeBus =>
  (identity, seed): Promise<NodeBus> =>
    openNodeSide(identity.broker.url, identity.node, identity.broker.credential, seed, log);

/** Runs `work` over `items`, at most `limit` at a time, and returns the results in the items' order. */
export async function mapLimit<T, R>(
  items: readonly T[],
  limit: number,
  work: (item: T) => Promise<R>,
): Promise<R[]> {
  const results: R[] = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index] as T);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}
