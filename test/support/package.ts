/**
 * The package of `npm run package`, made from the current build into a temp dir of its own (scripts/package.mjs
 * --out) and extracted from its tarball into another, outside the repository, as a person would on a machine: the
 * whole package for the control plane, and beside it a node's copy holding only what `mesh-host` needs.
 */
import { execFileSync } from "node:child_process";
import { cpSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { InstalledBins } from "./fleets.js";
import { tempDir } from "./tmp.js";

const root = new URL("../../", import.meta.url).pathname;

export interface ExtractedPackage {
  /** The version in the project's package.json: the package's name is `mesh-<version>`. */
  version: string;
  /** The tarball `scripts/package.mjs` made. */
  tarball: string;
  /** Where the tarball was extracted: `<temp>/mesh-<version>`. */
  dir: string;
  /** `mesh` from the package and `mesh-host` from the node's copy. */
  bins: InstalledBins;
  /** The node's copy: bin/mesh-host.js and run-bundle.js, dist/bundle/mesh-host.*, package.json — no node_modules. */
  hostOnly: string;
  remove(): void;
}

export function packageAndExtract(): ExtractedPackage {
  const { version } = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { version: string };
  const made = tempDir("mesh-package-");
  const machine = tempDir("mesh-machine-");
  try {
    execFileSync(process.execPath, [join(root, "scripts", "package.mjs"), "--out", made.path], {
      cwd: root,
      stdio: ["ignore", "ignore", "inherit"],
    });
    const tarball = join(made.path, `mesh-${version}.tgz`);
    execFileSync("tar", ["-C", machine.path, "-xzf", tarball]);
    const dir = join(machine.path, `mesh-${version}`);
    const hostOnly = join(machine.path, "node");
    for (const part of [
      "bin/mesh-host.js",
      "bin/run-bundle.js",
      "dist/bundle/mesh-host.cjs",
      "dist/bundle/mesh-host.cache",
      "package.json",
    ]) {
      cpSync(join(dir, part), join(hostOnly, part));
    }
    return {
      version,
      tarball,
      dir,
      bins: { mesh: join(dir, "bin", "mesh.js"), meshHost: join(hostOnly, "bin", "mesh-host.js") },
      hostOnly,
      remove: () => {
        made.remove();
        machine.remove();
      },
    };
  } catch (error) {
    made.remove();
    machine.remove();
    throw error;
  }
}
