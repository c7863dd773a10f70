/** Reports as a node sends them before it was declared anything: about sequence 0, holding nothing. */
import { emptyDigest } from "../../src/link/index.js";
import type { Report } from "../../src/link/index.js";

export function reportOfNothing(node: string, reportSequence: number, sentAt: Date): Report {
  return {
    kind: "report",
    node,
    epoch: 0,
    sequence: 0,
    report_sequence: reportSequence,
    digest: emptyDigest,
    outcome: "applied",
    items: [],
    sent_at: sentAt.toISOString(),
  };
}
