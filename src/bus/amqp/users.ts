/**
 * RabbitMQ user names of the mesh. The broker stamps every node publish with the publisher's user (`user_id`,
 * validated against the connection), so the name alone says which node — and in which role — sent a message.
 */
import { isNodeName } from "../../link/index.js";

const prefix = "mesh";
/** The control plane's own account. */
export const controlUser = `${prefix}.control`;

/** The account of one token: `mesh.token.<node>.<token id>`; its password is the token's secret. */
export function tokenUser(node: string, tokenId: string): string {
  return `${prefix}.token.${node}.${tokenId}`;
}

/** The account of one enrolment of a node: `mesh.node.<node>.<suffix>`, fresh at every enrolment. */
export function nodeUser(node: string, suffix: string): string {
  return `${prefix}.node.${node}.${suffix}`;
}

/** Reads a user name the mesh made: its role and node, or undefined for any other name. */
export function readUser(user: string | undefined): { role: "token" | "node"; node: string } | undefined {
  if (user === undefined) return undefined;
  const parts = user.split(".");
  if (parts.length !== 4 || parts[0] !== prefix) return undefined;
  const [, role, node, suffix] = parts;
  if ((role !== "token" && role !== "node") || !isNodeName(node) || !/^[A-Za-z0-9_-]+$/.test(suffix ?? "")) {
    return undefined;
  }
  return { role, node };
}

/** True for a token account of this mesh (the expiry sweep looks only at those). */
export function isTokenUser(user: string): boolean {
  return readUser(user)?.role === "token";
}
