/**
 * `mesh-host join`: the node makes its own keys, presents its token on the token's own broker identity, and keeps
 * what the reply gives it — its name, its broker identity, the control plane's signing key, pinned — so it never
 * needs a person or a token again. Every refusal ends promptly with the same line the control plane uses.
 */
import type { EnrolmentBus } from "../bus/index.js";
import { BrokerRefusedIdentity, NobodyAnswers, newUserKey, openEnrolmentSide } from "../bus/index.js";
import { MeshError, TokenRefused, UsageError } from "../errors.js";
import { fingerprint, fingerprintsEqual } from "../keys/index.js";
import type { EnrolReply } from "../link/index.js";
import { ContractError, decodeToken, encodeMessage, parseEnrolReply, refusedUnread } from "../link/index.js";
import type { HostIdentity, StateStorage } from "./state.js";
import { HostState } from "./state.js";
import { machineProfile } from "./profile.js";
import type { MachineProfile } from "./profile.js";
import { meshVersion } from "../program/version.js";

/** Where the node's own broker user seed is kept in the state dir. */
export const brokerSeedFile = "broker-user.nk";

export interface JoinRequest {
  token: string;
  stateDir: string;
  labels: Record<string, string>;
  timeoutMs: number;
  /** Where the state dir's files are kept (default: on disk). */
  storage?: StateStorage;
  /** Facts a simulated node claims instead of this machine's own (the lab's `--profiles`). */
  simulated?: Partial<Pick<MachineProfile, "cpu" | "memory_mb" | "drivers">>;
  /** Told each time the question was turned away unread (or nobody answered) and is asked again after `pauseMs`. */
  askingAgain?: (why: string, pauseMs: number) => void;
}

export async function join(request: JoinRequest): Promise<HostIdentity> {
  let token;
  try {
    token = decodeToken(request.token);
  } catch (error) {
    if (error instanceof ContractError) throw new UsageError(error.reason, { cause: error });
    throw error;
  }
  if (token.broker === null) {
    throw new MeshError(
      "token_without_broker",
      "this token names no broker: issue it again once `mesh up` runs",
    );
  }
  // A token past its expiry is refused here, as the broker and the control plane would: the broker may accept
  // the identity for the moment it takes to notice the expiry and then drop the connection, which would read as a
  // broker failure instead of the one line every refusal gives.
  if (Date.parse(token.expires_at) <= Date.now()) throw new TokenRefused("expired");
  const state = new HostState(request.stateDir, request.storage);
  const existing = state.loadIdentity();
  if (existing !== undefined) {
    throw new MeshError(
      "already_joined",
      `this machine already joined as ${existing.node} (state in ${request.stateDir}); remove that dir to join again`,
    );
  }
  const keys = state.nodeKeys();
  // On NATS the node's broker identity is a user key it makes itself; RabbitMQ gives it a password instead.
  const brokerUser = token.broker.credential.type === "nats" ? newUserKey() : undefined;
  if (brokerUser !== undefined) state.saveSecret(brokerSeedFile, brokerUser.seed);

  const profile = { ...machineProfile(request.labels), ...request.simulated };
  const enrol = () =>
    encodeMessage({
      kind: "enrol",
      node: token.node,
      token_id: token.id,
      secret: token.secret,
      keys: {
        signing: keys.signingPublicKey,
        overlay: keys.overlayPublicKey,
        ...(brokerUser === undefined ? {} : { broker_user: brokerUser.publicKey }),
      },
      profile,
      agent_version: meshVersion(),
      sent_at: new Date().toISOString(),
    });

  let reply: EnrolReply;
  try {
    const bus = await openEnrolmentSide(token.broker.url, token.node, token.broker.credential, token.secret);
    try {
      reply = await askUntilRead(bus, enrol, request);
    } finally {
      await bus.close();
    }
  } catch (error) {
    // The broker itself refuses a spent, revoked or expired token's identity: the same refusal as any other.
    if (error instanceof BrokerRefusedIdentity) throw new TokenRefused("unknown");
    throw error;
  }
  if (!reply.accepted) {
    if (reply.reason === TokenRefused.text) throw new TokenRefused("unknown");
    throw new MeshError("enrol_refused", reply.reason);
  }
  // The control plane proves itself with the key the token pinned; anything else is not our control plane.
  if (
    !fingerprintsEqual(fingerprint(reply.signing_key), token.fingerprint) ||
    !fingerprintsEqual(reply.fingerprint, token.fingerprint)
  ) {
    throw new MeshError(
      "control_key_mismatch",
      "the control plane's signing key does not match the one the token pins",
    );
  }
  const identity: HostIdentity = {
    node: reply.node,
    queue: reply.queue,
    broker: reply.broker,
    signing_key: reply.signing_key,
    fingerprint: reply.fingerprint,
    joined_at: new Date().toISOString(),
  };
  state.saveIdentity(identity);
  // A machine rebuilt under its old name: what the mesh put here before, for the agent's first apply to sort out.
  if (reply.recovery !== undefined) state.saveSecret(recoveryFile, JSON.stringify(reply.recovery.items));
  return identity;
}

/** The recovery copy an enrolment brought, until the agent has adopted what it names. */
export const recoveryFile = "recovery.json";

/**
 * Asks until the question is read, within the join's timeout: when nobody answers (no control plane acts, as while
 * one takes over from another) or the one acting turned the question away unread (handing over, busy), the token is
 * untouched and the joiner asks again after a pause, as long as enough of the timeout is left for an answer; the
 * last of these is told when the time is up. Any other answer, and a question that was not answered in time, end the
 * asking: a question that may have been read is never asked again, as a second one could find the token spent by
 * the first. `clock` is for tests: when it is now (ms) and how a pause is waited out.
 */
export async function askUntilRead(
  bus: Pick<EnrolmentBus, "ask">,
  question: () => Uint8Array,
  request: Pick<JoinRequest, "timeoutMs" | "askingAgain">,
  clock: { now: () => number; sleep: (ms: number) => Promise<void> } = {
    now: () => performance.now(),
    sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
  },
): Promise<EnrolReply> {
  const startedAt = clock.now();
  const deadline = startedAt + request.timeoutMs;
  // A question asked with less than this left could be read and answered after the joiner gave up, spending the
  // token for nothing: it is not asked, and the join ends with why it was asking.
  const leastLeftMs = Math.min(askAgainAfterMs.leastLeft, request.timeoutMs / 2);
  for (let asked = 1; ; asked++) {
    const leftMs = Math.max(1, Math.ceil(deadline - clock.now()));
    let turnedAway: MeshError;
    try {
      const reply = parseEnrolReply(await bus.ask(question(), leftMs));
      if (reply.accepted || !refusedUnread(reply.reason)) return reply;
      turnedAway = new MeshError("enrol_refused", reply.reason);
    } catch (error) {
      if (!(error instanceof NobodyAnswers)) throw error;
      turnedAway = error;
    }
    const pauseMs = pauseBeforeAsking(asked);
    if (deadline - (clock.now() + pauseMs) < leastLeftMs) {
      const within = ((clock.now() - startedAt) / 1000).toFixed(1);
      const message = `${turnedAway.message} (asked ${asked === 1 ? "once" : `${asked} times`} in ${within} s)`;
      if (turnedAway instanceof NobodyAnswers) throw new NobodyAnswers(message, { cause: turnedAway });
      throw new MeshError(turnedAway.code, message, { cause: turnedAway });
    }
    request.askingAgain?.(turnedAway.message, pauseMs);
    await clock.sleep(pauseMs);
  }
}

/**
 * The first pause before asking again, and the longest; and how much of the join's timeout must be left after a
 * pause for the question to be asked (at most half the timeout).
 */
export const askAgainAfterMs = { first: 250, longest: 4000, leastLeft: 3000 };

/**
 * How long to wait before asking for the `asked + 1`th time: from a quarter second, doubled each time to 4 s, each
 * drawn between half and the whole of it, so machines turned away together do not all come back together.
 */
export function pauseBeforeAsking(asked: number, random: () => number = Math.random): number {
  const whole = Math.min(askAgainAfterMs.longest, askAgainAfterMs.first * 2 ** Math.max(0, asked - 1));
  return Math.round(whole / 2 + (random() * whole) / 2);
}
