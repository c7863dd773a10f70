/**
 * The end of token accounts on a broker where an account does not end by itself (RabbitMQ has no account expiry).
 * A token's account must stop working when the token does:
 * - spent: once the joiner has had its answer, which it reads on the token's own connection — a short grace,
 *   then that one account is deleted;
 * - revoked: `mesh token revoke` deletes the account itself before it exits;
 * - expired: a timer to the earliest expiry among valid tokens sweeps at that moment. Tokens are issued by other
 *   processes (`mesh token issue`), so the store is looked at often for one expiring sooner than the timer.
 * A sweep of every token account against the store, every `sweepEveryMs`, is the safety net behind all three
 * (a revoke the broker did not hear, a control plane stopped within a grace).
 */
import type { ControlIdentities } from "../bus/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Store } from "../store/index.js";
import { brokerUserOf, tokensToKeep } from "./revocations.js";

export interface TokenSweepSettings {
  store: Store;
  identities: ControlIdentities;
  log: Logger;
  now: () => Date;
  /** How long a spent token's account outlives the enrolment's answer. */
  graceMs: number;
  /** How often every token account is checked against the store, whatever the timers. */
  sweepEveryMs: number;
  /** How often the store is looked at for a token, issued meanwhile, that expires before the armed timer. */
  lookEveryMs: number;
}

/** The longest delay a Node timer takes; a later expiry is armed again when this one fires. */
const longestTimerMs = 2 ** 31 - 1;

export class TokenSweep {
  private readonly intervals: NodeJS.Timeout[] = [];
  private expiry: { at: number; timer: NodeJS.Timeout } | undefined;
  /** Spent tokens' accounts waiting out the grace, by the broker credential kept for the token. */
  private readonly ending = new Map<string, NodeJS.Timeout>();
  private readonly inFlight = new Set<Promise<void>>();
  /** Sweeps run one after another: each lists every account, and two at once would only repeat each other. */
  private sweeping: Promise<void> = Promise.resolve();
  /** So do armings: one that read the store earlier must not set its timer after one that read it later. */
  private arming: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(private readonly settings: TokenSweepSettings) {}

  /**
   * Sweeps once now, then at every expiry and every `sweepEveryMs`. A sweep that fails is logged and the next is
   * made on time, the first too: a broker's API too busy to answer at a start (deleting thousands of spent tokens'
   * accounts after a large enrolment) must not stop the control plane from acting.
   */
  start(): void {
    if (!this.settings.identities.sweepsTokens || this.stopped) return;
    this.run("tokens.sweep", () => this.sweep());
    const { sweepEveryMs, lookEveryMs } = this.settings;
    this.intervals.push(
      setInterval(() => this.run("tokens.sweep", () => this.sweep()), sweepEveryMs),
      setInterval(() => this.run("tokens.look", () => this.arm()), lookEveryMs),
    );
  }

  /** A token was spent and its answer sent: its account ends once the joiner has had time to read the answer. */
  spent(token: { brokerCredential: string | null }): void {
    const credential = token.brokerCredential;
    if (!this.settings.identities.sweepsTokens || this.stopped || credential === null) return;
    clearTimeout(this.ending.get(credential));
    this.ending.set(
      credential,
      setTimeout(() => {
        this.ending.delete(credential);
        this.run("tokens.end", () => this.end(credential));
      }, this.settings.graceMs),
    );
    // The spent token may have been the one the expiry timer waited for.
    this.run("tokens.look", () => this.arm());
  }

  /** Stops the timers; accounts still within their grace are deleted now, as the control plane goes. */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const interval of this.intervals) clearInterval(interval);
    clearTimeout(this.expiry?.timer);
    this.expiry = undefined;
    const due = [...this.ending.keys()];
    for (const timer of this.ending.values()) clearTimeout(timer);
    this.ending.clear();
    // Their failures are said where they happened; here only their end is awaited.
    await Promise.allSettled([...this.inFlight, this.sweeping, this.arming]);
    for (const credential of due) {
      await this.end(credential).catch((error: unknown) =>
        this.settings.log.warn("tokens.end_failed", { error: errorText(error) }),
      );
    }
  }

  private async end(credential: string): Promise<void> {
    await this.settings.identities.endToken(brokerUserOf(credential));
  }

  private sweep(): Promise<void> {
    const work = async () => {
      // One queued behind a sweep the API held may find the control plane stopped: it asks the API nothing more.
      if (this.stopped) return;
      const { store, identities, log, now, graceMs } = this.settings;
      const swept = await identities.sweepTokens(() => tokensToKeep(store, now(), graceMs));
      if (swept > 0) log.info("tokens.swept", { accounts_deleted: swept });
      await this.arm();
    };
    // The next sweep runs whatever became of this one; this one's failure is its caller's to log.
    const run = this.sweeping.then(work, work);
    this.sweeping = run;
    return run;
  }

  /** Arms the expiry timer for the earliest expiry among valid tokens (none: no timer). */
  private arm(): Promise<void> {
    const run = this.arming.then(
      () => this.armNow(),
      () => this.armNow(),
    );
    this.arming = run;
    return run;
  }

  private async armNow(): Promise<void> {
    const next = await this.settings.store.tokens.nextExpiry(this.settings.now());
    if (this.stopped) return;
    const at = next === undefined ? undefined : Date.parse(next);
    if (at === this.expiry?.at) return;
    clearTimeout(this.expiry?.timer);
    this.expiry = undefined;
    if (at === undefined) return;
    const delay = Math.min(Math.max(0, at - this.settings.now().getTime()), longestTimerMs);
    const timer = setTimeout(() => {
      if (this.expiry?.timer === timer) this.expiry = undefined;
      this.run("tokens.sweep", () => this.sweep());
    }, delay);
    this.expiry = { at, timer };
  }

  private run(what: string, work: () => Promise<void>): void {
    if (this.stopped) return;
    const running: Promise<void> = work()
      .catch((error: unknown) => this.settings.log.error(`${what}.failed`, { error: errorText(error) }))
      .finally(() => this.inFlight.delete(running));
    this.inFlight.add(running);
  }
}
