/**
 * Runs a commander program with the mesh's exit codes: 0 ok, 1 failure, 2 bad usage. The exit code follows the
 * error's code (the table in `errors.ts`). Every failure is one clear line on stderr; MESH_DEBUG=1 adds the stack
 * and causes.
 */
import { CommanderError } from "commander";
import type { Command } from "commander";
import { exitCodeOf, exitCodes, MeshError } from "../errors.js";
import { commandEnded } from "./deadline.js";
import { endQuietlyOnBrokenPipe } from "./output.js";

export { exitCodes } from "../errors.js";

export async function runProgram(program: Command, argv: readonly string[]): Promise<number> {
  endQuietlyOnBrokenPipe();
  const code = await runCommand(program, argv);
  commandEnded(code);
  return code;
}

async function runCommand(program: Command, argv: readonly string[]): Promise<number> {
  program.exitOverride();
  program.configureOutput({
    outputError: (text, write) => write(text.trim().replace(/\s*\n\s*/g, " ") + "\n"),
  });
  for (const command of allCommands(program)) {
    command.exitOverride();
    command.showSuggestionAfterError(true);
  }
  try {
    await program.parseAsync(argv, { from: "user" });
    return exitCodes.ok;
  } catch (error) {
    return exitCodeFor(error, program.name());
  }
}

function exitCodeFor(error: unknown, name: string): number {
  if (error instanceof CommanderError) {
    // Commander has already printed its message (unknown option, missing argument, …) or the help.
    if (error.code === "commander.helpDisplayed" || error.code === "commander.version") return exitCodes.ok;
    if (error.code === "commander.help" || error.code === "commander.executeSubCommandAsync") {
      return error.exitCode === 0 ? exitCodes.ok : exitCodes.usage;
    }
    return exitCodes.usage;
  }
  const message = error instanceof Error ? error.message : String(error);
  process.stderr.write(`${name}: ${message}\n`);
  if (process.env.MESH_DEBUG === "1" && error instanceof Error)
    process.stderr.write(`${describeDeep(error)}\n`);
  // An error the mesh did not raise on purpose (a bug, a driver error not converted at its adapter) is a failure.
  return error instanceof MeshError ? exitCodeOf(error.code) : exitCodes.failure;
}

function describeDeep(error: Error): string {
  const lines = [error.stack ?? error.message];
  let cause = error.cause;
  while (cause instanceof Error) {
    lines.push(`caused by: ${cause.stack ?? cause.message}`);
    cause = cause.cause;
  }
  return lines.join("\n");
}

function allCommands(command: Command): Command[] {
  return [command, ...command.commands.flatMap(allCommands)];
}
