/**
 * Bundles each command (`mesh`, `mesh-host`) into one file under dist/bundle/, from what tsc emitted. Loading one
 * file instead of some 600 modules (`mesh`; 250 for `mesh-host`) is most of a command's start: `mesh --version`
 * went from about 1.1 s to 0.3 s here, and every `mesh declare` and every agent start gains the same. The native SQLite driver and the
 * PostgreSQL driver stay outside the bundle and load from node_modules as before (`mesh` only: `mesh-host` needs
 * neither, so its bundle runs with no node_modules at all). The version is baked in (src/program/version.ts), so a
 * bundle needs nothing of the repository's layout.
 *
 * Each bundle is CommonJS, and gets V8's code cache beside it (`<name>.cache`), made by running the command once
 * (`--help`): compiling the bundle was the largest part of what was left of a start (`mesh --help` 0.338 s, 0.292 s
 * with the cache: means of 20 runs each, alternated). bin/run-bundle.js uses the cache only for the bundle it was
 * made from.
 */
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { build } from "esbuild";

const root = new URL("../", import.meta.url).pathname;
const { version } = JSON.parse(readFileSync(`${root}package.json`, "utf8"));
const entries = { mesh: "dist/cli/main.js", "mesh-host": "dist/host/main.js" };

// What an earlier build left (the ES module bundles of before, caches of other bundles) goes first.
rmSync(`${root}dist/bundle`, { recursive: true, force: true });
for (const [name, entry] of Object.entries(entries)) {
  await build({
    absWorkingDir: root,
    entryPoints: [entry],
    outfile: `dist/bundle/${name}.cjs`,
    bundle: true,
    platform: "node",
    format: "cjs",
    target: "node20",
    external: ["better-sqlite3", "pg"],
    // `await import("pg")` becomes a require() of it: a script run with a code cache has no loader for import().
    supported: { "dynamic-import": false },
    define: { MESH_BUILD_VERSION: JSON.stringify(version) },
    // import.meta is only read when no version is baked in (src/program/version.ts), which a bundle always has, and
    // where there is no `require` (src/store/checkpoints.ts), which a bundle always has too.
    logOverride: { "empty-import-meta": "silent" },
    // A map back to src/ (through tsc's own maps), read only under MESH_DEBUG=1: see bin/.
    sourcemap: "linked",
    sourcesContent: false,
    logLevel: "warning",
  });
  execFileSync(process.execPath, [`${root}bin/${name}.js`, "--help"], {
    env: { ...process.env, MESH_WRITE_CODE_CACHE: `${root}dist/bundle/${name}.cache` },
    stdio: "ignore",
  });
}
