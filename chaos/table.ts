/** The suite's one table: a row per fault, each figure beside whether its check passed. */
import { formatNumber } from "../bench/table.js";
import type { FaultResult } from "./suite.js";

const headers = [
  "FAULT",
  "PAUSE",
  "ALL HERE AFTER",
  "REPORTS LOST",
  "FALSE OUT-OF-TOUCH",
  "DECLARATION CONVERGED AFTER",
  "RESULT",
];

export function formatChaosTable(results: readonly FaultResult[]): string {
  const seconds = (value: number | null) => (value === null ? "-" : `${formatNumber(value)} s`);
  const rows = results.map((r) => [
    r.fault,
    r.pause_ms === 0 ? "-" : `${formatNumber(r.pause_ms / 1000)} s`,
    seconds(r.all_here_s),
    r.reports_lost === null ? "-" : String(r.reports_lost),
    r.false_out_of_touch === null
      ? "-"
      : `${r.false_out_of_touch}${r.out_of_touch_seen.length === 0 ? "" : ` (${r.out_of_touch_seen.length} read)`}`,
    seconds(r.convergence_s),
    r.failures.length === 0 ? "passed" : "FAILED",
  ]);
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((row) => (row[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, i) => cell.padEnd(widths[i] ?? 0))
      .join("  ")
      .trimEnd();
  const failures = results.flatMap((r) => r.failures.map((failure) => `  ${r.fault}: ${failure}`));
  return [line(headers), ...rows.map(line), ...(failures.length === 0 ? [] : ["", "failures:", ...failures])]
    .map((l) => `${l}\n`)
    .join("");
}
