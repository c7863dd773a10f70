/**
 * Keeping the broker's revocations up to date. The broker may have started from an older preload (it is not always
 * ours to rewrite), so they are applied when the control plane starts acting and after every reconnection. After an
 * enrolment they are brought up to date shortly, not at once: the joiner is still reading its answer on the token's
 * connection, and a burst of joins shares one update. That update leaves out every token spent within the grace
 * (the burst's later joiners are still reading too) and brings them in with one more once their grace has passed,
 * and no sooner than one grace after it: a long burst gets one update per grace, not one per join. An update that
 * fails is logged and made again, each wait twice the last (from the grace, up to 30 s), until one gets through.
 */
import type { ControlIdentities } from "../bus/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Store } from "../store/index.js";
import { currentRevocations, retiredNodes, revocationsPastGrace } from "./revocations.js";

export interface RevocationSyncSettings {
  store: Store;
  identities: Pick<ControlIdentities, "revoke" | "forget">;
  log: Logger;
  now: () => Date;
  /**
   * How long `soon()` waits, and how long after its spending a token's identity is left alone: the token's grace,
   * so the joiner has its answer first.
   */
  debounceMs: number;
}

/** The longest wait before an update that failed is made again. */
const retryAtMostMs = 30_000;

export class RevocationSync {
  private timer: NodeJS.Timeout | undefined;
  /** Updates run one after another; a failure is logged and the next runs all the same. */
  private running: Promise<void> = Promise.resolve();
  private stopped = false;
  /** The wait before a failed update is made again: from `debounceMs`, doubled at each failure in a row. */
  private retryMs: number;

  constructor(private readonly settings: RevocationSyncSettings) {
    this.retryMs = Math.min(settings.debounceMs, retryAtMostMs);
  }

  /**
   * Applies every current revocation as the control plane starts acting. A failure (the broker's API too busy to
   * answer, a store error) is logged and the update made again later, not thrown: the control plane acts all the
   * same, and what it must revoke is revoked once the update gets through.
   */
  async start(): Promise<void> {
    await this.attempt(() => this.sync());
  }

  /** Applies every current revocation now, and forgets what the broker kept for retired nodes. */
  async sync(): Promise<void> {
    const { store, now } = this.settings;
    await this.apply(await currentRevocations(store, now()));
  }

  /** Runs one update; a failure is logged and another update armed. Resolves whether it succeeded. */
  private async attempt(update: () => Promise<void>): Promise<boolean> {
    try {
      await update();
      this.retryMs = Math.min(this.settings.debounceMs, retryAtMostMs);
      return true;
    } catch (error) {
      const again = !this.stopped && this.timer === undefined;
      this.settings.log.error("broker.revocations_not_applied", {
        error: errorText(error),
        ...(again ? { again_in_ms: this.retryMs } : {}),
      });
      if (again) {
        this.after(this.retryMs);
        this.retryMs = Math.min(this.retryMs * 2, retryAtMostMs);
      }
      return false;
    }
  }

  private async apply(revoked: Map<string, Date>): Promise<void> {
    const { store, identities } = this.settings;
    await identities.revoke(revoked);
    for (const node of await retiredNodes(store)) await identities.forget(node);
  }

  /** After a reconnection: applied again, and said so (or why not). */
  afterReconnect(): void {
    const { log } = this.settings;
    // A control plane that stopped acting has nothing to bring up to date (and its store may be closed).
    if (this.stopped) return;
    void this.attempt(() => this.sync()).then((applied) => {
      if (applied) log.info("broker.reconnected", { revocations: "applied again" });
    });
  }

  /**
   * Brings the revocations up to date once `debounceMs` has passed; asked again meanwhile, it is the same one. A
   * token spent within the grace at that moment is revoked by an update of its own when its grace ends.
   */
  soon(): void {
    if (this.timer !== undefined || this.stopped) return;
    this.after(this.settings.debounceMs);
  }

  private after(ms: number): void {
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.running = this.running.then(() => this.attempt(() => this.syncPastGrace())).then(() => undefined);
    }, ms);
  }

  private async syncPastGrace(): Promise<void> {
    const { store, now, debounceMs } = this.settings;
    const at = now();
    const { revoked, heldUntil } = await revocationsPastGrace(store, at, debounceMs);
    await this.apply(revoked);
    if (heldUntil !== undefined && this.timer === undefined && !this.stopped) {
      // No sooner than one grace after this update, however soon the next held token is due: while a fleet joins
      // there is always one about to be due, and each update is a pass over every ended token (on NATS, a new
      // account JWT for the server). So a burst gets one update per grace, and a token is revoked within two.
      this.after(Math.max(debounceMs, heldUntil.getTime() - at.getTime()));
    }
  }

  /** Settles when the updates begun so far have ended (each failure is logged, never thrown here). */
  settled(): Promise<void> {
    return this.running;
  }

  /** No update starts after this; one under way is waited for. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.running;
  }
}
