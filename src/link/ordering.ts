import type { Report } from "./messages.js";

/**
 * The ordering contract for reports. A report older than the latest kept account is refused, never applied: the
 * kept account is the node's recovery copy, and an older one arriving late must not replace it.
 */

/** Where a report stands: the declaration's (epoch, sequence), then the node's own persisted report counter. */
export interface ReportOrder {
  epoch: number;
  sequence: number;
  report_sequence: number;
}

/** Where a declaration stands: the lease epoch it was composed under and its per-node sequence. */
export interface DeclarationOrder {
  epoch: number;
  sequence: number;
}

/** A report as the ordering rule sees it: its order when the agent sent one, and the declaration digest it is about. */
export interface ReportAccount {
  order?: ReportOrder;
  digest: string;
}

/** Looks up the (epoch, sequence) of the declaration with this digest, or undefined when no such one was sent. */
export type DeclarationOrderOfDigest = (digest: string) => DeclarationOrder | undefined;

/** The verdict on an incoming report. */
export type ReportJudgement = { verdict: "accept" } | { verdict: "refuse"; reason: string };

/** Compares two orders lexicographically over (epoch, sequence, report_sequence). */
export function compareOrder(a: ReportOrder, b: ReportOrder): -1 | 0 | 1 {
  return (
    compareNumbers(a.epoch, b.epoch) ||
    compareNumbers(a.sequence, b.sequence) ||
    compareNumbers(a.report_sequence, b.report_sequence)
  );
}

/** True when `a` comes strictly before `b`. */
export function olderThan(a: ReportOrder, b: ReportOrder): boolean {
  return compareOrder(a, b) < 0;
}

/** The ordering a report carries, or undefined for a report from an agent that sends none. */
export function reportOrder(report: Report): ReportOrder | undefined {
  const { epoch, sequence, report_sequence } = report;
  if (epoch === undefined || sequence === undefined || report_sequence === undefined) return undefined;
  return { epoch, sequence, report_sequence };
}

/** A report as the ordering rule sees it. */
export function accountOfReport(report: Report): ReportAccount {
  const order = reportOrder(report);
  return order === undefined ? { digest: report.digest } : { order, digest: report.digest };
}

const accept: ReportJudgement = { verdict: "accept" };

/**
 * Judges an incoming report against the latest kept account of the same node. Ordered reports must be strictly
 * newer. A report without ordering (from an older agent) is placed by the declaration its digest names, and so is a
 * kept account without ordering; such a report is accepted for the same declaration, since it cannot say which of
 * two accounts of one declaration came later.
 */
export function judgeReport(
  incoming: ReportAccount,
  kept: ReportAccount | undefined,
  declarationOrderOfDigest: DeclarationOrderOfDigest,
): ReportJudgement {
  if (kept === undefined) return accept;

  if (incoming.order !== undefined && kept.order !== undefined) {
    switch (compareOrder(incoming.order, kept.order)) {
      case 1:
        return accept;
      case 0:
        return refuse(`repeated: a report at ${showReport(incoming.order)} is already kept`);
      case -1:
        return refuse(
          `older: the report at ${showReport(incoming.order)} is older than the kept one at ${showReport(kept.order)}`,
        );
    }
  }

  let incomingDeclaration: DeclarationOrder;
  if (incoming.order !== undefined) {
    incomingDeclaration = incoming.order;
  } else {
    const found = declarationOrderOfDigest(incoming.digest);
    if (found === undefined) {
      return refuse(
        `unknown digest: the report is about ${incoming.digest}, which is no declaration sent to this node`,
      );
    }
    incomingDeclaration = found;
  }

  const keptDeclaration = kept.order ?? declarationOrderOfDigest(kept.digest);
  // A kept account whose declaration can no longer be found cannot be placed, so nothing shows the report is older.
  if (keptDeclaration === undefined) return accept;

  if (compareDeclarationOrder(incomingDeclaration, keptDeclaration) < 0) {
    return refuse(
      `older: the report is about the declaration at ${showDeclaration(incomingDeclaration)}, ` +
        `older than the kept account's at ${showDeclaration(keptDeclaration)}`,
    );
  }
  return accept;
}

/**
 * Compares two declarations' places in the control plane's order: by epoch, then by sequence within it. Every
 * "is this declaration newer" question (the node's, the resend of the latest, the lab's) is this one comparison.
 */
export function compareDeclarationOrder(a: DeclarationOrder, b: DeclarationOrder): -1 | 0 | 1 {
  return compareNumbers(a.epoch, b.epoch) || compareNumbers(a.sequence, b.sequence);
}

function compareNumbers(a: number, b: number): -1 | 0 | 1 {
  if (a < b) return -1;
  if (a > b) return 1;
  return 0;
}

function refuse(reason: string): ReportJudgement {
  return { verdict: "refuse", reason };
}

function showReport(order: ReportOrder): string {
  return `epoch ${order.epoch}, sequence ${order.sequence}, report ${order.report_sequence}`;
}

function showDeclaration(order: DeclarationOrder): string {
  return `epoch ${order.epoch}, sequence ${order.sequence}`;
}
