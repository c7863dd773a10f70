/**
 * What applies a declaration on a node: one applier per kind of item (files, users and groups, services), each
 * making what it manages match the items it is given, removing only what it made earlier and no longer declared, and
 * able to say — without changing anything — where what it holds has drifted from the items.
 */
import { MeshError } from "../errors.js";
import type { DeclaredItem, Report } from "../link/index.js";

/** An applier could not work at all (its root unusable, the machine without what it needs): every item failed. */
export class ApplierError extends MeshError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("applier", message, options);
    this.name = "ApplierError";
  }
}

/** What became of one item, in the form a report carries it. */
export type ItemResult = Report["items"][number];

/** An item that no longer is as declared, and what differs ("content changed", "not running", "shell /bin/sh"). */
export interface Drift {
  id: string;
  what: string;
}

export interface KindApplier {
  /** The item types it applies; it is given only those. */
  readonly types: ReadonlyArray<DeclaredItem["type"]>;
  /**
   * Makes what it manages match `items`: each item made so (and nothing touched that already is), each thing it made
   * earlier and no longer declared removed. One item failing does not stop the others; every item has a result.
   */
  apply(items: readonly DeclaredItem[]): Promise<ItemResult[]>;
  /** Where what it holds differs from `items`, changing nothing. */
  verify(items: readonly DeclaredItem[]): Promise<Drift[]>;
  /** Lets go of what it watches (a service applier stops supervising; the services keep running). */
  close?(): Promise<void>;
  /**
   * Takes as its own what these ids name, where it finds them (a rebuilt machine, told what the mesh put there): the
   * next apply then keeps what matches and removes what is no longer declared. Ids of other kinds are ignored.
   */
  adopt?(ids: readonly string[]): Promise<void>;
}

/**
 * The appliers of every kind as one: each given the items of its types (and given none when none are declared, so
 * it removes what it made), in the order listed — users and groups before the files they own, files before the
 * services that use them. An item of a type no applier takes fails, saying so.
 */
export class Appliers {
  constructor(private readonly kinds: readonly KindApplier[]) {}

  /** The drivers this agent advertises: the item types it can apply. */
  get types(): Array<DeclaredItem["type"]> {
    return this.kinds.flatMap((kind) => [...kind.types]);
  }

  async apply(items: readonly DeclaredItem[]): Promise<ItemResult[]> {
    const results = new Map<string, ItemResult>();
    const extra: ItemResult[] = [];
    for (const kind of this.kinds) {
      for (const result of await kind.apply(items.filter((item) => kind.types.includes(item.type)))) {
        if (items.some((item) => item.id === result.id) && !results.has(result.id))
          results.set(result.id, result);
        else extra.push(result);
      }
    }
    const handled = new Set(this.types);
    // In the declaration's order; removals that failed follow.
    return [
      ...items.map(
        (item): ItemResult =>
          results.get(item.id) ??
          (handled.has(item.type)
            ? { id: item.id, state: "failed", reason: `no result for ${item.id}` }
            : { id: item.id, state: "failed", reason: `this agent cannot apply ${item.type} items` }),
      ),
      ...extra,
    ];
  }

  async verify(items: readonly DeclaredItem[]): Promise<Drift[]> {
    const drifts: Drift[] = [];
    for (const kind of this.kinds)
      drifts.push(...(await kind.verify(items.filter((item) => kind.types.includes(item.type)))));
    return drifts;
  }

  async close(): Promise<void> {
    for (const kind of this.kinds) await kind.close?.();
  }

  async adopt(ids: readonly string[]): Promise<void> {
    for (const kind of this.kinds) await kind.adopt?.(ids);
  }
}
