/**
 * The tables of the control plane's memory, as Kysely sees them. Timestamps are ISO-8601 UTC strings in every
 * dialect (`Date.prototype.toISOString`), which sort and compare correctly as text in SQLite and PostgreSQL alike.
 */
import type { ColumnType, Generated } from "kysely";

export const nodeStates = ["invited", "enrolled", "retired"] as const;
export type NodeState = (typeof nodeStates)[number];

export interface NodeTable {
  name: string;
  state: NodeState;
  created_at: string;
  enrolled_at: string | null;
  retired_at: string | null;
  last_seen: string | null;
  /** The node's Ed25519 public key (base64 raw), sent at enrolment. */
  signing_key: string | null;
  /** The node's WireGuard-format overlay public key. */
  overlay_key: string | null;
  /** The node's own broker identity (a NATS user public key or an AMQP user name). */
  broker_user: string | null;
  /** The profile the node sent at enrolment, as JSON text. */
  profile: string | null;
  /** The last declaration sequence handed out for this node; the next one is this + 1. */
  declaration_sequence: number;
}

export interface TokenTable {
  id: string;
  node: string;
  /** SHA-256 of the secret, hex. The secret itself is never stored. */
  secret_hash: string;
  created_at: string;
  expires_at: string;
  spent_at: string | null;
  revoked_at: string | null;
  /** The broker identity minted for this token (JSON), filled by the broker that serves it; null until then. */
  broker_credential: string | null;
}

export interface DeclarationTable {
  node: string;
  sequence: number;
  epoch: number;
  issued_at: string;
  digest: string;
  /**
   * The signed envelope exactly as sent (JSON text): kept whole only by declarations from before their compositions
   * were kept apart. Later ones keep `items_key`, `signature` and `signer`, and the envelope is rebuilt from them.
   */
  envelope: string | null;
  /** The plan's units it was composed from (a JSON list of names). */
  units: Generated<string>;
  /** The key of its items' text in `declaration_items`. */
  items_key: string | null;
  /** The envelope's signature and signer (base64; `SHA256:…`). */
  signature: string | null;
  signer: string | null;
}

/** Each composition's items as its declarations carried them, kept once however many nodes were sent them. */
export interface DeclarationItemsTable {
  /** SHA-256 (hex) of `items`. */
  key: string;
  items: string;
  /** When a declaration last referred to it: a composition in use is never pruned, even between two writes. */
  used_at: string;
}

/**
 * A node's accounts, a ring of `historyLimit` places: each account is kept in place of the one that many older
 * (`slot` is `kept` modulo the limit), so a full history costs no delete.
 */
export interface AccountTable {
  node: string;
  slot: number;
  /** The account's number among the node's, from 1 up: the newest has the highest. */
  kept: number;
  received_at: string;
  epoch: number | null;
  sequence: number | null;
  report_sequence: number | null;
  digest: string;
  outcome: string;
  /** The report as received (JSON text): the node's recovery copy. */
  report: string;
}

/** Each node's newest account: its number and its place in the ring (`accounts`), and how many places it has. */
export interface AccountHeadTable {
  node: string;
  kept: number;
  slot: number;
  places: number;
}

export interface EventTable {
  id: Generated<number>;
  at: string;
  kind: string;
  node: string | null;
  epoch: number | null;
  /** Details of the decision (JSON text). */
  detail: string;
  /**
   * What the event counts for in the retention's bound (`eventWeight`), and the trail's count before it: given by the
   * retention, null until its next run (migration 0018). PostgreSQL returns each as text (a `bigint`).
   */
  weight: ColumnType<number | string, number, number>;
  counted_before: ColumnType<number | string | null, null | undefined, number>;
}

export interface ControllerEpochTable {
  epoch: number;
  taken_at: string;
  holder: string;
}

export interface NodeCounterTable {
  /** The node the counted messages named, or "*" when they named none that is valid. */
  node: string;
  name: string;
  value: number;
}

export interface RevokedIdentityTable {
  broker_user: string;
  node: string;
  since: string;
}

export interface ControllerLeaseTable {
  name: string;
  /** The holder's JSON, or null when nobody holds the lease. */
  holder: string | null;
  revision: number;
  expires_at: string | null;
}

export interface ControllerNoEpochTable {
  controller: string;
  host: string;
  pid: number;
  reason: string;
  since: string;
  /** Refreshed while the condition lasts; a row not refreshed for a while belongs to a controller that stopped. */
  seen_at: string;
}

export interface ControlHearingTable {
  key: string;
  heard_at: string;
  since: string;
}

export interface HearingGapTable {
  from_at: string;
  to_at: string;
}

export interface PlanTable {
  revision: number;
  plan: string;
  written_at: string;
  written_by: string;
  epoch: number;
}

export interface PlanConditionTable {
  unit: string;
  /** A count, or "every" for a unit on every match. */
  wanted: string;
  placed: number;
  reason: string;
  epoch: number;
  /** When this condition was first found (kept while it lasts). */
  since: string;
}

export interface PlanSentTable {
  name: string;
  revision: number;
  epoch: number;
  sent_at: string;
}

export interface OverlayAddressTable {
  node: string;
  address: string;
  since: string;
}

export interface Database {
  overlay_addresses: OverlayAddressTable;
  plans: PlanTable;
  plan_conditions: PlanConditionTable;
  plan_sent: PlanSentTable;
  control_hearing: ControlHearingTable;
  hearing_gaps: HearingGapTable;
  controller_no_epoch: ControllerNoEpochTable;
  controller_lease: ControllerLeaseTable;
  revoked_identities: RevokedIdentityTable;
  node_counters: NodeCounterTable;
  nodes: NodeTable;
  tokens: TokenTable;
  declarations: DeclarationTable;
  declaration_items: DeclarationItemsTable;
  accounts: AccountTable;
  account_heads: AccountHeadTable;
  events: EventTable;
  controller_epoch: ControllerEpochTable;
}
