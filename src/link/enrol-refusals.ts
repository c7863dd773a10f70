/**
 * The refusals of an enrolment that read nothing of it: the control plane turned the question away before looking
 * at the token, so the token is as it was and the joiner may ask again, of whoever acts then. The control plane
 * answers with these texts exactly, and `mesh-host join` asks again when it reads one of them.
 */

/** While the control plane's gate is closed: it is giving the lease up, or has not made sure of it yet. */
export const handingOver = "the control plane is handing over; try again";
/** While as many questions of the same node as the control plane lets wait are waiting. */
export const busyWithNode = "the control plane is still answering this node's earlier enrolments; try again";
/** While the questions waiting, all nodes together, hold as many bytes as the control plane lets wait. */
export const busyWithAll = "the control plane is answering many enrolments; try again";

const unread: ReadonlySet<string> = new Set([handingOver, busyWithNode, busyWithAll]);

/** Whether a refusal's reason says the question was not read, so asking again cannot spend the token twice. */
export function refusedUnread(reason: string): boolean {
  return unread.has(reason);
}
