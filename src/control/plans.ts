/**
 * The plan's way to the nodes: read the plan and the fleet, allot, compose each node's declaration, and send it
 * only to the nodes whose composition differs from what they were last sent. What was last sent is compared as
 * items and units, never with the epoch: a new epoch after a failover alone sends nothing. The acting control plane
 * does this whenever the plan or the fleet changes; a command that took a lease of its own (nobody else acts) does
 * it once before it gives the lease back.
 */
import { MeshError, UsageError } from "../errors.js";
import type { OverlayPlan, Plan, UnitContents } from "../link/index.js";
import { checkContents, emptyDigest, itemsDigest, planSchema } from "../link/index.js";
import type { Store } from "../store/index.js";
import type { Allotment, Away, Condition, FleetNode, Held } from "./allot.js";
import { allot } from "./allot.js";
import type { AllotMemory } from "./allot-memory.js";
import type { Composition, ItemConflict } from "./compose.js";
import { composeFleet } from "./compose.js";
import type { DeclareContext, SentDeclaration } from "./declarations.js";
import { sendDeclarations } from "./declarations.js";
import type { SentMemory } from "./sent-memory.js";
import { livenessOf, longestListened } from "./liveness.js";
import { parseOperatorFile } from "./operator-file.js";
import type { OverlayMember } from "./overlay.js";
import { allocate, endpointOf, inNetwork, overlayItems, overlayNodes } from "./overlay.js";

/** A revision of the plan; revision 0 is the empty plan, before any was written. */
export interface PlanAt {
  revision: number;
  plan: Plan;
}

export const emptyPlan: Plan = { units: [] };

/** Reads a plan file as the operator wrote it: YAML or JSON, every problem named by where it is. */
export function parsePlanFile(text: string, fileName: string): Plan {
  const plan = parseOperatorFile(planSchema, text, fileName);
  // Each unit's items against the wire contract, before anything is written: a node would refuse them.
  plan.units.forEach((unit, index) => checkUnitContents(unit, `${fileName}: units[${index}] (${unit.name})`));
  return plan;
}

/** A unit's (or a `mesh declare` file's) items checked against what the wire allows; `where` names it in the error. */
export function checkUnitContents(contents: UnitContents, where: string): void {
  checkContents(contents, where);
}

/** The plan as it is stored: canonical JSON of the parsed plan. */
export function planText(plan: Plan): string {
  return JSON.stringify(plan);
}

/** A stored revision's plan, checked again: the store is not trusted to hold only what was written through here. */
function storedPlan(text: string, revision: number): Plan {
  const parsed = planSchema.safeParse(JSON.parse(text));
  if (!parsed.success) {
    throw new MeshError(
      "internal",
      `plan revision ${revision} in the store is not a plan: ${parsed.error.message}`,
    );
  }
  return parsed.data;
}

/** The newest plan, or revision `revision` (`plan_unknown` when there is no such revision). */
export async function readPlan(store: Store, revision?: number): Promise<PlanAt> {
  if (revision !== undefined) {
    const found = await store.plans.at(revision);
    if (found === undefined) {
      const newest = await store.plans.newest();
      throw new MeshError(
        "plan_unknown",
        newest === 0 ? "no plan was ever written" : `no plan revision ${revision} (the newest is ${newest})`,
      );
    }
    return { revision, plan: storedPlan(found.plan, revision) };
  }
  const current = await store.plans.current();
  return current === undefined
    ? { revision: 0, plan: emptyPlan }
    : { revision: current.revision, plan: storedPlan(current.plan, current.revision) };
}

/** The enrolled fleet as allot sees it, and how long each node out of touch has been so (heard time only). */
export interface FleetReading {
  nodes: FleetNode[];
  away: Away;
  /** Each node's overlay public key, sent when it enrolled. */
  overlayKeys?: ReadonlyMap<string, string>;
  /** The overlay addresses given so far, by node. */
  addresses?: ReadonlyMap<string, string>;
  /** Each node's newest declaration sequence: 0 for a node never declared to. */
  declarationSequences?: ReadonlyMap<string, number>;
}

export async function readFleet(store: Store, now: Date, outOfTouchAfterMs: number): Promise<FleetReading> {
  const hearing = await store.hearing.read();
  const nodes: FleetNode[] = [];
  const away = new Map<string, number>();
  const overlayKeys = new Map<string, string>();
  const declarationSequences = new Map<string, number>();
  const profiles = new Map<string, FleetNode["profile"]>();
  for (const node of await store.nodes.fleet()) {
    nodes.push({ name: node.name, profile: profileOf(node.name, node.profile, profiles) });
    declarationSequences.set(node.name, node.declarationSequence);
    if (node.overlayKey !== null) overlayKeys.set(node.name, node.overlayKey);
    const reading = livenessOf(node.lastSeen, now, outOfTouchAfterMs, hearing);
    if (reading.liveness === "out_of_touch" && node.lastSeen !== null) {
      const seen = Date.parse(node.lastSeen);
      away.set(
        node.name,
        hearing === undefined ? now.getTime() - seen : longestListened(seen, now.getTime(), hearing),
      );
    }
  }
  profilesRead = profiles;
  return { nodes, away, overlayKeys, addresses: await store.overlay.addresses(), declarationSequences };
}

/**
 * The profiles read by the last look at the fleet, by the text each node sent: a roll-out reads the whole fleet, and
 * a fleet's profiles change only when a node enrols again. Shared by the nodes that sent the same text (allot only
 * reads them), and replaced at each look by what that look read, so it holds no more than the fleet's own texts.
 */
let profilesRead = new Map<string, FleetNode["profile"]>();

/** What allot sees of a node that sent no profile: one object for them all, as for nodes that sent the same text. */
const noProfile: FleetNode["profile"] = readProfile("", null);

/** The profile a node sent at enrolment, as allot needs it; checked when it was received, read leniently here. */
function profileOf(
  node: string,
  text: string | null,
  read: Map<string, FleetNode["profile"]>,
): FleetNode["profile"] {
  if (text === null) return noProfile;
  let profile = read.get(text) ?? profilesRead.get(text);
  if (profile === undefined) profile = readProfile(node, text);
  read.set(text, profile);
  return profile;
}

function readProfile(node: string, text: string | null): FleetNode["profile"] {
  const value = (text === null ? {} : JSON.parse(text)) as Partial<Record<string, unknown>>;
  const labels = value.labels;
  const drivers = value.drivers;
  const number = (field: unknown) => (typeof field === "number" && Number.isFinite(field) ? field : 0);
  if (text !== null && (typeof value !== "object" || value === null)) {
    throw new MeshError("internal", `node ${node}'s stored profile is not an object`);
  }
  return {
    cpu: number(value.cpu),
    memory_mb: number(value.memory_mb),
    labels:
      typeof labels === "object" && labels !== null
        ? Object.fromEntries(
            Object.entries(labels).filter((entry): entry is [string, string] => typeof entry[1] === "string"),
          )
        : {},
    drivers: Array.isArray(drivers) ? drivers.filter((one): one is string => typeof one === "string") : [],
  };
}

/** What a plan makes of a fleet: where each unit goes, what each node holds, and what could not be done. */
export interface Outlook {
  allotment: Allotment;
  compositions: Map<string, Composition>;
  conflicts: ItemConflict[];
  /** Units short of their count, and units held back on some node by a conflict. */
  conditions: Condition[];
}

/**
 * Which nodes hold each unit now, from what every node was last sent. Given `plan`, only its units with a count: the
 * only ones allot asks this of (at 10,000 nodes each holding eight units, the sets of all of them took 9 ms).
 */
export function heldOf(last: ReadonlyMap<string, LastSent>, plan?: Plan): Held {
  const counted =
    plan === undefined
      ? undefined
      : new Set(plan.units.flatMap((unit) => (unit.count === undefined ? [] : [unit.name])));
  const held = new Map<string, Set<string>>();
  for (const [node, sent] of last) {
    for (const unit of sent.units) {
      if (counted !== undefined && !counted.has(unit)) continue;
      let nodes = held.get(unit);
      if (nodes === undefined) held.set(unit, (nodes = new Set()));
      nodes.add(node);
    }
  }
  return held;
}

/**
 * Where each unit goes and what each node holds. Given `memory`, allot's answer to the last roll-out is given again
 * when nothing it reads has changed.
 */
export function outlookOf(
  plan: Plan,
  fleet: FleetReading,
  held: Held = new Map(),
  memory?: AllotMemory,
): Outlook {
  const allotment =
    memory === undefined
      ? allot(plan, fleet.nodes, fleet.away, held)
      : memory.allot(plan, fleet.nodes, fleet.away, held);
  const compositions = composeFleet(
    plan,
    allotment,
    fleet.nodes.map((node) => node.name),
  );
  const overlayConditions = plan.overlay === undefined ? [] : withOverlay(plan.overlay, fleet, compositions);
  const conflicts = [...compositions.values()].flatMap((composition) => composition.conflicts);
  return {
    allotment,
    compositions,
    conflicts,
    conditions: [...allotment.conditions, ...conflictConditions(plan, conflicts), ...overlayConditions],
  };
}

/** The pseudo-unit a node's overlay item is listed under. */
export const overlayUnit = "overlay";

/**
 * Adds each overlay member's `overlay` item to its composition (a composition of its own: its peers are every other
 * member). A node the overlay selects that has no address in the network yet is left out, as a condition.
 */
function withOverlay(
  overlay: OverlayPlan,
  fleet: FleetReading,
  compositions: Map<string, Composition>,
): Condition[] {
  const addresses = fleet.addresses ?? new Map<string, string>();
  const selected = overlayNodes(overlay, fleet.nodes);
  const members: OverlayMember[] = [];
  const waiting: string[] = [];
  for (const node of selected) {
    const address = addresses.get(node.name);
    const publicKey = fleet.overlayKeys?.get(node.name);
    if (address === undefined || !inNetwork(address, overlay.cidr) || publicKey === undefined) {
      waiting.push(node.name);
      continue;
    }
    members.push({ node: node.name, address, publicKey, endpoint: endpointOf(node) });
  }
  for (const [node, item] of overlayItems(overlay, members)) {
    const composition = compositions.get(node);
    if (composition === undefined) continue;
    const items = [...composition.items, item];
    compositions.set(node, {
      ...composition,
      units: [...composition.units, overlayUnit],
      items,
      digest: itemsDigest(items),
    });
  }
  if (waiting.length === 0) return [];
  return [
    {
      unit: overlayUnit,
      wanted: "every",
      placed: members.length,
      reason: `overlay: ${waiting.length} node(s) have no address in ${overlay.cidr} yet${waiting.length <= 5 ? ` (${waiting.join(", ")})` : ""}`,
    },
  ];
}

/**
 * Gives every node the overlay selects an address in its network, where it has none (or one outside it): written to
 * the store before anything is composed, so an address is given once, whoever composes.
 */
export async function giveOverlayAddresses(
  store: Store,
  plan: Plan,
  fleet: FleetReading,
  at: string,
): Promise<FleetReading> {
  const overlay = plan.overlay;
  if (overlay === undefined) return fleet;
  const addresses = fleet.addresses ?? new Map<string, string>();
  const wanting = overlayNodes(overlay, fleet.nodes)
    .map((node) => node.name)
    .filter((node) => {
      const address = addresses.get(node);
      return address === undefined || !inNetwork(address, overlay.cidr);
    });
  if (wanting.length === 0) return fleet;
  const given = await store.overlay.give(
    wanting,
    (taken, nodes) => allocate(overlay.cidr, taken, nodes).given,
    at,
  );
  return { ...fleet, addresses: given };
}

/** One condition per unit that clashes with another somewhere: its nodes there are not sent anything new. */
function conflictConditions(plan: Plan, conflicts: readonly ItemConflict[]): Condition[] {
  const byUnit = new Map<string, ItemConflict[]>();
  for (const conflict of conflicts) {
    const unit = conflict.units[1];
    byUnit.set(unit, [...(byUnit.get(unit) ?? []), conflict]);
  }
  return [...byUnit].map(([unit, found]) => {
    const [first] = found;
    const count = plan.units.find((one) => one.name === unit)?.count;
    const nodes = new Set(found.map((one) => one.node));
    const others = nodes.size - 1;
    return {
      unit,
      wanted: count ?? "every",
      placed: 0,
      reason:
        `${unit}: conflicts with ${first?.units[0] ?? "another unit"} over ${first?.id ?? "an item"} on ` +
        `${first?.node ?? "a node"}${others > 0 ? ` and ${others} more node${others === 1 ? "" : "s"}` : ""}: ` +
        "those nodes keep what they were last sent",
    };
  });
}

/** Refuses a plan that would put two different items under one id on any node of the fleet, naming both units. */
export function refuseConflicts(outlook: Outlook, fileName: string): void {
  const [first] = outlook.conflicts;
  if (first === undefined) return;
  const nodes = new Set(outlook.conflicts.map((conflict) => conflict.node));
  throw new UsageError(
    `${fileName}: units ${first.units[0]} and ${first.units[1]} both declare ${first.id}, differently, for ` +
      `${first.node}${nodes.size > 1 ? ` (and ${nodes.size - 1} more nodes)` : ""}; nothing was written`,
  );
}

/** What a node was last sent, as far as compose compares it. */
export interface LastSent {
  digest: string;
  units: readonly string[];
}

/**
 * Whether a node must be sent its composition: its items or its units differ from what it was last sent. A node
 * never sent anything holds nothing, so a composition of nothing sends nothing to it either.
 */
export function needsSending(composition: Composition, last: LastSent | undefined): boolean {
  if (composition.conflicts.length > 0) return false;
  const digest = last?.digest ?? emptyDigest;
  const units = last?.units ?? [];
  return (
    composition.digest !== digest ||
    composition.units.length !== units.length ||
    composition.units.some((unit, index) => units[index] !== unit)
  );
}

/** What a roll-out did: the revision it composed, what it sent, and what it could not place. */
export interface Rollout {
  revision: number;
  sent: SentDeclaration[];
  /** Nodes whose composition was already what they were last sent. */
  unchanged: number;
  conditions: Condition[];
  /** Where its time went (ms): reading the plan and the fleet and composing, then signing, recording and sending. */
  composeMs: number;
  sendMs: number;
}

export interface RolloutContext extends DeclareContext {
  outOfTouchAfterMs: number;
  /** What this control plane sent each node, kept between its roll-outs; without it each reads the store. */
  sentMemory?: SentMemory;
  /** Allot's last answer, kept between its roll-outs; without it each allots afresh. */
  allotMemory?: AllotMemory;
  /** Told when declarations begin to be sent, with their sending (it settles when they are sent or have failed). */
  onSending?: (sending: Promise<unknown>) => void;
}

/**
 * Composes the newest plan for the whole fleet and sends each node whose composition changed, under `epoch`; then
 * records what could not be placed and that this revision is sent. Every write passes the gate, and the store
 * refuses the conditions and the mark below the epoch floor.
 */
export async function rollOut(context: RolloutContext, epoch: number): Promise<Rollout> {
  const { store } = context;
  const startedAt = performance.now();
  await passGate(context, epoch);
  const { revision, plan } = await readPlan(store);
  const now = context.now();
  const reading = await readFleet(store, now, context.outOfTouchAfterMs);
  const last =
    context.sentMemory === undefined
      ? await store.declarations.latestSent()
      : await context.sentMemory.read(store, epoch, reading.declarationSequences ?? new Map());
  const fleet = await giveOverlayAddresses(store, plan, reading, now.toISOString());
  const outlook = outlookOf(plan, fleet, heldOf(last, plan), context.allotMemory);
  const targets = [...outlook.compositions]
    .filter(([node, composition]) => needsSending(composition, last.get(node)))
    .map(([node, composition]) => ({ node, ...composition }));
  const composedAt = performance.now();
  let sent: SentDeclaration[] = [];
  if (targets.length > 0) {
    const sending = sendDeclarations(context, targets, epoch);
    context.onSending?.(sending);
    sent = await sending;
    context.sentMemory?.remember(epoch, sent, new Map(targets.map((target) => [target.node, target.units])));
  }
  const sentAt = performance.now();
  await passGate(context, epoch);
  const at = context.now().toISOString();
  await store.plans.writeConditions(outlook.conditions, epoch, at);
  await store.plans.markSent(revision, epoch, at);
  return {
    revision,
    sent,
    unchanged: outlook.compositions.size - targets.length,
    conditions: outlook.conditions,
    composeMs: composedAt - startedAt,
    sendMs: sentAt - composedAt,
  };
}

async function passGate(context: DeclareContext, epoch: number): Promise<void> {
  if (context.gate !== undefined && !(await context.gate())) {
    throw new MeshError(
      "lease_moved",
      `the lease no longer stands at epoch ${epoch} (it moved on, or this command's own lapsed)`,
    );
  }
}

/** The unit `mesh declare` keeps for one node, or for every node (`--all`). */
export function pinName(target: string | { all: true }): string {
  return typeof target === "string" ? `pin-${target}` : "pin-all";
}

/**
 * The plan with `contents` pinned: each named node's pin unit (or the one for every node) replaced by one holding
 * exactly these contents, everything else as it was. What `mesh declare` writes.
 */
export function pinned(plan: Plan, targets: readonly string[] | { all: true }, contents: UnitContents): Plan {
  const pins =
    "all" in targets
      ? [{ name: pinName(targets), ...contents }]
      : [...new Set(targets)].map((node) => ({ name: pinName(node), where: { nodes: [node] }, ...contents }));
  const replaced = new Set(pins.map((pin) => pin.name));
  return { units: [...plan.units.filter((unit) => !replaced.has(unit.name)), ...pins] };
}
