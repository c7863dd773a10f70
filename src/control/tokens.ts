/**
 * Tokens: how an operator lets one named machine in, once. The secret is 256 random bits, shown once, stored only
 * as a hash and compared in constant time. Every refusal reads the same (TokenRefused) so guessing learns nothing;
 * the real reason goes to the audit trail only.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { BrokerIdentities } from "../bus/index.js";
import type { TokenRefusalReason } from "../errors.js";
import { TokenRefused } from "../errors.js";
import { assertNodeName, boundText, encodeToken } from "../link/index.js";
import type { Store, TokenRecord } from "../store/index.js";
import { tokenStatus } from "../store/index.js";
import type { RefusalLedger, TakeBack } from "./refusals.js";
import { takeBack } from "./refusals.js";
import { brokerUserOf, currentRevocations } from "./revocations.js";

export interface IssuedToken {
  id: string;
  node: string;
  /** The whole copy-pasteable token string, secret included. Shown once. */
  token: string;
  expiresAt: string;
}

export interface IssueRequest {
  node: string;
  ttlMs: number;
  /** The control plane's signing-key fingerprint, which the node pins. */
  fingerprint: string;
  now: Date;
  /** The broker the token joins through; without one the token carries no broker identity yet. */
  broker?: BrokerIdentities | undefined;
  /** The lease epoch the issuing command acted under, kept with the audit line (none: null). */
  epoch?: number | undefined;
}

export async function issueToken(store: Store, request: IssueRequest): Promise<IssuedToken> {
  assertNodeName(request.node);
  const id = `tok_${randomBytes(6).toString("hex")}`;
  const secret = randomBytes(32).toString("base64url");
  const expiresAt = new Date(request.now.getTime() + request.ttlMs).toISOString();
  await store.tokens.issue({
    id,
    node: request.node,
    secretHash: hashSecret(secret),
    createdAt: request.now.toISOString(),
    expiresAt,
  });
  // The token's own broker identity: it may publish only this node's enrol and read only its replies, and the
  // broker refuses it once the token expires.
  const minted = await request.broker?.forToken({
    id,
    node: request.node,
    secret,
    expiresAt: new Date(expiresAt),
  });
  if (minted !== undefined) await store.tokens.setBrokerCredential(id, JSON.stringify({ user: minted.user }));
  await store.events.record({
    at: request.now.toISOString(),
    kind: "token.issued",
    node: request.node,
    epoch: request.epoch ?? null,
    detail: { token: id, expires_at: expiresAt },
  });
  const token = encodeToken({
    id,
    node: request.node,
    secret,
    fingerprint: request.fingerprint,
    broker:
      minted === undefined || request.broker === undefined
        ? null
        : { url: request.broker.url, credential: minted.credential },
    expires_at: expiresAt,
  });
  return { id, node: request.node, token, expiresAt };
}

export interface PresentedToken {
  id: string;
  secret: string;
  /** The node the token is presented for (the enrol subject's node). */
  node: string;
}

/**
 * Spends a token for its node, once. Throws TokenRefused for every kind of refusal. Under concurrent spends of
 * one token exactly one caller succeeds: the final step is a compare-and-set in the store. Each refusal is kept in
 * the audit trail; given `refusals` (the control plane's), at most once a minute per node, with the count.
 */
export async function spendToken(
  store: Store,
  presented: PresentedToken,
  now: Date,
  refusals?: RefusalLedger,
): Promise<TokenRecord> {
  const token = await store.tokens.find(presented.id);
  const refuse = async (reason: TokenRefusalReason): Promise<never> => {
    // The id is the presenter's text: kept only when it has the shape of an id, so it cannot fill the trail.
    const detail = { token: boundText(presented.id, 64), presented_for: presented.node };
    const undo: TakeBack = [];
    const event =
      refusals === undefined
        ? {
            at: now.toISOString(),
            kind: "token.refused",
            node: token?.node ?? null,
            epoch: null,
            detail: { ...detail, reason },
          }
        : refusals.note({ node: presented.node, kind: "token", reason, detail }, now, undo);
    if (event !== undefined) {
      try {
        await store.events.record(event);
      } catch (error) {
        // Not kept: told again at the next refusal.
        takeBack(undo);
        throw error;
      }
    }
    throw new TokenRefused(reason);
  };
  // The comparison runs even for an unknown id, so its timing says nothing about which ids exist.
  const matches = secretMatches(token?.secretHash ?? hashSecret(""), presented.secret);
  if (token === undefined || !matches) return refuse("unknown");
  const status = tokenStatus(token, now);
  if (status !== "valid") return refuse(status);
  if (token.node !== presented.node) return refuse("wrong_node");
  // The spend and its audit event land together or not at all.
  const spent = await store.transaction(async (tx) => {
    if (!(await tx.tokens.spend(token.id, now))) return false;
    await tx.events.record({
      at: now.toISOString(),
      kind: "token.spent",
      node: token.node,
      epoch: null,
      detail: { token: token.id },
    });
    return true;
  });
  if (!spent) {
    const after = await store.tokens.find(token.id);
    const lost = after === undefined ? "unknown" : tokenStatus(after, now);
    return refuse(lost === "valid" ? "spent" : lost);
  }
  return { ...token, spentAt: now.toISOString() };
}

export type RevokeOutcome = "revoked" | "unknown" | "already_ended";

/** Revokes a token in the store. The caller then has the broker refuse its identity (see syncRevocations). */
export async function revokeToken(
  store: Store,
  id: string,
  now: Date,
  epoch?: number,
): Promise<RevokeOutcome> {
  return store.transaction(async (tx) => {
    const token = await tx.tokens.find(id);
    if (token === undefined) return "unknown";
    if (!(await tx.tokens.revoke(id, now))) return "already_ended";
    await tx.events.record({
      at: now.toISOString(),
      kind: "token.revoked",
      node: token.node,
      epoch: epoch ?? null,
      detail: { token: id },
    });
    return "revoked";
  });
}

/** A token revoked in the store, and what the broker must be told so it refuses the token's identity now. */
export interface RevokedToken {
  outcome: RevokeOutcome;
  /** Every identity the broker must refuse now (the full current set). */
  revocations: Map<string, Date>;
  /** The token's broker user, when one was minted for it (its account ends at once on RabbitMQ). */
  user: string | undefined;
}

/** Revokes a token and reads what the broker must then refuse (`mesh token revoke`). */
export async function revokeTokenForBroker(
  store: Store,
  id: string,
  now: Date,
  epoch?: number,
): Promise<RevokedToken> {
  const outcome = await revokeToken(store, id, now, epoch);
  const credential = (await store.tokens.find(id))?.brokerCredential ?? null;
  return {
    outcome,
    revocations: await currentRevocations(store, now),
    user: credential === null ? undefined : brokerUserOf(credential),
  };
}

export function hashSecret(secret: string): string {
  return createHash("sha256").update(secret, "utf8").digest("hex");
}

function secretMatches(storedHash: string, presentedSecret: string): boolean {
  // Both sides are SHA-256 digests, so the lengths are equal whatever was presented.
  return timingSafeEqual(Buffer.from(storedHash, "hex"), Buffer.from(hashSecret(presentedSecret), "hex"));
}
