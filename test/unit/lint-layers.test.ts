/**
 * The layers of src/ as lint rules: every row of the table in eslint.config.js is broken once by a deliberate
 * import (linted as if it sat in that part of src/), and each break is refused; so is an import cycle.
 */
import assert from "node:assert/strict";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { ESLint } from "eslint";
import type { Linter } from "eslint";
import { createTypeScriptImportResolver } from "eslint-import-resolver-typescript";
import importX from "eslint-plugin-import-x";
import tseslint from "typescript-eslint";
// @ts-expect-error -- the lint config is a plain script without type declarations
import { layerZones, layers } from "../../eslint.config.js";

const root = new URL("../../", import.meta.url).pathname;
const table = layers as Record<string, string[]>;
const zonesOf = layerZones as (root: string) => unknown[];

/** Only the import rules, with the zones compiled from the real table: no type-aware rules, so any path lints. */
function eslintWith(rules: Linter.RulesRecord): ESLint {
  return new ESLint({
    cwd: root,
    overrideConfigFile: true,
    overrideConfig: [
      {
        files: ["**/*.ts"],
        languageOptions: { parser: tseslint.parser },
        plugins: { "import-x": importX },
        settings: {
          "import-x/resolver-next": [createTypeScriptImportResolver({ project: "tsconfig.json" })],
          "import-x/parsers": { "@typescript-eslint/parser": [".ts"] },
        },
        rules,
      },
    ],
  });
}

/** A real module of `part` to import, so the import resolves as one in src/ would. */
function moduleOf(part: string): string {
  if (part.endsWith(".ts")) return part.replace(/\.ts$/, ".js");
  const file = readdirSync(join(root, "src", part)).find(
    (name) => name.endsWith(".ts") && statSync(join(root, "src", part, name)).isFile(),
  );
  assert.ok(file !== undefined, `src/${part} has a module`);
  return `${part}/${file.replace(/\.ts$/, ".js")}`;
}

test("lint layers — every part the table does not list for a part is refused to it", async () => {
  const eslint = eslintWith({ "import-x/no-restricted-paths": ["error", { zones: zonesOf("./src") }] });
  const parts = Object.keys(table);
  let broken = 0;
  for (const part of parts) {
    // A top-level module is linted as itself; a folder's fixture as a new module inside it.
    const here = part.endsWith(".ts") ? join(root, "src", part) : join(root, "src", part, "layer-fixture.ts");
    const prefix = part.endsWith(".ts") ? "./" : "../";
    for (const other of parts.filter((o) => o !== part)) {
      const [result] = await eslint.lintText(`import "${prefix}${moduleOf(other)}";\n`, { filePath: here });
      const refused = (result?.messages ?? []).some((m) => m.ruleId === "import-x/no-restricted-paths");
      const allowed = table[part]?.includes(other) ?? false;
      assert.equal(
        refused,
        !allowed,
        `src/${part} importing src/${other}: ${refused ? "refused" : "allowed"}`,
      );
      if (refused) broken += 1;
    }
  }
  // Every row breaks at least once (the top layer, cli, may import everything but nothing imports it).
  assert.ok(broken >= parts.length - 1, `${broken} refusals`);
});

test("lint layers — an import cycle is refused", async () => {
  const eslint = eslintWith({ "import-x/no-cycle": ["error", { ignoreExternal: true }] });
  const [result] = await eslint.lintFiles([join(root, "test/fixtures/lint/cycle/first.ts")]);
  assert.ok(
    (result?.messages ?? []).some((m) => m.ruleId === "import-x/no-cycle"),
    JSON.stringify(result?.messages),
  );
});

test("lint layers — the table names every part of src/", () => {
  const parts = readdirSync(join(root, "src")).filter(
    (name) => statSync(join(root, "src", name)).isDirectory() || name.endsWith(".ts"),
  );
  assert.deepEqual(
    parts.filter((name) => !(name in table)),
    [],
  );
});
