/**
 * Every error the mesh raises on purpose is a MeshError with a stable `code`, so callers (and the CLI's exit
 * codes) can decide on the code rather than on message text. Driver errors are wrapped at the adapter with the
 * original passed on as `cause`.
 */
export class MeshError extends Error {
  readonly code: string;

  constructor(code: string, message: string, options?: { cause?: unknown }) {
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
