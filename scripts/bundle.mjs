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
 *
 * Each bundle is written in ASCII only: a start reads the whole file into one string, and a file with a single
 * character outside ASCII becomes a string of two bytes per character, which took Node 14 ms for `mesh` against 6 ms
 * in ASCII, and V8 longer again to take it up. esbuild writes strings and names in ASCII already; what it leaves (a
 * regular expression's own characters, in our code and in a library's, and comments) is written here as the same
 * `\uXXXX` escapes, which mean the same in a regular expression as in a string. `mesh --version` 0.245 s before,
 * 0.23 s after; `mesh-host --version` 0.21 s, 0.19 s (16 and 6 runs, alternated). Left unminified: without comments
 * and indentation the bundle started a few ms sooner, but serve's roll-out to a held fleet of 1,000 nodes took 73 ms
 * in the median of 16 rounds against 66 ms, alternated on the same machine (62 ms over 10 rounds in ASCII alone).
 */
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { build } from "esbuild";

/**
 * Each UTF-16 unit outside ASCII written as its escape (a pair's two halves each: the same pair in a regular
 * expression with or without the `u` flag). Only left in regular expressions and comments by esbuild; the map back to
 * src/ is off by a few columns on the lines changed. One already behind a backslash would mean something else once
 * escaped: the build stops there instead.
 */
function asAscii(text, name) {
  return text.replace(/[\u0080-\uffff]/g, (unit, at) => {
    if (text[at - 1] === "\\") {
      throw new Error(
        `${name}: a character outside ASCII behind a backslash at ${at}: ${text.slice(at - 40, at + 10)}`,
      );
    }
    return `\\u${unit.charCodeAt(0).toString(16).padStart(4, "0")}`;
  });
}

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
    charset: "ascii",
    logLevel: "warning",
  });
  const file = `${root}dist/bundle/${name}.cjs`;
  const written = readFileSync(file, "utf8");
  const ascii = asAscii(written, `dist/bundle/${name}.cjs`);
  if (ascii !== written) writeFileSync(file, ascii);
  execFileSync(process.execPath, [`${root}bin/${name}.js`, "--help"], {
    env: { ...process.env, MESH_WRITE_CODE_CACHE: `${root}dist/bundle/${name}.cache` },
    stdio: "ignore",
  });
}
