/**
 * The overlay network as the control plane composes it: every node on it has a stable address from the plan's CIDR
 * (kept in the store, never given to another node while the node exists), and holds one `overlay` item naming every
 * other node on it as a peer — its overlay public key, its address, and where to reach it when its profile says.
 * Pure: the store's addresses and the fleet go in, items come out.
 */
import type { DeclaredItem, OverlayPlan } from "../link/index.js";
import type { FleetNode } from "./allot.js";
import { matches } from "./allot.js";

/** The label a node sets to say where its overlay can be reached from the others: `IP:PORT`. */
export const endpointLabel = "overlay-endpoint";

/** The driver an agent advertises when it can bring the overlay up. */
export const overlayDriver = "overlay";

const endpointPattern = /^(\d{1,3}\.){3}\d{1,3}:\d{1,5}$/;

function toNumber(address: string): number {
  return address.split(".").reduce((sum, part) => sum * 256 + Number(part), 0);
}

function toAddress(value: number): string {
  return [24, 16, 8, 0].map((shift) => Math.floor(value / 2 ** shift) % 256).join(".");
}

/** The network's first and last host address (the network and broadcast addresses are never given out). */
export function hostRange(cidr: string): { first: number; last: number; prefix: number } {
  const [base = "", bits = ""] = cidr.split("/");
  const prefix = Number(bits);
  const size = 2 ** (32 - prefix);
  const network = toNumber(base) - (toNumber(base) % size);
  return { first: network + 1, last: network + size - 2, prefix };
}

export function inNetwork(address: string, cidr: string): boolean {
  const { first, last } = hostRange(cidr);
  const value = toNumber(address);
  return value >= first && value <= last;
}

/**
 * Addresses for `wanting` nodes, the lowest free ones in order: `taken` holds every address given out before (to a
 * node on the overlay now or not, retired or not), so none is ever given twice. Nodes that find none left are
 * returned as `short`.
 */
export function allocate(
  cidr: string,
  taken: ReadonlySet<string>,
  wanting: readonly string[],
): { given: Map<string, string>; short: string[] } {
  const { first, last } = hostRange(cidr);
  const given = new Map<string, string>();
  let next = first;
  const short: string[] = [];
  for (const node of wanting) {
    while (next <= last && taken.has(toAddress(next))) next++;
    if (next > last) {
      short.push(node);
      continue;
    }
    given.set(node, toAddress(next));
    next++;
  }
  return { given, short };
}

/** The nodes the overlay reaches: selected by its `where`, with an agent that can apply it. */
export function overlayNodes(overlay: OverlayPlan, fleet: readonly FleetNode[]): FleetNode[] {
  return fleet.filter((node) => matches(overlay.where, node) && node.profile.drivers.includes(overlayDriver));
}

export interface OverlayMember {
  node: string;
  address: string;
  publicKey: string;
  endpoint: string | undefined;
}

/** Each member's `overlay` item: its own address and every other member as a peer, in name order. */
export function overlayItems(
  overlay: OverlayPlan,
  members: readonly OverlayMember[],
): Map<string, DeclaredItem> {
  const { prefix } = hostRange(overlay.cidr);
  const sorted = [...members].sort((a, b) => (a.node < b.node ? -1 : 1));
  const peers = sorted.map((member) => ({
    node: member.node,
    public_key: member.publicKey,
    allowed_ips: [`${member.address}/32`],
    ...(member.endpoint === undefined ? {} : { endpoint: member.endpoint }),
  }));
  const items = new Map<string, DeclaredItem>();
  for (const member of sorted) {
    items.set(member.node, {
      id: `overlay:${overlay.interface}`,
      type: "overlay",
      interface: overlay.interface,
      address: `${member.address}/${prefix}`,
      listen_port: overlay.port,
      peers: peers.filter((peer) => peer.node !== member.node),
    });
  }
  return items;
}

/** Where a node says it can be reached, when its label holds an `IP:PORT`. */
export function endpointOf(node: FleetNode): string | undefined {
  const value = Object.hasOwn(node.profile.labels, endpointLabel)
    ? node.profile.labels[endpointLabel]
    : undefined;
  return value !== undefined && endpointPattern.test(value) ? value : undefined;
}
