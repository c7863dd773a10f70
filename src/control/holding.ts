/**
 * Holding: where a node stands against what it was last sent, judged from its latest account alone.
 * `node list` and `node show` print it; it reads no store: a whole fleet is judged from two reads done once.
 */

/** The closed set: holds what was sent, not there yet, could not or would not, was never sent anything. */
export const holdings = ["current", "behind", "failed", "none"] as const;
export type Holding = (typeof holdings)[number];

/** What the node was last sent: the place and content of its latest declaration. */
export interface SentPlace {
  sequence: number;
  digest: string;
}

/** The node's latest account: the declaration it speaks of (null: a report naming none) and how it went. */
export interface AccountPlace {
  sequence: number | null;
  outcome: string;
  digest: string;
}

/**
 * Where a node stands:
 * - `none`: nothing was ever sent to it;
 * - `current`: its latest account says it applied the latest declaration sent;
 * - `behind`: it has not yet reported the latest declaration sent (including never reporting at all);
 * - `failed`: its latest account is a failure to apply the latest declaration, or any refusal.
 *
 * A refusal counts as failed whatever sequence it names: a node reports a refusal with the declaration it
 * still holds, not the one it refused, so a refused latest declaration shows as an account of an older one,
 * and a node that refuses does not catch up by waiting. An account above the latest sent should not exist (a
 * sequence is recorded before it is sent); if one does, it has reached the latest. A report that names no
 * sequence (an older contract) is placed by its digest.
 */
export function holdingOf(sent: SentPlace | undefined, account: AccountPlace | undefined): Holding {
  if (sent === undefined) return "none";
  if (account === undefined) return "behind";
  if (account.outcome === "refused") return "failed";
  const reachedLatest =
    account.sequence === null
      ? account.digest === sent.digest
      : account.sequence > sent.sequence ||
        (account.sequence === sent.sequence && account.digest === sent.digest);
  if (!reachedLatest) return "behind";
  return account.outcome === "applied" ? "current" : "failed";
}
