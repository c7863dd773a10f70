#!/usr/bin/env node
/**
 * The empty-on-error lint: fails on a `catch` that turns an error into an empty answer — an empty catch block, or
 * one that returns nothing, `[]`, `{}`, `null`, `undefined`, an empty string, or an empty Map/Set — and on the
 * same thing written as a promise's `.catch(() => [])`. "I could not read the recovery copy" is not "the node
 * owns nothing".
 *
 * Usage: node scripts/lint-empty-catch.mjs DIR_OR_FILE…   (exit 1 and one line per finding when any is found)
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { pathToFileURL } from "node:url";
import ts from "typescript";

/** Whether an expression is an empty answer. */
function isEmptyValue(node) {
  if (node === undefined) return true;
  while (ts.isParenthesizedExpression(node) || ts.isAsExpression(node) || ts.isSatisfiesExpression(node)) {
    node = node.expression;
  }
  if (ts.isArrayLiteralExpression(node)) return node.elements.length === 0;
  if (ts.isObjectLiteralExpression(node)) return node.properties.length === 0;
  if (node.kind === ts.SyntaxKind.NullKeyword) return true;
  if (ts.isIdentifier(node) && node.text === "undefined") return true;
  if (ts.isVoidExpression(node)) return true;
  if (ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node)) return node.text === "";
  if (ts.isNewExpression(node) && ts.isIdentifier(node.expression)) {
    return ["Map", "Set", "Array"].includes(node.expression.text) && (node.arguments?.length ?? 0) === 0;
  }
  return false;
}

/** Return statements of a block that belong to it, not to functions nested inside. */
function ownReturns(block) {
  const found = [];
  const visit = (node) => {
    if (ts.isFunctionLike(node)) return;
    if (ts.isReturnStatement(node)) found.push(node);
    ts.forEachChild(node, visit);
  };
  ts.forEachChild(block, visit);
  return found;
}

function handlerReturnsEmpty(handler) {
  if (!ts.isArrowFunction(handler) && !ts.isFunctionExpression(handler)) return false;
  if (!ts.isBlock(handler.body)) return isEmptyValue(handler.body);
  if (handler.body.statements.length === 0) return true;
  return ownReturns(handler.body).some((ret) => isEmptyValue(ret.expression));
}

/** Findings in one source text: `{ line, message }`. */
export function findEmptyCatches(fileName, text) {
  const source = ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, true);
  const findings = [];
  const report = (node, message) => {
    const { line } = source.getLineAndCharacterOfPosition(node.getStart(source));
    findings.push({ line: line + 1, message });
  };
  const visit = (node) => {
    if (ts.isCatchClause(node)) {
      if (node.block.statements.length === 0) report(node, "empty catch block swallows the error");
      for (const ret of ownReturns(node.block)) {
        if (isEmptyValue(ret.expression)) report(ret, "catch returns an empty answer instead of the error");
      }
    }
    if (
      ts.isCallExpression(node) &&
      ts.isPropertyAccessExpression(node.expression) &&
      node.expression.name.text === "catch" &&
      node.arguments.length === 1 &&
      handlerReturnsEmpty(node.arguments[0])
    ) {
      report(node.expression.name, ".catch() turns the error into an empty answer");
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return findings;
}

function sourceFiles(path) {
  if (statSync(path).isFile()) return [path];
  return readdirSync(path, { withFileTypes: true }).flatMap((entry) => {
    if (entry.name === "node_modules" || entry.name === "dist") return [];
    const child = join(path, entry.name);
    if (entry.isDirectory()) return sourceFiles(child);
    return /\.(ts|mts|js|mjs)$/.test(entry.name) && !entry.name.endsWith(".d.ts") ? [child] : [];
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const roots = process.argv.slice(2);
  if (roots.length === 0) {
    console.error("usage: lint-empty-catch DIR_OR_FILE…");
    process.exit(2);
  }
  let count = 0;
  for (const file of roots.flatMap(sourceFiles)) {
    for (const finding of findEmptyCatches(file, readFileSync(file, "utf8"))) {
      console.error(`${relative(process.cwd(), file)}:${finding.line}: ${finding.message}`);
      count++;
    }
  }
  if (count > 0) {
    console.error(`${count} empty-on-error finding(s)`);
    process.exit(1);
  }
}
