export { openStore, Store } from "./open.js";
export type { StoreOptions } from "./open.js";
export { parseStoreUrl, redact } from "./url.js";
export type { Dialect, StoreLocation } from "./url.js";
export { nodeStates } from "./schema.js";
export type { NodeState } from "./schema.js";
export { tokenStatus, tokenStatuses } from "./tokens.js";
export type { NewToken, TokenRecord, TokenStatus } from "./tokens.js";
export type { Enrolment, FleetRecord, NodeRecord, NodeStanding } from "./nodes.js";
export type {
  DeclarationRecord,
  KeptItems,
  LatestOrder,
  LatestSent,
  NewDeclaration,
} from "./declarations.js";
export { itemsKeptUnusedMs, keptItems } from "./declarations.js";
export { digestKey, sequenceKey } from "./declarations.js";
export type { AccountRecord } from "./accounts.js";
export type { MeshEvent, SentInChunk, StoredEvent } from "./events.js";
export { declarationsSentEvent, declarationsSentIn, declarationsSentKind, eventWeight } from "./events.js";
export type { NoEpochController } from "./no-epoch.js";
export type { HearingGap, HearingRecord } from "./hearing.js";
export type { PlanRevision, PlanWrite } from "./plans.js";
