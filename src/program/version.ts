import { readFileSync } from "node:fs";

/**
 * The package version, read from package.json next to the build: two levels up from src/program/, dist/program/ and
 * dist/bundle/ alike (scripts/bundle.mjs keeps the bundles at that depth).
 */
export function meshVersion(): string {
  const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as {
    version: string;
  };
  return manifest.version;
}
