/** `mesh node list`: which nodes are here, which are out of touch and for how long, which never spoke. */
import { z } from "zod";
import type { Command } from "commander";
import { fingerprint } from "../keys/index.js";
import { MeshError, UsageError } from "../errors.js";
import { nodeNameProblem } from "../link/index.js";
import { describeHearing, describeLiveness, livenessOf } from "../control/liveness.js";
import type { GlobalFlags } from "./context.js";
import { optionsFrom, tellBroker, withCommandLease, withStore } from "./context.js";
import { retireNode } from "../control/retire.js";
import { stdoutOutput } from "../program/output.js";

export function registerNodeCommands(program: Command): void {
  const node = program.command("node").description("the nodes of the mesh");

  node
    .command("list")
    .description("list nodes with their state and liveness")
    .option("--json", 'print [{"name","state","liveness","last_seen","out_of_touch_for_s"}]')
    .action(async (_flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const options = optionsFrom(globals);
      const now = new Date();
      const { nodes, hearing } = await withStore(options, async (store) => ({
        nodes: await store.nodes.list(),
        hearing: await store.hearing.read(),
      }));
      const rows = nodes.map((n) => {
        const reading = livenessOf(n.lastSeen, now, options.outOfTouchAfterMs, hearing);
        return { node: n, reading };
      });
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(
          rows.map(({ node: n, reading }) => ({
            name: n.name,
            state: n.state,
            liveness: reading.liveness,
            last_seen: n.lastSeen,
            out_of_touch_for_s: reading.outOfTouchForS,
          })),
        );
        return;
      }
      out.table(
        ["NAME", "STATE", "LIVENESS", "LAST SEEN"],
        rows.map(({ node: n, reading }) => [n.name, n.state, describeLiveness(reading), n.lastSeen ?? "-"]),
      );
      out.line(describeHearing(hearing, now));
    });

  node
    .command("show")
    .description("one node: record, liveness, keys, profile, last declaration, latest account, refusals")
    .argument("<node>", "the node's name")
    .option("--json", "print the same as one JSON object")
    .action(async (name: string, _flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      if (nodeNameProblem(name) !== undefined) throw new UsageError(`"${name}" is not a node name`);
      const options = optionsFrom(globals);
      const shown = await withStore(options, async (store) => {
        const record = await store.nodes.get(name);
        if (record === undefined) throw new MeshError("node_unknown", `no node named ${name}`);
        const declaration = await store.declarations.latest(name);
        const account = await store.accounts.recoveryCopy(name);
        const reading = livenessOf(
          record.lastSeen,
          new Date(),
          options.outOfTouchAfterMs,
          await store.hearing.read(),
        );
        const report = account === undefined ? undefined : shownReport(account.report);
        return {
          name: record.name,
          state: record.state,
          liveness: reading.liveness,
          last_seen: record.lastSeen,
          out_of_touch_for_s: reading.outOfTouchForS,
          enrolled_at: record.enrolledAt,
          keys: {
            signing: record.signingKey === null ? null : fingerprint(record.signingKey),
            overlay: record.overlayKey,
            broker_user: record.brokerUser,
          },
          profile: record.profile === null ? null : (JSON.parse(record.profile) as unknown),
          declaration:
            declaration === undefined
              ? null
              : {
                  sequence: declaration.sequence,
                  epoch: declaration.epoch,
                  sent_at: declaration.issuedAt,
                  digest: declaration.digest,
                },
          account:
            account === undefined
              ? null
              : {
                  outcome: account.outcome,
                  reason: report?.reason ?? null,
                  epoch: account.epoch,
                  sequence: account.sequence,
                  report_sequence: account.reportSequence,
                  digest: account.digest,
                  received_at: account.receivedAt,
                  items: report?.items ?? [],
                },
          refused: await store.counters.of(name),
        };
      });
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(shown);
        return;
      }
      const reading = { liveness: shown.liveness, outOfTouchForS: shown.out_of_touch_for_s };
      out.line(`node         ${shown.name} (${shown.state})`);
      out.line(
        `liveness     ${describeLiveness(reading)}${shown.last_seen === null ? "" : `, last seen ${shown.last_seen}`}`,
      );
      out.line(`signing key  ${shown.keys.signing ?? "-"}`);
      out.line(`overlay key  ${shown.keys.overlay ?? "-"}`);
      out.line(`profile      ${shown.profile === null ? "-" : JSON.stringify(shown.profile)}`);
      const d = shown.declaration;
      out.line(
        `declaration  ${d === null ? "none" : `sequence ${d.sequence}, epoch ${d.epoch}, sent ${d.sent_at}, ${d.digest}`}`,
      );
      const a = shown.account;
      out.line(
        `account      ${a === null ? "none" : `${a.outcome}${a.reason === null ? "" : ` (${a.reason})`}, report ${a.report_sequence ?? "-"}, received ${a.received_at}`}`,
      );
      const refused = Object.entries(shown.refused);
      out.line(
        `refused      ${refused.length === 0 ? "none" : refused.map(([k, v]) => `${k}=${v}`).join(" ")}`,
      );
    });

  node
    .command("retire")
    .description("retire a node: the broker refuses its identity from now on; its history is kept")
    .argument("<node>", "the node's name")
    .option("--json", 'print {"node","state"}')
    .action(async (name: string, _flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      if (nodeNameProblem(name) !== undefined) throw new UsageError(`"${name}" is not a node name`);
      const options = optionsFrom(globals);
      const revoked = await withStore(options, (store) =>
        withCommandLease(
          options,
          store,
          { nothingDone: "nothing was retired", withoutLease: "act" },
          ({ epoch }) => retireNode(store, name, new Date(), epoch),
        ),
      );
      await tellBroker(options, revoked, name);
      const out = stdoutOutput(globals.json === true);
      if (out.json) out.document({ node: name, state: "retired" });
      else out.line(`retired ${name}`);
    });
}

/**
 * What `node show` prints of a kept report: its reason and items, read leniently (a report kept under an older
 * contract still shows), but read, not cast: a stored text that is no report is said to be one.
 */
const shownReportSchema = z.object({ reason: z.string().optional(), items: z.unknown().optional() });

function shownReport(text: string): z.infer<typeof shownReportSchema> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new MeshError("store", `the kept report is not JSON: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const parsed = shownReportSchema.safeParse(value);
  if (!parsed.success) throw new MeshError("store", "the kept report is not a report");
  return parsed.data;
}
