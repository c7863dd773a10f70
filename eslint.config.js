// Lint rules for the mesh. The import boundaries keep each outside system behind its adapter (only src/bus/ talks
// to a broker client, only src/store/ to a SQL driver or Kysely), and the layers of src/ below say which part may
// import which: ARCHITECTURE.md's "may import" column is this table. Cycles between modules are refused too.
import js from "@eslint/js";
import { createTypeScriptImportResolver } from "eslint-import-resolver-typescript";
import importX from "eslint-plugin-import-x";
import tseslint from "typescript-eslint";

/**
 * The layers of src/: each folder (or top-level module) and the others it may import. Everything not listed for a
 * part is refused to it; test/fixtures/lint/layers/ breaks one row each, and test/unit/lint-layers.test.ts shows
 * each is refused.
 */
export const layers = {
  "errors.ts": [],
  "log.ts": [],
  link: ["errors.ts"],
  keys: ["errors.ts"],
  lease: ["errors.ts", "log.ts"],
  store: ["errors.ts", "log.ts", "link", "lease"],
  bus: ["errors.ts", "log.ts", "link", "keys", "lease"],
  config: ["errors.ts", "keys"],
  program: ["errors.ts", "log.ts"],
  control: ["errors.ts", "log.ts", "link", "keys", "lease", "store", "bus", "config"],
  host: ["errors.ts", "log.ts", "link", "keys", "bus", "config", "program"],
  lab: [
    "errors.ts",
    "log.ts",
    "link",
    "keys",
    "lease",
    "store",
    "bus",
    "config",
    "control",
    "host",
    "program",
  ],
  cli: [
    "errors.ts",
    "log.ts",
    "link",
    "keys",
    "lease",
    "store",
    "bus",
    "config",
    "control",
    "host",
    "lab",
    "program",
  ],
};

/** One zone per part and each part it may not import: `import-x/no-restricted-paths` refuses those imports. */
export function layerZones(root) {
  const parts = Object.keys(layers);
  return parts.flatMap((part) =>
    parts
      .filter((other) => other !== part && !layers[part].includes(other))
      .map((other) => ({
        target: `${root}/${part}`,
        from: `${root}/${other}`,
        message: `src/${part} may import only ${layers[part].map((p) => `src/${p}`).join(", ") || "nothing of the mesh"}.`,
      })),
  );
}

const brokerClients = ["nats", "nats/*", "@nats-io/*", "amqplib", "amqplib/*"];
const sqlDrivers = ["kysely", "kysely/*", "better-sqlite3", "pg", "pg/*", "pg-*"];

function forbid(groups, message) {
  return ["error", { patterns: [{ group: groups, message }] }];
}

export default tseslint.config(
  { ignores: ["dist/", "node_modules/", ".mesh/", "test/fixtures/", "bench/results/", "chaos/results/"] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // node:test's test() and describe() return promises the runner itself awaits.
      "@typescript-eslint/no-floating-promises": [
        "error",
        {
          allowForKnownSafeCalls: [
            { from: "package", package: "node:test", name: ["test", "describe", "it", "suite"] },
          ],
        },
      ],
      "@typescript-eslint/consistent-type-imports": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/switch-exhaustiveness-check": "error",
      "no-empty": ["error", { allowEmptyCatch: false }],
    },
  },
  {
    files: ["src/**/*.ts", "test/fixtures/lint/layers/**/*.ts"],
    plugins: { "import-x": importX },
    settings: {
      "import-x/resolver-next": [createTypeScriptImportResolver({ project: "tsconfig.json" })],
      // no-cycle reads the modules an import leads to, with the same parser.
      "import-x/parsers": { "@typescript-eslint/parser": [".ts"] },
    },
    rules: {
      "import-x/no-restricted-paths": ["error", { zones: layerZones("./src") }],
      "import-x/no-cycle": ["error", { ignoreExternal: true }],
    },
  },
  {
    files: ["src/**/*.ts"],
    ignores: ["src/bus/**", "src/store/**"],
    rules: {
      "no-restricted-imports": forbid(
        [...brokerClients, ...sqlDrivers],
        "Only src/bus/ may import a broker client and only src/store/ a SQL driver or Kysely.",
      ),
    },
  },
  {
    files: ["src/bus/**/*.ts"],
    rules: {
      "no-restricted-imports": forbid(sqlDrivers, "Only src/store/ may import a SQL driver or Kysely."),
    },
  },
  {
    files: ["src/store/**/*.ts"],
    rules: {
      "no-restricted-imports": forbid(brokerClients, "Only src/bus/ may import a broker client."),
    },
  },
  {
    files: ["**/*.js", "**/*.mjs"],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: { process: "readonly", console: "readonly", URL: "readonly" },
    },
  },
);
