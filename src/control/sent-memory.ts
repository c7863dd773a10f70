/**
 * What the acting control plane sent each node, kept between its roll-outs. A roll-out compares every node's
 * composition with what the node was last sent; read from the store, that is every node's newest declaration, 30 to
 * 48 ms of the 150 to 250 a roll-out to 10,000 nodes spends before it signs anything.
 */
import type { LatestSent, Store } from "../store/index.js";
import type { SentDeclaration } from "./declarations.js";

/**
 * An entry stands only while it names the node's newest declaration sequence, read with the fleet: a sequence
 * allocated since (by a roll-out that failed before it recorded the node's declaration, or by another writer) sends
 * that node back to the store. Entries are kept for one epoch, as another epoch's writer may have written what this
 * one never saw, and only for the fleet's nodes.
 */
export class SentMemory {
  private epoch: number | undefined;
  private sent = new Map<string, LatestSent>();

  /**
   * What each node of the fleet (its names and newest declaration sequences) was last sent under any epoch; a node
   * never declared to is absent.
   */
  async read(
    store: Store,
    epoch: number,
    fleet: ReadonlyMap<string, number>,
  ): Promise<Map<string, LatestSent>> {
    if (epoch !== this.epoch) {
      this.sent = new Map();
      this.epoch = epoch;
    }
    const known = new Map<string, LatestSent>();
    const unknown: string[] = [];
    for (const [node, sequence] of fleet) {
      // No sequence was ever allocated to the node: it holds no declaration.
      if (sequence === 0) continue;
      const entry = this.sent.get(node);
      if (entry?.sequence === sequence) known.set(node, entry);
      else unknown.push(node);
    }
    if (unknown.length > 0) {
      // Most of the fleet (the first roll-out of an epoch): one read of the whole, not a read per slice of names.
      const read = await store.declarations.latestSent(unknown.length > fleet.size / 2 ? undefined : unknown);
      for (const node of unknown) {
        const found = read.get(node);
        if (found !== undefined) known.set(node, found);
      }
    }
    this.sent = new Map(known);
    return known;
  }

  /** Keeps what a roll-out under `epoch` recorded and sent, each with the units it was composed from. */
  remember(
    epoch: number,
    sent: readonly SentDeclaration[],
    unitsOf: ReadonlyMap<string, readonly string[]>,
  ): void {
    if (epoch !== this.epoch) return;
    for (const { node, sequence, digest } of sent) {
      this.sent.set(node, { sequence, epoch, digest, units: unitsOf.get(node) ?? [] });
    }
  }
}
