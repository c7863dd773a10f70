/**
 * `node --import tsx bench/readme-table.ts FILE…`: the figures of bench results (bench/results/*.json) as the
 * Markdown tables the README shows, one per run, headed by what was run where.
 */
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { z } from "zod";
import { formatNumber, ratioOf } from "./table.js";

const against = z.object({ value: z.number(), what: z.string() });
const resultSchema = z.object({
  commit: z.string(),
  dirty: z.boolean(),
  date: z.string(),
  node: z.string(),
  broker: z.string(),
  cores: z.number(),
  nodes: z.number(),
  figures: z.array(
    z.object({
      part: z.string(),
      what: z.string(),
      value: z.number(),
      unit: z.string(),
      baseline: against.optional(),
      limit: against.optional(),
      target: z.string().optional(),
    }),
  ),
});

const files = process.argv.slice(2);
if (files.length === 0) {
  process.stderr.write("usage: node --import tsx bench/readme-table.ts bench/results/FILE.json …\n");
  process.exit(2);
}
const cell = (text: string) => text.replaceAll("|", "\\|");
for (const file of files) {
  const result = resultSchema.parse(JSON.parse(readFileSync(file, "utf8")));
  process.stdout.write(
    `\`${basename(file)}\` — ${formatNumber(result.nodes)} nodes, ${result.broker}, commit ${result.commit}` +
      `${result.dirty ? " (with local changes)" : ""}, ${result.date.slice(0, 10)}, Node ${result.node}, ` +
      `${result.cores} cores\n\n`,
  );
  process.stdout.write(
    "| part | figure | value | beside | ratio | target |\n| --- | --- | --- | --- | --- | --- |\n",
  );
  for (const f of result.figures) {
    const beside = [
      f.baseline === undefined ? "" : `${formatNumber(f.baseline.value)} ${f.unit} (${f.baseline.what})`,
      f.limit === undefined ? "" : `limit ${formatNumber(f.limit.value)} ${f.unit} (${f.limit.what})`,
    ].filter((one) => one !== "");
    const ratios = [ratioOf(f), f.limit === undefined ? "" : `${ratioOf(f, "limit")} of limit`].filter(
      (one) => one !== "",
    );
    process.stdout.write(
      `| ${[
        f.part,
        f.what,
        `${formatNumber(f.value)} ${f.unit}`.trim(),
        beside.join("; "),
        ratios.join("; "),
        f.target ?? "",
      ]
        .map(cell)
        .join(" | ")} |\n`,
    );
  }
  process.stdout.write("\n");
}
