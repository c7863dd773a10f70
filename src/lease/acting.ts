/**
 * How a one-shot command (`mesh declare`, `mesh token issue|revoke`, `mesh node retire`) acts: under the current
 * holder's epoch, or under a lease of its own, taken for the command and given back after it, when nobody holds one.
 * It never writes as a second controller beside a holder, and a controller that starts meanwhile stands by until the
 * command is done.
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { MeshError } from "../errors.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { EpochRecord } from "./holder.js";
import { LeaseHolder } from "./holder.js";
import type { LeaseBackend, LeaseTimings } from "./lease.js";
import { epochOf } from "./lease.js";

export interface LeaseAccess {
  backend: LeaseBackend;
  epochs: EpochRecord;
  timings: LeaseTimings;
  log: Logger;
}

/** What a command acts under. */
export interface Acting<Epoch extends number | undefined = number | undefined> {
  /**
   * The epoch the command acts under: the holder's, or its own lease's. Undefined only when nobody holds the lease,
   * it could not be taken, and the caller chose to act without an epoch.
   */
  epoch: Epoch;
  /** Whether the command may still act: its own lease still renewed, or the holder's lease still at `epoch`. */
  stillActing: () => Promise<boolean>;
  /**
   * Whether the command acts under a lease of its own: nobody else acts, so what the acting control plane would do
   * after the command's write (send a plan) is the command's to do.
   */
  own: boolean;
}

export type WithoutLease = "refuse" | "act";

export interface ActingPolicy<W extends WithoutLease = WithoutLease> {
  /** What did not happen when the command is refused, for its message: "nothing was declared". */
  nothingDone: string;
  /**
   * When nobody holds the lease and it cannot be taken (its store refuses writes, or cannot be reached at all):
   * `refuse` (what needs an epoch: a declaration cannot be signed without one), or `act` without an epoch (what a
   * controller without an epoch keeps doing too — tokens, retirements — so the mesh stays in touch).
   */
  withoutLease: W;
}

/** A command that refuses to act without a lease always has an epoch. */
export type ActingUnder<W extends WithoutLease> = W extends "refuse" ? Acting<number> : Acting;

/**
 * Runs `work` under the lease. `access` is a reason instead when there is no lease store to reach (no broker was
 * ever recorded, or it cannot be reached): the same as a lease that cannot be taken.
 */
export async function underLease<T, W extends WithoutLease>(
  access: LeaseAccess | { unreachable: string; log: Logger },
  policy: ActingPolicy<W>,
  work: (acting: ActingUnder<W>) => Promise<T>,
): Promise<T> {
  const unheld = (reason: string, cause?: unknown): Promise<T> => {
    if (policy.withoutLease === "refuse") {
      throw new MeshError(
        "no_lease",
        `nobody holds the lease and this command could not take one (${reason}); ${policy.nothingDone}`,
        { cause },
      );
    }
    access.log.warn("lease.acting_without_epoch", { reason });
    // Reached only under the "act" policy, whose work takes an Acting without an epoch.
    return work({ epoch: undefined, stillActing: () => Promise.resolve(true), own: false } as ActingUnder<W>);
  };
  if ("unreachable" in access) return unheld(access.unreachable);
  const { backend } = access;

  let current;
  try {
    current = await backend.read();
  } catch (error) {
    if (noAnswerInTime(error)) throw error;
    // Unreadable is not "nobody holds it": acting on a guess could make this command a second controller.
    if (policy.withoutLease === "refuse") return unheld(`it cannot be read: ${errorText(error)}`, error);
    throw new MeshError("no_lease", `the lease cannot be read (${errorText(error)}); ${policy.nothingDone}`, {
      cause: error,
    });
  }
  if (current !== undefined) {
    const epoch = epochOf(current);
    // Before each step: the holder's lease still at the epoch read here.
    const stillActing = async () => {
      const now = await backend.read();
      return now !== undefined && epochOf(now) === epoch;
    };
    return work({ epoch, stillActing, own: false });
  }

  const own = new LeaseHolder({
    backend,
    epochs: access.epochs,
    timings: access.timings,
    holder: { id: randomUUID(), host: hostname(), pid: process.pid, taken_at: new Date().toISOString() },
    log: access.log,
  });
  let taken: boolean;
  try {
    taken = await own.tryTake();
  } catch (error) {
    if (noAnswerInTime(error)) throw error;
    return unheld(errorText(error), error);
  }
  if (!taken || own.epoch === undefined) {
    throw new MeshError("lease_busy", `the lease changed hands as this command began; ${policy.nothingDone}`);
  }
  const epoch = own.epoch;
  try {
    return await work({ epoch, stillActing: () => Promise.resolve(own.canAct()), own: true });
  } finally {
    await own.release();
  }
}

/**
 * The lease's store did not answer within the command's deadline: the command ends there, as its caller asked,
 * rather than going on without an epoch past its deadline.
 */
function noAnswerInTime(error: unknown): boolean {
  return error instanceof MeshError && error.code === "timeout";
}
