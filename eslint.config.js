// Lint rules for the mesh. The import boundaries keep each outside system behind its adapter:
// only src/bus/ talks to a broker client, only src/store/ talks to a SQL driver or Kysely.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

const brokerClients = ["nats", "nats/*", "@nats-io/*", "amqplib", "amqplib/*"];
const sqlDrivers = ["kysely", "kysely/*", "better-sqlite3", "pg", "pg/*", "pg-*"];

function forbid(groups, message) {
  return ["error", { patterns: [{ group: groups, message }] }];
}

export default tseslint.config(
  { ignores: ["dist/", "node_modules/", ".mesh/", "test/fixtures/", "bench/results/"] },
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
