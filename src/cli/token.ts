/** `mesh token issue | list | revoke`: the one-time tokens that let a named machine in. */
import type { Command } from "commander";
import { parseDuration } from "../config/duration.js";
import { issueToken, revokeTokenForBroker } from "../control/tokens.js";
import { MeshError, UsageError } from "../errors.js";
import { nodeNameProblem } from "../link/index.js";
import { tokenStatus } from "../store/index.js";
import type { GlobalFlags } from "./context.js";
import {
  optionsFrom,
  recordedBroker,
  signingIdentity,
  tellBroker,
  withCommandLease,
  withStore,
} from "./context.js";
import { stdoutOutput } from "../program/output.js";

const tokenId = /^tok_[0-9a-f]{12}$/;

export function registerTokenCommands(program: Command): void {
  const token = program.command("token").description("issue, list and revoke one-time enrolment tokens");

  token
    .command("issue")
    .description("issue a one-time token for a node (creates the node record as invited)")
    .argument("<node>", "the node's name: a DNS label such as web-1")
    .option("--ttl <duration>", "how long the token stays valid, e.g. 15m, 1h, 2d (default 1h)")
    .option("--json", "print {node, token, expires_at}")
    .action(async (node: string, flags: { ttl?: string }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const problem = nodeNameProblem(node);
      if (problem !== undefined) {
        throw new UsageError(`"${node}" is not a node name (${problem.replace(/^node name [^:]*: /, "")})`);
      }
      const options = optionsFrom(globals);
      const ttlMs = flags.ttl === undefined ? options.tokenTtlMs : parseDuration(flags.ttl, "--ttl");
      const identity = signingIdentity(options);
      const broker = recordedBroker(options);
      // Under the lease like every command that writes what it fences; without an epoch when nobody can hold it,
      // as a controller without one still lets machines join.
      const issued = await withStore(options, (store) =>
        withCommandLease(
          options,
          store,
          { nothingDone: "no token was issued", withoutLease: "act" },
          ({ epoch }) =>
            issueToken(store, {
              node,
              ttlMs,
              fingerprint: identity.fingerprint,
              now: new Date(),
              broker,
              epoch,
            }),
        ),
      ).finally(() => broker?.close());
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document({ node: issued.node, token: issued.token, expires_at: issued.expiresAt });
        return;
      }
      out.line(`Token ${issued.id} for node ${issued.node}, valid until ${issued.expiresAt}, usable once:`);
      out.line("");
      out.line(`  ${issued.token}`);
      out.line("");
      out.line(
        broker === undefined
          ? "No broker is recorded yet (start one with `mesh up`); this token cannot join until then."
          : "On the machine:  mesh-host join <token>",
      );
      out.line("This is the only time the token is shown.");
    });

  token
    .command("list")
    .description("list tokens and whether each is valid, spent, expired or revoked (never the secret)")
    .option("--json", 'print [{"id","node","expires_at","status"}]')
    .action(async (_flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const options = optionsFrom(globals);
      const now = new Date();
      const tokens = await withStore(options, (store) => store.tokens.list());
      const rows = tokens.map((t) => ({
        id: t.id,
        node: t.node,
        expires_at: t.expiresAt,
        status: tokenStatus(t, now),
      }));
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(rows);
        return;
      }
      out.table(
        ["ID", "NODE", "EXPIRES", "STATUS"],
        rows.map((r) => [r.id, r.node, r.expires_at, r.status]),
      );
    });

  token
    .command("revoke")
    .description("revoke a token that has not been spent")
    .argument("<id>", "the token's id, as `mesh token list` shows it (tok_…)")
    .option("--json", 'print {"id","status"}')
    .action(async (id: string, _flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      if (!tokenId.test(id))
        throw new UsageError(`"${id}" is not a token id (they look like tok_0123456789ab)`);
      const options = optionsFrom(globals);
      const { outcome, revocations, user } = await withStore(options, (store) =>
        withCommandLease(
          options,
          store,
          { nothingDone: "nothing was revoked", withoutLease: "act" },
          ({ epoch }) => revokeTokenForBroker(store, id, new Date(), epoch),
        ),
      );
      switch (outcome) {
        case "unknown":
          throw new MeshError("token_unknown", `no token ${id}`);
        case "already_ended":
          throw new MeshError("token_ended", `token ${id} is already spent, expired or revoked`);
        case "revoked":
          break;
        default: {
          const unknown: never = outcome;
          throw new MeshError("internal", `unexpected revoke outcome ${String(unknown)}`);
        }
      }
      // The broker must refuse the token's identity before this command exits, not at its expiry nor at a sweep:
      // on RabbitMQ its account is deleted here, on NATS its user key is in the revocations pushed.
      await tellBroker(options, revocations, undefined, user);
      const out = stdoutOutput(globals.json === true);
      if (out.json) out.document({ id, status: "revoked" });
      else out.line(`revoked ${id}`);
    });
}
