#!/usr/bin/env node
// Runs the test files below the given folders (default: test/) with node's own test runner.
// Node 20 takes no glob patterns after --test, so the files are listed here.
import { spawn } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";

function testFiles(path) {
  if (statSync(path).isFile()) return [path];
  return readdirSync(path, { withFileTypes: true })
    .filter((entry) => entry.name !== "fixtures")
    .flatMap((entry) => {
      const child = join(path, entry.name);
      if (entry.isDirectory()) return testFiles(child);
      return entry.name.endsWith(".test.ts") ? [child] : [];
    });
}

const roots = process.argv.slice(2).filter((arg) => !arg.startsWith("-"));
const passThrough = process.argv.slice(2).filter((arg) => arg.startsWith("-"));
const files = (roots.length > 0 ? roots : ["test"]).flatMap(testFiles).sort();
if (files.length === 0) {
  console.error("no test files found");
  process.exit(1);
}
// A test that hangs fails after five minutes with its name, instead of holding the whole run until CI gives up.
const timeout = passThrough.some((arg) => arg.startsWith("--test-timeout")) ? [] : ["--test-timeout=300000"];
const child = spawn(
  process.execPath,
  ["--import", "tsx", "--test", "--test-reporter=spec", ...timeout, ...passThrough, ...files],
  { stdio: "inherit" },
);
child.on("exit", (code, signal) => process.exit(signal ? 1 : (code ?? 1)));
