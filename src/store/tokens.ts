/** Token rows: issuing (which also invites the node), listing, and the atomic spend and revoke. */
import type { Kysely } from "kysely";
import { MeshError } from "../errors.js";
import type { Database, TokenTable } from "./schema.js";
import { inTransaction } from "./transaction.js";

export const tokenStatuses = ["valid", "spent", "expired", "revoked"] as const;
export type TokenStatus = (typeof tokenStatuses)[number];

export interface TokenRecord {
  id: string;
  node: string;
  secretHash: string;
  createdAt: string;
  expiresAt: string;
  spentAt: string | null;
  revokedAt: string | null;
  brokerCredential: string | null;
}

export interface NewToken {
  id: string;
  node: string;
  secretHash: string;
  createdAt: string;
  expiresAt: string;
}

/** What a token is now. A spent or revoked token stays so; only an unused one can expire. */
export function tokenStatus(token: TokenRecord, now: Date): TokenStatus {
  if (token.spentAt !== null) return "spent";
  if (token.revokedAt !== null) return "revoked";
  if (token.expiresAt <= now.toISOString()) return "expired";
  return "valid";
}

export class TokenQueries {
  constructor(private readonly db: Kysely<Database>) {}

  /** Stores a token and creates its node record (state `invited`) if the node has none yet. */
  async issue(token: NewToken): Promise<void> {
    await inTransaction(this.db, async (trx) => {
      await trx
        .insertInto("nodes")
        .values({ name: token.node, state: "invited", created_at: token.createdAt, declaration_sequence: 0 })
        .onConflict((oc) => oc.column("name").doNothing())
        .execute();
      const node = await trx
        .selectFrom("nodes")
        .select("state")
        .where("name", "=", token.node)
        .executeTakeFirstOrThrow();
      // A retired node's name stays retired: its identity was revoked and its history is kept under that name.
      if (node.state === "retired") {
        throw new MeshError("node_retired", `node ${token.node} is retired; issue the token for a new name`);
      }
      await trx
        .insertInto("tokens")
        .values({
          id: token.id,
          node: token.node,
          secret_hash: token.secretHash,
          created_at: token.createdAt,
          expires_at: token.expiresAt,
          spent_at: null,
          revoked_at: null,
          broker_credential: null,
        })
        .execute();
    });
  }

  async find(id: string): Promise<TokenRecord | undefined> {
    const row = await this.db.selectFrom("tokens").selectAll().where("id", "=", id).executeTakeFirst();
    return row === undefined ? undefined : toRecord(row);
  }

  async list(): Promise<TokenRecord[]> {
    const rows = await this.db.selectFrom("tokens").selectAll().orderBy("created_at").orderBy("id").execute();
    return rows.map(toRecord);
  }

  /**
   * Spends a token by compare-and-set: only an unspent, unrevoked, unexpired row changes, so of any number of
   * concurrent spends exactly one sees `true`.
   */
  async spend(id: string, now: Date): Promise<boolean> {
    const at = now.toISOString();
    const result = await this.db
      .updateTable("tokens")
      .set({ spent_at: at })
      .where("id", "=", id)
      .where("spent_at", "is", null)
      .where("revoked_at", "is", null)
      .where("expires_at", ">", at)
      .executeTakeFirst();
    return result.numUpdatedRows === 1n;
  }

  /** Revokes an unspent, unrevoked token. Returns false when there was nothing left to revoke. */
  async revoke(id: string, now: Date): Promise<boolean> {
    const result = await this.db
      .updateTable("tokens")
      .set({ revoked_at: now.toISOString() })
      .where("id", "=", id)
      .where("spent_at", "is", null)
      .where("revoked_at", "is", null)
      .executeTakeFirst();
    return result.numUpdatedRows === 1n;
  }

  /**
   * When the next token that carries a broker identity expires: the earliest expiry among tokens neither spent,
   * revoked nor expired at `now`. Undefined when there is none.
   */
  async nextExpiry(now: Date): Promise<string | undefined> {
    const row = await this.db
      .selectFrom("tokens")
      .select((eb) => eb.fn.min<string | null>("expires_at").as("next"))
      .where("spent_at", "is", null)
      .where("revoked_at", "is", null)
      .where("broker_credential", "is not", null)
      .where("expires_at", ">", now.toISOString())
      .executeTakeFirst();
    return row?.next ?? undefined;
  }

  /**
   * The broker identities the broker must still refuse for tokens: those of tokens that ended (spent or revoked)
   * and have not yet expired, with when each ended and whether it ended by being spent. Once a token expires the
   * broker refuses its identity by itself.
   */
  async endedIdentities(
    now: Date,
  ): Promise<Array<{ brokerCredential: string; endedAt: string; spent: boolean }>> {
    const rows = await this.db
      .selectFrom("tokens")
      .select(["broker_credential", "spent_at", "revoked_at"])
      .where("broker_credential", "is not", null)
      .where((eb) => eb.or([eb("spent_at", "is not", null), eb("revoked_at", "is not", null)]))
      .where("expires_at", ">", now.toISOString())
      .orderBy("id")
      .execute();
    return rows.flatMap((row) => {
      const endedAt = row.spent_at ?? row.revoked_at;
      return row.broker_credential === null || endedAt === null
        ? []
        : [{ brokerCredential: row.broker_credential, endedAt, spent: row.spent_at !== null }];
    });
  }

  /**
   * The ids of the tokens still valid at `now`, and of those that ended (spent or revoked) between `ended.since` and
   * `ended.by`, both included.
   */
  async validOrEndedWithin(now: Date, ended: { since: Date; by: Date }): Promise<string[]> {
    const at = now.toISOString();
    const since = ended.since.toISOString();
    const by = ended.by.toISOString();
    const rows = await this.db
      .selectFrom("tokens")
      .select("id")
      .where((eb) =>
        eb.or([
          eb.and([eb("spent_at", "is", null), eb("revoked_at", "is", null), eb("expires_at", ">", at)]),
          eb.and([eb("spent_at", ">=", since), eb("spent_at", "<=", by)]),
          eb.and([eb("spent_at", "is", null), eb("revoked_at", ">=", since), eb("revoked_at", "<=", by)]),
        ]),
      )
      .orderBy("id")
      .execute();
    return rows.map((row) => row.id);
  }

  /** The tokens of one node that are still valid at `now`. */
  async validFor(node: string, now: Date): Promise<TokenRecord[]> {
    const rows = await this.db
      .selectFrom("tokens")
      .selectAll()
      .where("node", "=", node)
      .where("spent_at", "is", null)
      .where("revoked_at", "is", null)
      .where("expires_at", ">", now.toISOString())
      .orderBy("id")
      .execute();
    return rows.map(toRecord);
  }

  /**
   * Deletes the tokens that expired before `expiredBefore`: spent, revoked or never used, they can no longer be
   * spent, and their broker identities are refused by the broker itself since their expiry (every token ends at its
   * expiry at the latest, so nothing revocation needs goes). Returns how many went.
   */
  async prune(expiredBefore: Date): Promise<number> {
    const result = await this.db
      .deleteFrom("tokens")
      .where("expires_at", "<", expiredBefore.toISOString())
      .executeTakeFirst();
    return Number(result.numDeletedRows);
  }

  /** Keeps the broker identity minted for a token, so it can be revoked when the token ends. */
  async setBrokerCredential(id: string, credential: string): Promise<void> {
    await this.db.updateTable("tokens").set({ broker_credential: credential }).where("id", "=", id).execute();
  }
}

function toRecord(row: TokenTable): TokenRecord {
  return {
    id: row.id,
    node: row.node,
    secretHash: row.secret_hash,
    createdAt: row.created_at,
    expiresAt: row.expires_at,
    spentAt: row.spent_at,
    revokedAt: row.revoked_at,
    brokerCredential: row.broker_credential,
  };
}
