/**
 * The wire contract: every message kind and its schema, every name on the broker, the writers table compiled into
 * broker permissions, and the ordering rule for reports.
 */
export { boundText, fitsBytes, reasonMaxBytes } from "./bounds.js";
export { busyWithAll, busyWithNode, handingOver, refusedUnread } from "./enrol-refusals.js";
export { ContractError } from "./errors.js";
export {
  anyNodeSubjectToken,
  assertNodeName,
  controlQueue,
  controlQueueKinds,
  controlRoutingKey,
  controlSubject,
  declarationSubject,
  defaultExchange,
  defaultExchangeResource,
  eventRoutingKey,
  eventSubject,
  inboxPrefix,
  isNodeName,
  meshExchange,
  natsPattern,
  nodeNameProblem,
  nodeOfSubject,
  nodeQueue,
  nodeSubjects,
  readControlSubject,
  receiptSubject,
} from "./names.js";
export type { ControlQueueKind } from "./names.js";
export {
  aliveSchema,
  declarationEnvelopeSchema,
  declarationSchema,
  enrolReplySchema,
  enrolSchema,
  messageKinds,
  messageSchemas,
  nodeCredentialSchema,
  reportSchema,
} from "./messages.js";
export type {
  Alive,
  Receipt,
  Declaration,
  DeclarationEnvelope,
  DeclaredItem,
  Enrol,
  EnrolReply,
  Message,
  MessageKind,
  MessageOf,
  NodeCredential,
  Report,
} from "./messages.js";
export type { CheckedItems, DeclarationEncoder, DeclarationHeader, KeptDeclaration } from "./parse.js";
export {
  declarationEncoder,
  encodeMessage,
  encodeReceipt,
  envelopeText,
  envelopeWithinBound,
  envelopeWrapping,
  keptDeclarationText,
  maxMessageBytes,
  parseAlive,
  parseReceipt,
  parseDeclaration,
  parseDeclarationBytes,
  parseDeclarationEnvelope,
  parseEnrol,
  parseEnrolReply,
  parseMessage,
  parseReport,
  parseReportText,
} from "./parse.js";
export {
  escapeRegex,
  mayPublish,
  mayRead,
  natsPermissions,
  places,
  publishedKinds,
  rabbitPermissions,
  roles,
  writersTable,
} from "./writers.js";
export type {
  NatsPermissions,
  Place,
  PublishedKind,
  RabbitPermissions,
  Role,
  WritersRow,
  WritersTable,
} from "./writers.js";
export { decodeToken, encodeToken, tokenContentSchema, tokenCredentialSchema } from "./token-string.js";
export type { TokenContent, TokenCredential } from "./token-string.js";
export {
  accountOfReport,
  compareDeclarationOrder,
  compareOrder,
  judgeReport,
  olderThan,
  reportOrder,
} from "./ordering.js";
export type {
  DeclarationOrder,
  DeclarationOrderOfDigest,
  ReportAccount,
  ReportJudgement,
  ReportOrder,
} from "./ordering.js";
export { emptyDigest, itemsDigest, itemsTextDigest } from "./digest.js";
export { checkContents } from "./declaration-file.js";
export {
  declaredItemSchema,
  driverOf,
  fileContentMaxBytes,
  itemIdOf,
  itemsOfContents,
  plannedFileSchema,
  plannedGroupSchema,
  plannedServiceSchema,
  plannedUserSchema,
} from "./items.js";
export type { PlannedFile, PlannedGroup, PlannedService, PlannedUser } from "./items.js";
export { holderRecordSchema, parseHolderRecord } from "./lease-record.js";
export type { HolderRecord } from "./lease-record.js";
export {
  durationText,
  overlaySchema,
  planSchema,
  resourcesSchema,
  selectorSchema,
  unitContentsSchema,
  unitContentsShape,
  unitSchema,
} from "./plan.js";
export type { OverlayPlan, Plan, PlanUnit, Resources, Selector, UnitContents } from "./plan.js";
