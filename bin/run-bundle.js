// Runs a command's bundle, dist/bundle/<name>.cjs, with the V8 code cache made for it when it was built
// (dist/bundle/<name>.cache): V8 takes the code it compiled at build time instead of compiling the 3 MB bundle again
// at every start. The cache is used only for the very bundle it was made from (its SHA-256 heads the file) and by the
// very V8 that made it (V8 checks its own version and flags, and refuses it otherwise); without a usable cache the
// bundle compiles as it always did. MESH_DEBUG=1 loads the bundle through require() instead, with source maps on, so
// a failure's stack names src/ files and lines.
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";
import vm from "node:vm";

const hashLength = 32;

export function runBundle(name) {
  const bundle = fileURLToPath(new URL(`../dist/bundle/${name}.cjs`, import.meta.url));
  const require = createRequire(bundle);
  if (process.env.MESH_DEBUG === "1") {
    process.setSourceMapsEnabled(true);
    require(bundle);
    return;
  }
  const cacheFile = fileURLToPath(new URL(`../dist/bundle/${name}.cache`, import.meta.url));
  const source = readFileSync(bundle);
  const hash = createHash("sha256").update(source).digest();
  const cache = existsSync(cacheFile) ? readFileSync(cacheFile) : undefined;
  const cachedData =
    cache !== undefined && cache.length > hashLength && hash.equals(cache.subarray(0, hashLength))
      ? cache.subarray(hashLength)
      : undefined;
  const script = new vm.Script(
    `(function (exports, require, module, __filename, __dirname) {${source.toString("utf8")}\n})`,
    {
      filename: bundle,
      cachedData,
    },
  );
  // scripts/bundle.mjs makes the cache by running the command once with this set to the cache's path.
  const writeTo = process.env.MESH_WRITE_CODE_CACHE;
  if (writeTo !== undefined) {
    process.once("exit", () => writeFileSync(writeTo, Buffer.concat([hash, script.createCachedData()])));
  }
  const module = { exports: {} };
  // As Node runs a CommonJS module: `this` is its exports.
  script.runInThisContext().call(module.exports, module.exports, require, module, bundle, dirname(bundle));
}
