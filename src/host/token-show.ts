/**
 * `mesh-host token show <token>`: what a pasted token says — which node it is for, until when, which control
 * plane key it pins — without its secret. A damaged paste is caught here rather than at join time.
 */
import type { Command } from "commander";
import { UsageError } from "../errors.js";
import { ContractError, decodeToken } from "../link/index.js";
import { stdoutOutput } from "../program/output.js";

export function registerTokenShow(program: Command): void {
  program
    .command("token")
    .description("inspect an enrolment token")
    .command("show")
    .description("show what a token is for, without its secret")
    .argument("<token>", "the token string from `mesh token issue`")
    .option("--json", 'print {"id","node","expires_at","fingerprint","broker"}')
    .action((token: string, flags: { json?: boolean }) => {
      let content;
      try {
        content = decodeToken(token);
      } catch (error) {
        if (error instanceof ContractError) throw new UsageError(error.reason, { cause: error });
        throw error;
      }
      const shown = {
        id: content.id,
        node: content.node,
        expires_at: content.expires_at,
        fingerprint: content.fingerprint,
        broker: content.broker?.url ?? null,
      };
      const out = stdoutOutput(flags.json === true);
      if (out.json) {
        out.document(shown);
        return;
      }
      out.line(`token        ${shown.id}`);
      out.line(`node         ${shown.node}`);
      out.line(`expires at   ${shown.expires_at}`);
      out.line(`control key  ${shown.fingerprint}`);
      out.line(`broker       ${shown.broker ?? "none yet (the control plane serves no broker)"}`);
    });
}
