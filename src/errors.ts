/**
 * Every error the mesh raises on purpose is a MeshError with a stable `code` from one closed table, so callers (and
 * the CLI's exit codes) decide on the code rather than on message text. Driver errors are wrapped at the adapter with
 * the original passed on as `cause`. The table is documented in README.md ("Error codes"); a unit test keeps the two
 * the same.
 */

/**
 * The CLI's exit codes: 0 ok, 1 a failure, 2 bad usage (which writes nothing), 3 the broker refused this node's
 * identity (retired, or joined again elsewhere). 3 is apart so a service manager can tell "restarting cannot help"
 * from a failure worth a restart (the systemd units name it in RestartPreventExitStatus=).
 */
export const exitCodes = { ok: 0, failure: 1, usage: 2, identityRefused: 3 } as const;
export type ExitCode = (typeof exitCodes)[keyof typeof exitCodes];

/** Every code a MeshError may carry: what it means, and the exit code of a command that ends on it. */
export const meshErrorCodes = {
  usage: {
    exit: exitCodes.usage,
    meaning: "bad input from a person: a flag, an argument, a URL, a config value",
  },
  contract: { exit: exitCodes.failure, meaning: "a message or token that breaks the wire contract" },
  keys: {
    exit: exitCodes.failure,
    meaning: "a bad signature, a mismatched key or a key file that cannot be used",
  },
  store: { exit: exitCodes.failure, meaning: "the store could not be opened, migrated or written" },
  token_refused: {
    exit: exitCodes.failure,
    meaning: "a token is unknown, spent, expired, revoked or not for this node (one text for all)",
  },
  token_unknown: { exit: exitCodes.failure, meaning: "no token has this id" },
  token_ended: { exit: exitCodes.failure, meaning: "the token is already spent, expired or revoked" },
  token_without_broker: { exit: exitCodes.failure, meaning: "the token names no broker to join through" },
  node_unknown: { exit: exitCodes.failure, meaning: "no node has this name" },
  node_retired: { exit: exitCodes.failure, meaning: "the node is retired" },
  node_not_enrollable: { exit: exitCodes.failure, meaning: "the node has no record or is retired" },
  no_nodes: { exit: exitCodes.failure, meaning: "no node is enrolled, so nothing was done" },
  declared_in_part: { exit: exitCodes.failure, meaning: "a declaration reached some nodes and then failed" },
  no_broker: { exit: exitCodes.failure, meaning: "no broker is recorded for this mesh" },
  broker_record: { exit: exitCodes.failure, meaning: "the recorded broker (broker.json) cannot be read" },
  broker: { exit: exitCodes.failure, meaning: "the broker failed or refused an operation" },
  broker_unreachable: { exit: exitCodes.failure, meaning: "the broker cannot be reached" },
  broker_refused_identity: {
    exit: exitCodes.failure,
    meaning: "the broker refused who we are, or what we did",
  },
  identity_refused: {
    exit: exitCodes.identityRefused,
    meaning: "the broker refused this node's identity: it was retired or joined again elsewhere",
  },
  nobody_answers: { exit: exitCodes.failure, meaning: "no control plane answers on the broker" },
  timeout: { exit: exitCodes.failure, meaning: "an answer did not come in time" },
  unsupported_broker: { exit: exitCodes.failure, meaning: "this broker cannot do what was asked" },
  nats_server_missing: { exit: exitCodes.failure, meaning: "nats-server is not installed" },
  nats_server_start: { exit: exitCodes.failure, meaning: "the mesh's own nats-server could not start" },
  nats_account_update: { exit: exitCodes.failure, meaning: "the NATS server refused an account update" },
  no_embedded_server: { exit: exitCodes.failure, meaning: "this mesh does not run its own nats-server" },
  port_taken: { exit: exitCodes.failure, meaning: "the port asked for is taken" },
  lab_identity_too_long: {
    exit: exitCodes.failure,
    meaning: "a lab node's identity does not fit a CONNECT line",
  },
  lab_failed: { exit: exitCodes.failure, meaning: "no lab node could join" },
  lease: { exit: exitCodes.failure, meaning: "the lease could not be read or written" },
  lease_lost: { exit: exitCodes.failure, meaning: "the control plane lost the lease and stopped acting" },
  lease_busy: { exit: exitCodes.failure, meaning: "the lease changed hands while a command acted" },
  lease_moved: {
    exit: exitCodes.failure,
    meaning: "the lease no longer stands at the epoch a command acts under",
  },
  no_lease: { exit: exitCodes.failure, meaning: "nobody holds the lease and this command could not take it" },
  fenced: {
    exit: exitCodes.failure,
    meaning: "the store refused a write whose epoch is below the floor: another controller took the lease",
  },
  plan_changed: {
    exit: exitCodes.failure,
    meaning: "the plan changed since the revision a write was based on",
  },
  plan_unknown: { exit: exitCodes.failure, meaning: "no plan revision by that number" },
  not_sent: {
    exit: exitCodes.failure,
    meaning: "the plan was written, and the control plane had not sent it when the command's deadline passed",
  },
  not_applied: {
    exit: exitCodes.failure,
    meaning: "with --wait: a node failed, refused or was out of touch, or the deadline passed first",
  },
  metrics: { exit: exitCodes.failure, meaning: "metrics could not be served" },
  stopped: { exit: exitCodes.failure, meaning: "the mesh stopped for a reason other than a signal" },
  host_state: { exit: exitCodes.failure, meaning: "the node's own state files are missing or damaged" },
  not_joined: { exit: exitCodes.failure, meaning: "this machine has not joined a mesh" },
  already_joined: { exit: exitCodes.failure, meaning: "this machine already joined a mesh" },
  enrol_incomplete: { exit: exitCodes.failure, meaning: "an enrolment lacks what the broker needs" },
  enrol_refused: { exit: exitCodes.failure, meaning: "the control plane refused the enrolment" },
  control_key_mismatch: {
    exit: exitCodes.failure,
    meaning: "the control plane's signing key is not the one the token pins",
  },
  applier: { exit: exitCodes.failure, meaning: "an item could not be applied on the node" },
  service_unit: {
    exit: exitCodes.failure,
    meaning: "a service unit could not be written, or systemctl refused it",
  },
  internal: { exit: exitCodes.failure, meaning: "a bug: something the code assumed did not hold" },
} as const satisfies Record<string, { exit: ExitCode; meaning: string }>;

export type MeshErrorCode = keyof typeof meshErrorCodes;

/** The exit code of a command that ends on an error with this code. */
export function exitCodeOf(code: MeshErrorCode): ExitCode {
  return meshErrorCodes[code].exit;
}

export class MeshError extends Error {
  readonly code: MeshErrorCode;

  constructor(code: MeshErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "MeshError";
    this.code = code;
  }
}

/** Bad input from a person: a flag, an argument, a config value. The CLI exits 2 on it. */
export class UsageError extends MeshError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("usage", message, options);
    this.name = "UsageError";
  }
}

/** The store could not be opened, migrated or written. */
export class StoreError extends MeshError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("store", message, options);
    this.name = "StoreError";
  }
}

/** A refusal that is the same text whatever its real reason, so guessing learns nothing. */
export class TokenRefused extends MeshError {
  static readonly text = "token refused: it is unknown, spent, expired, revoked or not for this node";

  /** The real reason, for the audit trail only; never shown to the one who presented the token. */
  readonly reason: TokenRefusalReason;

  constructor(reason: TokenRefusalReason) {
    super("token_refused", TokenRefused.text);
    this.name = "TokenRefused";
    this.reason = reason;
  }
}

export const tokenRefusalReasons = [
  "unknown",
  "spent",
  "expired",
  "revoked",
  "wrong_node",
  "malformed",
] as const;
export type TokenRefusalReason = (typeof tokenRefusalReasons)[number];

/** A message or key that is not what it claims to be: a bad signature, a mismatched key. */
export class KeyError extends MeshError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("keys", message, options);
    this.name = "KeyError";
  }
}
