/**
 * Bundles each command (`mesh`, `mesh-host`) into one file under dist/bundle/, from what tsc emitted. Loading one
 * file instead of some 600 modules (`mesh`; 250 for `mesh-host`) is most of a command's start: `mesh --version`
 * went from about 1.1 s to 0.3 s here, and every `mesh declare` and every agent start gains the same. The native SQLite driver and the
 * PostgreSQL driver stay outside the bundle and load from node_modules as before (`mesh` only: `mesh-host` needs
 * neither, so its bundle runs with no node_modules at all). The version is baked in (src/program/version.ts), so a
 * bundle needs nothing of the repository's layout.
 */
import { readFileSync } from "node:fs";
import { build } from "esbuild";

const root = new URL("../", import.meta.url).pathname;
const { version } = JSON.parse(readFileSync(`${root}package.json`, "utf8"));
const entries = { mesh: "dist/cli/main.js", "mesh-host": "dist/host/main.js" };

for (const [name, entry] of Object.entries(entries)) {
  await build({
    absWorkingDir: root,
    entryPoints: [entry],
    outfile: `dist/bundle/${name}.js`,
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    external: ["better-sqlite3", "pg"],
    define: { MESH_BUILD_VERSION: JSON.stringify(version) },
    // The CommonJS modules inside (amqplib, …) call require for Node's own modules; an ES module has none of its own.
    banner: {
      js: 'import { createRequire as createRequireOfBundle } from "node:module";\nconst require = createRequireOfBundle(import.meta.url);',
    },
    // A map back to src/ (through tsc's own maps), read only under MESH_DEBUG=1: see bin/.
    sourcemap: "linked",
    sourcesContent: false,
    logLevel: "warning",
  });
}
