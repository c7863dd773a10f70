/**
 * `mesh-host run`: the agent. It connects with the node's own identity and never needs a person again: the
 * connection reconnects by itself; every declaration is verified against the pinned key over the bytes received,
 * checked for its node and its order, applied, and reported; refusals are reported too; an alive goes out every
 * interval saying which declaration the node holds.
 */
import { join } from "node:path";
import type { NodeBus } from "../bus/index.js";
import { openNodeSide } from "../bus/index.js";
import { MeshError } from "../errors.js";
import type { KeyObject } from "node:crypto";
import { decodeSigningPublicKey, openDeclarationOffThread } from "../keys/index.js";
import type { Declaration, DeclaredItem, Report } from "../link/index.js";
import { declaredItemSchema } from "../link/index.js";
import {
  boundText,
  compareDeclarationOrder,
  emptyDigest,
  encodeMessage,
  parseDeclarationBytes,
  parseDeclarationEnvelope,
  parseReceipt,
} from "../link/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Drift, ItemResult } from "./appliers.js";
import { Appliers } from "./appliers.js";
import { FileApplier } from "./file-applier.js";
import { OverlayApplier } from "./overlay-applier.js";
import { ServiceApplier } from "./service-applier.js";
import { UserApplier } from "./user-applier.js";
import { brokerSeedFile, recoveryFile } from "./join.js";
import type { AppliedDeclaration, HostIdentity, StateStorage } from "./state.js";
import { HostState } from "./state.js";

/** What applies a declaration's items and says what became of each; and, changing nothing, what has drifted. */
export interface Applier {
  apply(items: readonly DeclaredItem[]): Promise<ItemResult[]>;
  verify?(items: readonly DeclaredItem[]): Promise<Drift[]>;
  close?(): Promise<void>;
  adopt?(ids: readonly string[]): Promise<void>;
}

/** Opens the node's side of the broker with its own identity (or, in the lab, a connection shared by lab nodes). */
export type OpenNodeBus = (identity: HostIdentity, seed: string | undefined) => Promise<NodeBus>;

export interface AgentSettings {
  stateDir: string;
  /** Where the file applier writes; unused when `applier` is given. */
  root: string;
  aliveEveryMs: number;
  log: Logger;
  /** Where the state dir's files are kept (default: on disk). */
  storage?: StateStorage;
  /** Default: the file applier under `root`, its record in the state dir. */
  applier?: Applier;
  /**
   * How often what the node holds is checked against its declaration and put back where it drifted (also at start
   * and when the declaration it holds arrives again); default 5 minutes. A failed item is tried again sooner, with
   * backoff from `retryFirstMs` (default 1 s) doubling up to this period.
   */
  verifyEveryMs?: number;
  retryFirstMs?: number;
  /** Default: the node's own connection, with the credential and seed it received when it joined. */
  openBus?: OpenNodeBus;
  /** Told what the agent did, as it does it (the lab and the benchmarks time convergence by it). */
  onEvent?: (event: AgentEvent) => void;
  /** A monotonic clock in milliseconds (default: performance.now; tests may drive it). */
  clock?: () => number;
}

/** A declaration applied, or the control plane's receipt for the report that was pending. */
export type AgentEvent =
  | { kind: "applied"; epoch: number; sequence: number }
  | { kind: "receipt"; report_sequence: number; verdict: "kept" | "refused" };

/** The items of the last report, kept so a refusal still says what the machine holds. */
const heldItemsFile = "held-items.json";
/** The items of the declaration last applied (as verified): what the drift check compares the machine with. */
const heldDeclarationFile = "held-declaration.json";
const defaultVerifyEveryMs = 5 * 60_000;
/** A report written but not yet stored by the broker: sent first on the next start, so none is ever lost. */
const pendingReportFile = "pending-report.json";

type ReportFields = Pick<Report, "epoch" | "sequence" | "digest" | "outcome" | "reason" | "items">;

const reportDecoder = new TextDecoder();

/** A report as it is sent: its text (as kept while it waits for its receipt), its bytes and its report_sequence. */
interface ComposedReport {
  text: string;
  bytes: Uint8Array;
  sequence: number | undefined;
}

export class Agent {
  private readonly state: HostState;
  private readonly identity: HostIdentity;
  private readonly applier: Applier;
  private bus: NodeBus | undefined;
  private aliveTimer: NodeJS.Timeout | undefined;
  /** Declarations are handled one at a time, in the order they arrive. */
  private queue: Promise<void> = Promise.resolve();
  private stopping = false;
  /** The control plane's signing key, pinned at enrolment: every declaration is checked against it. */
  private readonly pinnedKey: KeyObject;
  /** When the broker last took the pending report (by the clock); undefined until it has, in this run. */
  private reportSentAt: number | undefined;
  private readonly clock: () => number;
  private verifyTimer: NodeJS.Timeout | undefined;
  private retryTimer: NodeJS.Timeout | undefined;
  /** The wait before the next try of failed items; doubles with each failure, back to the first after success. */
  private retryDelayMs: number;
  /**
   * The report last composed. The pending report's file is the truth, read each time; while it holds this very text,
   * its sequence and bytes are taken from here rather than parsed and encoded again.
   */
  private composed: ComposedReport | undefined;

  constructor(private readonly settings: AgentSettings) {
    this.state = new HostState(settings.stateDir, settings.storage);
    const identity = this.state.loadIdentity();
    if (identity === undefined) {
      throw new MeshError(
        "not_joined",
        `this machine has not joined a mesh (no identity in ${settings.stateDir})`,
      );
    }
    this.identity = identity;
    this.pinnedKey = decodeSigningPublicKey(identity.signing_key);
    this.clock = settings.clock ?? (() => performance.now());
    this.applier =
      settings.applier ??
      new Appliers([
        // Users and groups first: the files after them may be owned by them.
        new UserApplier({ root: settings.root, stateDir: settings.stateDir, log: settings.log }),
        new FileApplier(settings.root, join(settings.stateDir, "file-applier.json")),
        // Services last: what they run as and read is in place before they start.
        new ServiceApplier({ stateDir: settings.stateDir, log: settings.log, accountsRoot: settings.root }),
        new OverlayApplier({ stateDir: settings.stateDir, log: settings.log }),
      ]);
    this.retryDelayMs = settings.retryFirstMs ?? 1000;
  }

  /** What this agent has sent and done since it started: the lab sums these over its nodes. */
  readonly counters = { alives: 0, reports: 0, applied: 0, refused: 0 };

  get node(): string {
    return this.identity.node;
  }

  /** The declaration last applied, and whether a report still waits for the control plane's receipt. */
  status(): { applied: AppliedDeclaration | undefined; reportPending: boolean } {
    return {
      applied: this.state.lastApplied(),
      reportPending: this.state.loadSecret(pendingReportFile) !== undefined,
    };
  }

  /**
   * Runs until stopped, or until the broker refuses the node's identity (it was retired, or joined again from another
   * state dir) — while running or at the first connection — which ends it with `identity_refused`. `onRunning` is
   * called once the agent is connected, listening and has said alive.
   */
  async run(onRunning?: () => void): Promise<void> {
    const seed = this.state.loadSecret(brokerSeedFile);
    const openOwn: OpenNodeBus = (identity, identitySeed) =>
      openNodeSide(
        identity.broker.url,
        identity.node,
        identity.broker.credential,
        identitySeed,
        this.settings.log,
      );
    const bus = await (this.settings.openBus ?? openOwn)(this.identity, seed).catch((error: unknown) => {
      throw identityRefusedOr(error, this.node);
    });
    this.bus = bus;
    if (this.stopping) {
      await bus.close();
      return;
    }
    await this.adoptRecovered();
    /** Why the node's consuming failed, if it did: the run ends with it, even while the connection stays up. */
    let consumeFailure: { error: unknown } | undefined;
    const consuming = bus
      .consumeNode((message) =>
        message.kind === "receipt" ? this.receive(message.body) : this.enqueue(message.body),
      )
      .catch(async (error: unknown) => {
        consumeFailure = { error };
        // Nothing more can arrive (the broker refused the node's subscription, say): the connection is closed, which
        // ends the wait below.
        await bus
          .close()
          .catch((closing: unknown) =>
            this.settings.log.warn("agent.close_failed", { error: errorText(closing) }),
          );
      });
    // The first alive is part of starting: if the node's own state cannot be read at all, run() ends with that
    // one-line failure (and the connection it opened is closed) rather than leave a node that looks connected.
    await this.tick().catch(async (error: unknown) => {
      await bus.close();
      throw error;
    });
    // Afterwards a tick that fails (a state file read that failed once, a publish that threw) is logged and tried
    // again at the next interval: the same work runs again then, and a node that can still take declarations must
    // not die of an alive. What ends run() is the broker refusing the node (`closed` below), not a timer.
    this.aliveTimer = setInterval(() => {
      this.tick().catch((error: unknown) =>
        this.settings.log.error("agent.tick_failed", {
          error: errorText(error),
          note: "tried again at the next interval",
        }),
      );
    }, this.settings.aliveEveryMs);
    this.settings.log.info("agent.running", { node: this.node, broker: this.identity.broker.url });
    onRunning?.();
    // What it holds is checked at once (a machine that was off may have drifted), then every period.
    void this.enqueueVerify();
    this.verifyTimer = setInterval(
      () => void this.enqueueVerify(),
      this.settings.verifyEveryMs ?? defaultVerifyEveryMs,
    );
    const closed = await bus.closed();
    clearInterval(this.aliveTimer);
    clearInterval(this.verifyTimer);
    clearTimeout(this.retryTimer);
    await consuming;
    if (consumeFailure !== undefined) throw identityRefusedOr(consumeFailure.error, this.node);
    if (closed !== undefined) throw identityRefusedOr(closed, this.node);
  }

  async stop(): Promise<void> {
    this.stopping = true;
    clearInterval(this.aliveTimer);
    clearInterval(this.verifyTimer);
    clearTimeout(this.retryTimer);
    await this.queue;
    await this.applier.close?.();
    await this.bus?.close();
  }

  /**
   * A machine rebuilt and joined again was told what its last account said it held: before any declaration is
   * applied, the appliers take those as their own (where they are found), so the declaration's apply keeps what
   * matches, removes what is no longer declared, and touches nothing else.
   */
  private async adoptRecovered(): Promise<void> {
    const text = this.state.loadSecret(recoveryFile);
    if (text === undefined) return;
    if (this.state.lastApplied() === undefined) {
      const ids = (JSON.parse(text) as Array<{ id: string }>).map((item) => item.id);
      await this.applier.adopt?.(ids);
      this.settings.log.info("agent.recovered", { node: this.node, items: ids.length });
    }
    this.state.removeSecret(recoveryFile);
  }

  /** The drift check, in line with the declarations: never at the same time as an apply. */
  private enqueueVerify(): Promise<void> {
    if (this.stopping) return Promise.resolve();
    this.queue = this.queue.then(() =>
      this.verifyHeld().catch((error: unknown) =>
        this.settings.log.error("agent.verify_failed", { error: errorText(error) }),
      ),
    );
    return this.queue;
  }

  /**
   * Compares what the machine holds with the declaration last applied; what drifted is put back, and what failed
   * last time is tried again. Either is reported (the same declaration, a new report), drift item by item.
   */
  private async verifyHeld(): Promise<void> {
    const last = this.state.lastApplied();
    const text = this.state.loadSecret(heldDeclarationFile);
    if (last === undefined || text === undefined || this.stopping) return;
    const items = declaredItemSchema.array().parse(JSON.parse(text));
    const previous = this.state.loadSecret(heldItemsFile);
    const failedBefore =
      previous !== undefined &&
      (JSON.parse(previous) as Array<{ state?: unknown }>).some((item) => item.state === "failed");
    const drifts = (await this.applier.verify?.(items)) ?? [];
    if (drifts.length === 0 && !failedBefore) return;
    const results = await this.applier.apply(items);
    const drifted = new Map(drifts.map((drift) => [drift.id, drift.what]));
    const reported = results.map((result) => {
      const what = drifted.get(result.id);
      return what === undefined ? result : { ...result, drift: boundText(what) };
    });
    if (drifts.length > 0) {
      this.settings.log.warn("agent.drift", {
        items: drifts.slice(0, 20).map((drift) => `${drift.id}: ${drift.what}`),
        count: drifts.length,
      });
    }
    await this.reportHeld(last, reported);
  }

  /** A new report of the declaration already held: after a repair, or a retry of what failed. */
  private async reportHeld(last: AppliedDeclaration, items: Report["items"]): Promise<void> {
    const failed = items.filter((item) => item.state === "failed");
    const report = this.composeReport({
      epoch: last.epoch,
      sequence: last.sequence,
      digest: last.digest,
      outcome: failed.length === 0 ? "applied" : "failed",
      ...(failed.length === 0 ? {} : { reason: `${failed.length} of ${items.length} item(s) failed` }),
      items,
    });
    this.state.saveSecret(heldItemsFile, JSON.stringify(items));
    this.scheduleRetry(failed.length > 0);
    await this.send(report);
  }

  /** After a failure, the failed items are tried again after a wait that doubles each time; success resets it. */
  private scheduleRetry(failed: boolean): void {
    clearTimeout(this.retryTimer);
    const first = this.settings.retryFirstMs ?? 1000;
    if (!failed) {
      this.retryDelayMs = first;
      return;
    }
    if (this.stopping) return;
    const delay = this.retryDelayMs;
    this.retryDelayMs = Math.min(delay * 2, this.settings.verifyEveryMs ?? defaultVerifyEveryMs);
    this.retryTimer = setTimeout(() => void this.enqueueVerify(), delay);
    this.retryTimer.unref();
  }

  private enqueue(body: Uint8Array): Promise<void> {
    // One declaration failing in an unexpected way (a state file that cannot be written) is logged and does not
    // stop the agent from taking the next one.
    this.queue = this.queue.then(() =>
      this.handle(body).catch((error: unknown) =>
        this.settings.log.error("agent.declaration_not_handled", { error: errorText(error) }),
      ),
    );
    return this.queue;
  }

  /**
   * Every interval: the pending report again once it has waited a whole interval for its receipt (and at once after
   * a start, when nobody knows whether the broker took it), then an alive. A report sent just before the alive is
   * not sent twice.
   */
  private async tick(): Promise<void> {
    const pending = this.state.loadSecret(pendingReportFile);
    const waited = this.reportSentAt === undefined ? Infinity : this.clock() - this.reportSentAt;
    if (pending !== undefined && waited >= this.settings.aliveEveryMs)
      await this.send(this.pendingReport(pending));
    await this.sayAlive();
  }

  /** A receipt for the pending report ends it; one for an older report changes nothing. */
  private receive(body: Uint8Array): Promise<void> {
    let receipt;
    try {
      receipt = parseReceipt(body);
    } catch (error) {
      this.settings.log.warn("agent.receipt_refused", { reason: errorText(error) });
      return Promise.resolve();
    }
    const text = this.state.loadSecret(pendingReportFile);
    if (text === undefined) return Promise.resolve();
    const sequence =
      this.composed?.text === text
        ? this.composed.sequence
        : this.state.loadReport(pendingReportFile)?.report_sequence;
    if (receipt.node === this.node && receipt.report_sequence === sequence) {
      this.state.removeSecret(pendingReportFile);
      this.settings.onEvent?.({
        kind: "receipt",
        report_sequence: receipt.report_sequence,
        verdict: receipt.verdict,
      });
      if (receipt.verdict === "refused") {
        this.settings.log.warn("agent.report_refused", { report_sequence: sequence, reason: receipt.reason });
      }
    }
    return Promise.resolve();
  }

  private async sayAlive(): Promise<void> {
    const applied = this.state.lastApplied();
    const alive = encodeMessage({
      kind: "alive",
      node: this.node,
      sent_at: new Date().toISOString(),
      holds: { epoch: applied?.epoch ?? 0, sequence: applied?.sequence ?? 0 },
    });
    this.counters.alives++;
    await this.bus
      ?.publishAlive(alive)
      .catch((error: unknown) => this.settings.log.warn("agent.alive_failed", { error: errorText(error) }));
  }

  /** Verifies before it parses: the signature covers the bytes as received, never a re-encoding of them. */
  async handle(body: Uint8Array): Promise<void> {
    let declaration: Declaration;
    try {
      const envelope = parseDeclarationEnvelope(body);
      const bytes = await openDeclarationOffThread(envelope, this.pinnedKey);
      declaration = parseDeclarationBytes(bytes);
    } catch (error) {
      return this.refuse(`declaration refused: ${errorText(error)}`);
    }
    if (declaration.node !== this.node) {
      return this.refuse(`declaration refused: it is for node ${declaration.node}, this is ${this.node}`);
    }
    const last = this.state.lastApplied();
    if (
      last !== undefined &&
      declaration.epoch === last.epoch &&
      declaration.sequence === last.sequence &&
      declaration.digest === last.digest
    ) {
      // The very declaration already applied, delivered again (a resend crossed our alive): nothing to apply, but
      // a moment to check that the machine still holds it.
      return this.verifyHeld();
    }
    if (last !== undefined && compareDeclarationOrder(declaration, last) <= 0) {
      return this.refuse(
        declaration.epoch < last.epoch
          ? `declaration refused: epoch ${declaration.epoch} is older than ${last.epoch}, the last applied`
          : `declaration refused: sequence ${declaration.sequence} is not newer than ${last.sequence}, the last applied`,
      );
    }

    let items: Report["items"];
    try {
      items = await this.applier.apply(declaration.items);
    } catch (error) {
      // The applier could not run at all (its root is unusable, its record unreadable): every item failed, and
      // the agent stays up to say so and to take the next declaration.
      const reason = errorText(error);
      items = declaration.items.map((item) => ({ id: item.id, state: "failed" as const, reason }));
    }
    const failed = items.filter((item) => item.state === "failed");
    // The report is on disk before the declaration counts as applied: a crash in between sends it on restart.
    const report = this.composeReport({
      epoch: declaration.epoch,
      sequence: declaration.sequence,
      digest: declaration.digest,
      outcome: failed.length === 0 ? "applied" : "failed",
      ...(failed.length === 0 ? {} : { reason: `${failed.length} of ${items.length} item(s) failed` }),
      items,
    });
    this.state.recordApplied({
      epoch: declaration.epoch,
      sequence: declaration.sequence,
      digest: declaration.digest,
    });
    this.state.saveSecret(heldItemsFile, JSON.stringify(items));
    this.state.saveSecret(heldDeclarationFile, JSON.stringify(declaration.items));
    this.scheduleRetry(failed.length > 0);
    if (failed.length === 0) {
      this.counters.applied++;
      this.settings.onEvent?.({ kind: "applied", epoch: declaration.epoch, sequence: declaration.sequence });
    }
    await this.send(report);
    const where = { sequence: declaration.sequence, epoch: declaration.epoch };
    if (failed.length === 0) this.settings.log.info("agent.applied", where);
    else
      this.settings.log.warn("agent.apply_failed", {
        ...where,
        failed: failed.map((f) => `${f.id}: ${f.reason ?? "?"}`),
      });
  }

  /** A refusal is reported with what the machine still holds, so the recovery copy never loses it. */
  private async refuse(reason: string): Promise<void> {
    this.settings.log.warn("agent.refused", { reason });
    this.counters.refused++;
    const last = this.state.lastApplied();
    const report = this.composeReport({
      epoch: last?.epoch ?? 0,
      sequence: last?.sequence ?? 0,
      digest: last?.digest ?? emptyDigest,
      outcome: "refused",
      reason,
      items: this.state.loadItems(heldItemsFile) ?? [],
    });
    await this.send(report);
  }

  /** Writes the next report, with the next report_sequence, as pending, and returns it. */
  private composeReport(fields: ReportFields): ComposedReport {
    const sequence = this.state.nextReportSequence();
    const bytes = encodeMessage({
      kind: "report",
      node: this.node,
      ...fields,
      // The contract bounds every reason; a tool's longer error is cut rather than the whole report refused.
      ...(fields.reason === undefined ? {} : { reason: boundText(fields.reason) }),
      items: fields.items.map((item) =>
        item.reason === undefined ? item : { ...item, reason: boundText(item.reason) },
      ),
      report_sequence: sequence,
      sent_at: new Date().toISOString(),
    });
    const text = reportDecoder.decode(bytes);
    this.state.saveSecret(pendingReportFile, text);
    this.composed = { text, bytes, sequence };
    return this.composed;
  }

  /** The pending report, as read from its file: as composed while the file holds that text. */
  private pendingReport(text: string): ComposedReport {
    if (this.composed?.text === text) return this.composed;
    const { report_sequence: sequence } = JSON.parse(text) as { report_sequence?: number };
    return { text, bytes: new TextEncoder().encode(text), sequence };
  }

  /**
   * Sends a report towards the control plane. It stays pending on disk until the control plane's receipt arrives,
   * and is sent again at each alive that finds it waited an interval since (the control plane takes a repeat of
   * the report it kept quietly).
   */
  private async send(report: ComposedReport): Promise<void> {
    if (this.stopping) return;
    const id = `${this.node}:${report.sequence ?? "unordered"}`;
    this.counters.reports++;
    const sentAt = this.clock();
    await this.bus?.publishReport(report.bytes).then(
      () => (this.reportSentAt = sentAt),
      (error: unknown) => {
        // Not taken: the next alive sends it again.
        this.reportSentAt = undefined;
        this.settings.log.warn("agent.report_not_sent", { report: id, error: errorText(error) });
      },
    );
  }
}

/**
 * The broker refusing the node's own identity is final: the node was retired, or joined again from another state
 * dir, and only a new token lets it back in. It ends the agent with a code of its own (exit 3), so a service manager
 * stops restarting it instead of knocking again and again; any other failure is left as it is, worth a restart.
 */
function identityRefusedOr(error: unknown, node: string): unknown {
  if (!(error instanceof MeshError) || error.code !== "broker_refused_identity") return error;
  return new MeshError(
    "identity_refused",
    `${error.message} (node ${node} was retired, or joined again elsewhere: only a new token lets it back in)`,
    { cause: error },
  );
}
