/**
 * `npm run package`: what a person copies to a machine that has only Node.js 20+. From the build (dist/bundle/) it
 * lays out `dist/package/mesh-<version>/` and packs it as `dist/package/mesh-<version>.tgz`:
 *
 *   bin/mesh.js, bin/mesh-host.js   the executables (`node bin/mesh.js …`), and bin/run-bundle.js that both use
 *   dist/bundle/                    one bundle per executable, the version baked in, and its V8 code cache
 *   node_modules/                   what `mesh` loads outside its bundle: better-sqlite3 with its compiled
 *                                   `build/Release/better_sqlite3.node`, pg, and what they load in turn
 *   package.json                    `"type": "module"` for bin/, the version, and the platform the native part was
 *                                   built for
 *
 * `mesh-host` needs none of node_modules: bin/mesh-host.js and run-bundle.js, dist/bundle/mesh-host.* and package.json
 * are a whole agent. `--out DIR` writes somewhere else than dist/package (the tests package into a temp dir of their own).
 */
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { parseArgs } from "node:util";

const root = resolve(new URL("../", import.meta.url).pathname);
const { values } = parseArgs({ options: { out: { type: "string" } } });
const out = resolve(values.out ?? join(root, "dist", "package"));
const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
const name = `mesh-${manifest.version}`;
const target = join(out, name);

/** What the `mesh` bundle leaves outside itself (scripts/bundle.mjs, `external`). */
const external = ["better-sqlite3", "pg"];
/**
 * Dependencies used only while installing, never loaded: better-sqlite3's install script fetches a prebuilt binary
 * with prebuild-install; the package carries the binary built here instead.
 */
const installOnly = new Set(["prebuild-install"]);
/** Of a package with a native part, only what it loads at run time (its C++ sources and build leftovers stay). */
const loadedFiles = {
  "better-sqlite3": (path) =>
    path === "package.json" ||
    path === "LICENSE" ||
    path === "lib" ||
    path.startsWith("lib/") ||
    path === "build" ||
    path === "build/Release" ||
    path === "build/Release/better_sqlite3.node",
};

for (const bundle of ["mesh.cjs", "mesh.cache", "mesh-host.cjs", "mesh-host.cache"]) {
  if (!existsSync(join(root, "dist", "bundle", bundle))) {
    console.error(`package: dist/bundle/${bundle} is missing; run npm run build first`);
    process.exit(1);
  }
}

rmSync(target, { recursive: true, force: true });
rmSync(`${target}.tgz`, { force: true });
mkdirSync(target, { recursive: true });

cpSync(join(root, "bin"), join(target, "bin"), { recursive: true });
cpSync(join(root, "dist", "bundle"), join(target, "dist", "bundle"), { recursive: true });
cpSync(join(root, "README.md"), join(target, "README.md"));

const copied = new Set();
for (const dependency of external) copyPackage(dependency, root);
if (!existsSync(join(target, "node_modules", "better-sqlite3", "build", "Release", "better_sqlite3.node"))) {
  console.error("package: better-sqlite3 has no build/Release/better_sqlite3.node; run npm ci");
  process.exit(1);
}

writeFileSync(
  join(target, "package.json"),
  `${JSON.stringify(
    {
      name: manifest.name,
      version: manifest.version,
      description: manifest.description,
      license: manifest.license,
      // bin/*.js are ES modules (the bundles they run are .cjs).
      type: "module",
      bin: manifest.bin,
      engines: manifest.engines,
      // better_sqlite3.node is compiled for one platform and one Node major (its ABI); mesh-host has no native part.
      native: { platform: process.platform, arch: process.arch, node_abi: process.versions.modules },
    },
    null,
    2,
  )}\n`,
);

execFileSync("tar", ["-C", out, "-czf", `${target}.tgz`, name]);
console.log(`${relative(process.cwd(), target)}/\n${relative(process.cwd(), target)}.tgz`);

/**
 * Copies the package `dependency` as Node would find it from `from` (its node_modules, then each parent's, up to
 * the project root), keeping its place under the project root so nested versions stay where Node looks for them;
 * then the packages it loads, in turn.
 */
function copyPackage(dependency, from) {
  const source = resolvePackage(dependency, from);
  if (source === undefined) throw new Error(`package: ${dependency} (needed by ${from}) is not installed`);
  if (copied.has(source)) return;
  copied.add(source);
  const keep = loadedFiles[dependency];
  cpSync(source, join(target, relative(root, source)), {
    recursive: true,
    // Its own nested node_modules are copied as dependencies, only those it loads.
    filter: (path) => {
      const inside = relative(source, path);
      if (inside === "") return true;
      if (inside.split("/").includes("node_modules")) return false;
      return keep === undefined || keep(inside);
    },
  });
  const own = JSON.parse(readFileSync(join(source, "package.json"), "utf8"));
  for (const next of Object.keys(own.dependencies ?? {})) {
    if (!installOnly.has(next)) copyPackage(next, source);
  }
  // An optional dependency that is not installed here is one the package does without.
  for (const next of Object.keys(own.optionalDependencies ?? {})) {
    if (resolvePackage(next, source) !== undefined) copyPackage(next, source);
  }
}

function resolvePackage(dependency, from) {
  for (let dir = from; ; dir = dirname(dir)) {
    const candidate = join(dir, "node_modules", dependency);
    if (existsSync(join(candidate, "package.json"))) return candidate;
    if (dir === root || dir === dirname(dir)) return undefined;
  }
}
