/**
 * The control plane's options, compiled once from four layers, each overriding the one before: defaults,
 * `mesh.yaml` in the data dir, `MESH_*` environment variables, command-line flags. Every default lives here.
 */
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { UsageError } from "../errors.js";
import { parseDuration } from "./duration.js";

export interface MeshOptions {
  /** The control plane's own state: keys, config, the default SQLite store. */
  dataDir: string;
  /** `sqlite:PATH` or `postgres://…`. */
  storeUrl: string;
  /** Silence longer than this makes a node out of touch. */
  outOfTouchAfterMs: number;
  /** How long a new token stays valid unless the command says otherwise. */
  tokenTtlMs: number;
  /** Declarations and accounts kept per node behind the latest. */
  historyLimit: number;
}

/** What may be set, by its name in mesh.yaml; the environment variable is MESH_ + the name in capitals. */
export interface MeshSettings {
  store?: string | undefined;
  out_of_touch_after?: string | undefined;
  token_ttl?: string | undefined;
  history_limit?: string | number | undefined;
}

const defaults = {
  dataDir: ".mesh",
  outOfTouchAfter: "45s",
  tokenTtl: "1h",
  historyLimit: 50,
} as const;

const settingNames = ["store", "out_of_touch_after", "token_ttl", "history_limit"] as const;

const fileSchema = z.strictObject({
  store: z.string().min(1).optional(),
  out_of_touch_after: z.string().min(1).optional(),
  token_ttl: z.string().min(1).optional(),
  history_limit: z.union([z.number(), z.string()]).optional(),
});

export interface CompileInput {
  /** `--data`, when given. */
  dataDir?: string | undefined;
  /** Settings from flags, when given. */
  flags: MeshSettings;
  env: NodeJS.ProcessEnv;
}

export function compileMeshOptions(input: CompileInput): MeshOptions {
  const dataDir = resolve(input.dataDir ?? nonEmpty(input.env.MESH_HOME) ?? defaults.dataDir);
  const file = readConfigFile(join(dataDir, "mesh.yaml"));
  const running = readRunningSettings(dataDir);
  const fromEnv: MeshSettings = Object.fromEntries(
    settingNames.map((name) => [name, nonEmpty(input.env[`MESH_${name.toUpperCase()}`])]),
  );
  const pick = <K extends keyof MeshSettings>(name: K): [MeshSettings[K], string] => {
    if (input.flags[name] !== undefined) return [input.flags[name], `--${name.replaceAll("_", "-")}`];
    if (fromEnv[name] !== undefined) return [fromEnv[name], `MESH_${name.toUpperCase()}`];
    if (running[name] !== undefined) return [running[name], `${runningFile} ${name}`];
    return [file[name], `mesh.yaml ${name}`];
  };

  const [store] = pick("store");
  const [outOfTouch, outOfTouchSource] = pick("out_of_touch_after");
  const [tokenTtl, tokenTtlSource] = pick("token_ttl");
  const [history, historySource] = pick("history_limit");
  return {
    dataDir,
    storeUrl: store ?? `sqlite:${join(dataDir, "mesh.db")}`,
    outOfTouchAfterMs: parseDuration(outOfTouch ?? defaults.outOfTouchAfter, outOfTouchSource),
    tokenTtlMs: parseDuration(tokenTtl ?? defaults.tokenTtl, tokenTtlSource),
    historyLimit: history === undefined ? defaults.historyLimit : parseCount(history, historySource),
  };
}

/**
 * What the running control plane was started with, so every command shows what it acts on: the out-of-touch
 * threshold given to `mesh up` or `mesh serve` is the one `mesh node list` uses unless told otherwise.
 */
const runningFile = "running.json";
const runningSchema = z.strictObject({ out_of_touch_after: z.string().min(1) });

export function recordRunningSettings(options: MeshOptions): void {
  const path = join(options.dataDir, runningFile);
  writeFileSync(
    `${path}.tmp`,
    `${JSON.stringify({ out_of_touch_after: `${options.outOfTouchAfterMs}ms` })}\n`,
  );
  renameSync(`${path}.tmp`, path);
}

function readRunningSettings(dataDir: string): MeshSettings {
  const path = join(dataDir, runningFile);
  if (!existsSync(path)) return {};
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    throw new UsageError(`${path} is damaged: ${(error as Error).message}`, { cause: error });
  }
  const result = runningSchema.safeParse(value);
  if (!result.success) throw new UsageError(`${path} is damaged: ${result.error.issues[0]?.message ?? ""}`);
  return result.data;
}

function readConfigFile(path: string): MeshSettings {
  // No config file is the ordinary case: every setting has a default.
  if (!existsSync(path)) return {};
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new UsageError(`cannot read ${path}: ${(error as Error).message}`, { cause: error });
  }
  let parsed: unknown;
  try {
    parsed = parseYaml(text) ?? {};
  } catch (error) {
    throw new UsageError(`${path} is not valid YAML: ${(error as Error).message}`, { cause: error });
  }
  const result = fileSchema.safeParse(parsed);
  if (!result.success) {
    const issue = result.error.issues[0];
    throw new UsageError(`${path}: ${issue?.path.join(".") ?? ""} ${issue?.message ?? "is invalid"}`.trim());
  }
  return result.data;
}

function parseCount(value: string | number, source: string): number {
  const count = typeof value === "number" ? value : /^\d+$/.test(value.trim()) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(count) || count < 1) {
    throw new UsageError(`${source}: "${value}" must be a whole number of at least 1`);
  }
  return count;
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === "" ? undefined : value;
}
