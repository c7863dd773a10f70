/**
 * `mesh node list|show|retire`: which nodes are here, which are out of touch and for how long, which never spoke,
 * what units each was last sent and whether its latest account says it holds them.
 */
import { z } from "zod";
import type { Command } from "commander";
import { fingerprint } from "../keys/index.js";
import { MeshError, UsageError } from "../errors.js";
import { nodeNameProblem } from "../link/index.js";
import { labelKey } from "../link/messages.js";
import { holdingOf } from "../control/holding.js";
import { describeHearing, describeLiveness, livenessOf } from "../control/liveness.js";
import type { GlobalFlags } from "./context.js";
import { optionsFrom, tellBroker, withCommandLease, withStore } from "./context.js";
import { retireNode } from "../control/retire.js";
import { stdoutOutput } from "../program/output.js";

export function registerNodeCommands(program: Command): void {
  const node = program.command("node").description("the nodes of the mesh");

  node
    .command("list")
    .description("list nodes with their state, liveness, holding and units")
    .option(
      "--where <key=value>",
      "only nodes whose profile label KEY is VALUE (VALUE may be V1,V2: one of them); repeatable, all must hold",
      (text: string, earlier: string[]) => [...earlier, text],
      [],
    )
    .option(
      "--json",
      'print [{"name","state","liveness","last_seen","out_of_touch_for_s","units","holding"}]',
    )
    .action(async (flags: { where: string[] }, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      // Checked before the store is opened: a mistyped filter says so instead of listing nothing.
      const wheres = flags.where.map(labelWhere);
      const options = optionsFrom(globals);
      const now = new Date();
      const { nodes, hearing, sent, accounts } = await withStore(options, async (store) => {
        const all = await store.nodes.list();
        const listed = wheres.length === 0 ? all : all.filter((n) => labelsMatch(wheres, n.name, n.profile));
        const names = listed.map((n) => n.name);
        // The whole list in one read each: a fleet of ten thousand is never asked about node by node.
        return {
          nodes: listed,
          hearing: await store.hearing.read(),
          sent: await store.declarations.latestSent(wheres.length === 0 ? undefined : names),
          accounts: await store.accounts.recoveryCopies(names),
        };
      });
      const rows = nodes.map((n) => {
        const reading = livenessOf(n.lastSeen, now, options.outOfTouchAfterMs, hearing);
        const last = sent.get(n.name);
        return {
          node: n,
          reading,
          units: last?.units ?? [],
          holding: holdingOf(last, accounts.get(n.name)),
        };
      });
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(
          rows.map(({ node: n, reading, units, holding }) => ({
            name: n.name,
            state: n.state,
            liveness: reading.liveness,
            last_seen: n.lastSeen,
            out_of_touch_for_s: reading.outOfTouchForS,
            units,
            holding,
          })),
        );
        return;
      }
      // HOLDING and UNITS last: the units list is the one cell of no fixed width.
      out.table(
        ["NAME", "STATE", "LIVENESS", "LAST SEEN", "HOLDING", "UNITS"],
        rows.map(({ node: n, reading, units, holding }) => [
          n.name,
          n.state,
          describeLiveness(reading),
          n.lastSeen ?? "-",
          holding,
          units.length === 0 ? "-" : units.join(","),
        ]),
      );
      out.line(describeHearing(hearing, now));
    });

  node
    .command("show")
    .description(
      "one node: record, liveness, keys, profile, last declaration, latest account, units, holding, refusals",
    )
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
          profile: record.profile === null ? null : storedJson(record.profile, `node ${name}'s profile`),
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
          units: declaration?.units ?? [],
          holding: holdingOf(declaration, account),
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
      out.line(`units        ${shown.units.length === 0 ? "-" : shown.units.join(", ")}`);
      out.line(`holding      ${shown.holding}`);
      // What the node last found drifted and put back, and how often it has repaired drift or tried failed items.
      const items = Array.isArray(a?.items) ? (a.items as Array<{ id?: unknown; drift?: unknown }>) : [];
      const drifted = items.filter((item) => typeof item.drift === "string");
      const repaired = shown.refused.drift_repaired ?? 0;
      const retried = shown.refused.declarations_failed ?? 0;
      out.line(
        `drift        ${drifted.length === 0 ? "none in the latest account" : drifted.map((item) => `${String(item.id)}: ${String(item.drift)}`).join("; ")}` +
          ` (${repaired} repaired in all; ${retried} failed report(s))`,
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

/** One `--where`: the label `key` must be one of `values`. */
interface LabelWhere {
  key: string;
  values: readonly string[];
}

/** Reads `--where KEY=VALUE` (VALUE may be `V1,V2`: one of them); a malformed one is a usage error naming it. */
function labelWhere(text: string): LabelWhere {
  const at = text.indexOf("=");
  if (at < 0) {
    throw new UsageError(
      `--where "${text}": expected KEY=VALUE, or KEY=V1,V2 for one of them (e.g. --where role=web)`,
    );
  }
  const key = text.slice(0, at);
  const checked = labelKey.safeParse(key);
  if (!checked.success) {
    const why = checked.error.issues[0]?.message ?? "expected a label key";
    throw new UsageError(`--where "${text}": "${key}" is not a label key (${why})`);
  }
  return { key, values: text.slice(at + 1).split(",") };
}

/** A stored profile's labels; the rest of the profile is not read. Checked at enrolment, read again, not cast. */
const profileLabelsSchema = z.object({ labels: z.record(z.string(), z.string()).default({}) });

/** Whether a node's profile holds every `--where`. A node without a profile (invited) holds no label. */
function labelsMatch(wheres: readonly LabelWhere[], node: string, profile: string | null): boolean {
  if (profile === null) return false;
  const parsed = profileLabelsSchema.safeParse(storedJson(profile, `node ${node}'s profile`));
  if (!parsed.success) {
    throw new MeshError(
      "store",
      `node ${node}'s stored profile holds no labels map: ${parsed.error.message}`,
    );
  }
  const labels = parsed.data.labels;
  return wheres.every(({ key, values }) => Object.hasOwn(labels, key) && values.includes(labels[key] ?? ""));
}

/** A JSON text kept in the store, parsed; one that is no JSON is said to be damaged, naming `what`. */
function storedJson(text: string, what: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new MeshError("store", `${what} in the store is not JSON: ${(error as Error).message}`, {
      cause: error,
    });
  }
}

/**
 * What `node show` prints of a kept report: its reason and items, read leniently (a report kept under an older
 * contract still shows), but read, not cast: a stored text that is no report is said to be one.
 */
const shownReportSchema = z.object({ reason: z.string().optional(), items: z.unknown().optional() });

function shownReport(text: string): z.infer<typeof shownReportSchema> {
  const parsed = shownReportSchema.safeParse(storedJson(text, "the kept report"));
  if (!parsed.success) throw new MeshError("store", "the kept report is not a report");
  return parsed.data;
}
