/** Small statistics for the lab's summaries and the benchmarks: percentiles by the nearest-rank method. */

/** The p-th percentile (0 < p ≤ 100) of `values` by nearest rank; undefined for no values. */
export function percentile(values: readonly number[], p: number): number | undefined {
  if (!(p > 0 && p <= 100)) throw new RangeError(`percentile ${p} is not in (0, 100]`);
  if (values.length === 0) return undefined;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.max(0, rank - 1)];
}

export interface Spread {
  count: number;
  p50: number;
  p99: number;
  max: number;
}

/** Count, p50, p99 and max of `values`; undefined for no values. */
export function spread(values: readonly number[]): Spread | undefined {
  if (values.length === 0) return undefined;
  return {
    count: values.length,
    p50: percentile(values, 50) as number,
    p99: percentile(values, 99) as number,
    max: Math.max(...values),
  };
}
