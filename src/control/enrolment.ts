/**
 * Enrolment: a node presents its token (on a connection the broker already authenticated with the token's own
 * identity) and the public halves of the keys it made itself. The token is spent once; the node's claimed name is
 * never trusted — the token's node record wins and the reply says so. The node receives its own broker identity,
 * and the token's identity is revoked moments later, because a credential meant for one use must not live as long
 * as the node (the spent token is refused here from the first moment). A broker identity belongs to exactly one
 * node: a key another node holds (or held) is refused, or retiring one node would revoke the other.
 */
import type { BrokerIdentities, EnrolAnswer, EnrolRequest } from "../bus/index.js";
import { TokenRefused } from "../errors.js";
import type { SigningIdentity } from "../keys/index.js";
import { encodeSigningPublicKey } from "../keys/index.js";
import type { EnrolReply } from "../link/index.js";
import { boundText, ContractError, encodeMessage, nodeQueue, parseEnrol } from "../link/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Store } from "../store/index.js";
import type { OnceKept, RefusalLedger, TakeBack } from "./refusals.js";
import { settleKept, takeBack } from "./refusals.js";
import { spendToken } from "./tokens.js";

export interface EnrolmentContext {
  store: Store;
  broker: BrokerIdentities;
  signing: SigningIdentity;
  log: Logger;
  /** Tells refusals at most once a minute per node and kind (shared with ingest). */
  refusals: RefusalLedger;
  now: () => Date;
  /** Sends a node its latest declaration, if it has one (a machine rebuilt and enrolled again). */
  resendLatest: (node: string) => Promise<void>;
  /**
   * Has the broker's revocations brought up to date shortly (the spent token's identity, a rebuilt machine's old
   * one). Shortly, not at once: the joiner is still reading its reply on the token's connection, and many joins
   * at once share one update.
   */
  revokeSoon: () => void;
  /** The spent token's answer was sent: its broker account (RabbitMQ) ends once the joiner has read it. */
  tokenSpent: (token: { brokerCredential: string | null }) => void;
  /** The node's enrolment is committed: what ingest took as read about it (its standing, its reports) is stale. */
  enrolled: (node: string) => void;
}

export async function answerEnrolment(
  context: EnrolmentContext,
  request: EnrolRequest,
): Promise<EnrolAnswer> {
  const { store, log } = context;
  const now = context.now();
  // Bounded as a whole: a reason that quotes what the joiner sent, with words around it, still fits the reply.
  const refuse = (reason: string): EnrolAnswer => ({
    reply: encodeMessage({ kind: "enrol_reply", accepted: false, reason: boundText(reason) }),
  });

  /** Counted always; told (logged, kept as an event) at most once a minute for this node. */
  const tellRefusal = async (reason: string, detail?: Record<string, unknown>): Promise<void> => {
    const undo: TakeBack = [];
    const kept: OnceKept = [];
    const event = context.refusals.note(
      { node: request.node, kind: "enrol", reason, detail },
      now,
      undo,
      kept,
    );
    try {
      await store.transaction(async (tx) => {
        await tx.counters.add(request.node, "enrol_refused");
        if (event !== undefined) await tx.events.record(event);
      });
    } catch (error) {
      // Neither counted nor kept: told again at the next refusal.
      takeBack(undo);
      throw error;
    }
    settleKept(kept);
  };

  if (request.misrouted !== undefined) {
    await tellRefusal(request.misrouted);
    return refuse(TokenRefused.text);
  }

  let enrol;
  try {
    enrol = parseEnrol(request.body);
  } catch (error) {
    if (!(error instanceof ContractError)) throw error;
    await tellRefusal(`malformed: ${error.reason}`);
    return refuse(`enrolment refused: ${error.reason}`);
  }

  // The broker vouches for the node it routed the question from (the subject, or the token account's user_id);
  // a question naming another node comes from a token string that was changed. Nothing is spent for it.
  if (enrol.node !== request.node) {
    await tellRefusal(
      `the question names node ${enrol.node}, the broker says it comes from this node's token`,
    );
    return refuse(TokenRefused.text);
  }

  let token;
  try {
    token = await spendToken(
      store,
      { id: enrol.token_id, secret: enrol.secret, node: request.node },
      now,
      context.refusals,
    );
  } catch (error) {
    if (!(error instanceof TokenRefused)) throw error;
    return refuse(TokenRefused.text);
  }

  const node = token.node;
  const held = await keyHeldElsewhere(store, node, enrol.keys.broker_user);
  if (held !== undefined) {
    // The token is spent: whoever presented it tried to borrow another node's identity.
    await tellRefusal(held, { token: token.id });
    return refuse(TokenRefused.text);
  }

  try {
    const identity = await context.broker.forNode(node, enrol.keys.broker_user);
    // One transaction: the old identity refused, the new record and its audit line land together or not at all
    // (a node enrolled without its old identity revoked would leave that identity working).
    await store.transaction(async (tx) => {
      // A machine enrolling again replaces its identity; the one before must not keep working.
      const before = await tx.nodes.get(node);
      if (before?.brokerUser != null && before.brokerUser !== identity.user) {
        await tx.revokedIdentities.add(before.brokerUser, node, now.toISOString());
      }
      await tx.nodes.enrol(node, {
        signingKey: enrol.keys.signing,
        overlayKey: enrol.keys.overlay,
        brokerUser: identity.user,
        profile: JSON.stringify({ ...enrol.profile, agent_version: enrol.agent_version }),
        at: now.toISOString(),
      });
      await tx.events.record({
        at: now.toISOString(),
        kind: "node.enrolled",
        node,
        epoch: null,
        detail: { token: token.id, claimed_name: enrol.node, broker_user: identity.user },
      });
    });
    context.enrolled(node);
    log.info("node.enrolled", { node, claimed_name: enrol.node });
    const recovery = await recoveryOf(store, node);
    const reply: EnrolReply = {
      kind: "enrol_reply",
      accepted: true,
      node,
      queue: nodeQueue(node),
      broker: { url: context.broker.url, credential: identity.credential },
      signing_key: encodeSigningPublicKey(context.signing.publicKey),
      fingerprint: context.signing.fingerprint,
      ...(recovery === undefined ? {} : { recovery }),
    };
    return {
      reply: encodeMessage(reply),
      afterReply: async () => {
        context.revokeSoon();
        context.tokenSpent(token);
        await context.resendLatest(node);
      },
    };
  } catch (error) {
    // The token is spent by now; say so plainly rather than leave the node waiting.
    log.error("enrol.failed", { node: token.node, error: errorText(error) });
    return refuse("enrolment failed on the control plane; its log says why");
  }
}

/**
 * Why `brokerUser` cannot be this node's identity — another node holds it, or it was revoked from one — or undefined
 * when it can. The node's own current key may be presented again (a join retried on the same machine).
 */
async function keyHeldElsewhere(
  store: Store,
  node: string,
  brokerUser: string | undefined,
): Promise<string | undefined> {
  if (brokerUser === undefined) return undefined;
  const holder = await store.nodes.holderOfBrokerUser(brokerUser);
  if (holder !== undefined && holder !== node) return `its broker key is node ${holder}'s identity`;
  const revokedFrom = await store.revokedIdentities.nodeOf(brokerUser);
  if (revokedFrom !== undefined) return `its broker key was node ${revokedFrom}'s identity, revoked`;
  return undefined;
}

/**
 * The recovery copy as a joining machine is given it: the items its node's last account said it held (applied). A
 * rebuilt machine learns from it what the mesh put there, so it removes what is no longer declared and nothing else.
 */
async function recoveryOf(store: Store, node: string): Promise<{ items: Array<{ id: string }> } | undefined> {
  const copy = await store.accounts.recoveryCopy(node);
  if (copy === undefined) return undefined;
  const report = JSON.parse(copy.report) as { items?: unknown };
  const items = Array.isArray(report.items) ? (report.items as Array<{ id?: unknown; state?: unknown }>) : [];
  return {
    items: items
      .filter((item) => typeof item.id === "string" && item.state === "applied")
      .map((item) => ({ id: String(item.id) })),
  };
}
