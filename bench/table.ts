/** The benchmark's one table: each figure beside its baseline, and their ratio. */

export interface Figure {
  part: string;
  what: string;
  value: number;
  unit: string;
  /** What the figure is compared with, measured in the same run (or a stated target). */
  baseline?: { value: number; what: string };
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

export function ratioOf(figure: Figure): string {
  if (figure.baseline === undefined || figure.baseline.value === 0) return "";
  return `${(figure.value / figure.baseline.value).toFixed(2)}×`;
}

export function formatFigureTable(figures: readonly Figure[]): string {
  const headers = ["PART", "FIGURE", "VALUE", "BASELINE", "RATIO", "TARGET", "NOTE"];
  const rows = figures.map((f) => [
    f.part,
    f.what,
    `${formatNumber(f.value)} ${f.unit}`.trim(),
    f.baseline === undefined ? "" : `${formatNumber(f.baseline.value)} ${f.unit} (${f.baseline.what})`,
    ratioOf(f),
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
