/**
 * The benchmark's one table: each figure beside its baseline and their ratio, and, where a physical limit bounds
 * it (the signing rate of one core, the raw consumer, the lease's own life), beside that limit.
 */

export interface Figure {
  part: string;
  what: string;
  value: number;
  unit: string;
  /** What the figure is compared with, measured in the same run (or a stated target). */
  baseline?: { value: number; what: string };
  /** The physical limit the figure is bounded by, in its unit, measured in the same run. */
  limit?: { value: number; what: string };
  /** A target from the issue, e.g. "≤ 10 s". */
  target?: string;
  note?: string;
}

/** Numbers as a person reads them: 3 significant digits, thousands separated. */
export function formatNumber(value: number): string {
  if (!Number.isFinite(value)) return String(value);
  const abs = Math.abs(value);
  const digits = abs >= 100 ? 0 : abs >= 10 ? 1 : abs >= 1 ? 2 : 3;
  return value.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function ratioOf(figure: Figure, to: "baseline" | "limit" = "baseline"): string {
  const against = figure[to];
  if (against === undefined || against.value === 0) return "";
  return `${(figure.value / against.value).toFixed(2)}×`;
}

export function formatFigureTable(figures: readonly Figure[]): string {
  const headers = ["PART", "FIGURE", "VALUE", "BASELINE", "RATIO", "LIMIT", "OF LIMIT", "TARGET", "NOTE"];
  const beside = (f: Figure, against: { value: number; what: string } | undefined) =>
    against === undefined ? "" : `${formatNumber(against.value)} ${f.unit} (${against.what})`;
  const rows = figures.map((f) => [
    f.part,
    f.what,
    `${formatNumber(f.value)} ${f.unit}`.trim(),
    beside(f, f.baseline),
    ratioOf(f),
    beside(f, f.limit),
    ratioOf(f, "limit"),
    f.target ?? "",
    f.note ?? "",
  ]);
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, i) => cell.padEnd(widths[i] ?? 0))
      .join("  ")
      .trimEnd();
  return [line(headers), ...rows.map(line)].map((l) => `${l}\n`).join("");
}
