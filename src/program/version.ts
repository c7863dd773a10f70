import { readFileSync } from "node:fs";

/**
 * Set by scripts/bundle.mjs (esbuild `define`) to the package's version, so a bundle copied anywhere — the package
 * from `npm run package`, or the file alone on a node — knows its version without a package.json beside it.
 */
declare const MESH_BUILD_VERSION: string | undefined;

/**
 * The package version: baked into the bundles at build time; read from package.json two levels up when running
 * from tsc's output (dist/program/) or the sources (src/program/), which only exist inside the repository.
 */
export function meshVersion(): string {
  if (typeof MESH_BUILD_VERSION === "string") return MESH_BUILD_VERSION;
  // Read once: a lab's thousand joins in one process each say the version.
  versionRead ??= (
    JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }
  ).version;
  return versionRead;
}

let versionRead: string | undefined;
