/**
 * RabbitMQ user names of one mesh. Users are global to a broker while a mesh lives in one vhost, so every name
 * starts with the mesh's prefix (`mesh-` and a digest of the vhost): two meshes on one broker never share an
 * account. The broker stamps every node publish with the publisher's user (`user_id`, validated against the
 * connection), so the name alone says which node — and in which role — sent a message.
 */
import { createHash } from "node:crypto";
import { isNodeName } from "../../link/index.js";

export class MeshUsers {
  readonly prefix: string;

  constructor(vhost: string) {
    this.prefix = `mesh-${createHash("sha256").update(vhost).digest("hex").slice(0, 8)}`;
  }

  /** The control plane's own account. */
  get control(): string {
    return `${this.prefix}.control`;
  }

  /** The account of one token: `<prefix>.token.<node>.<token id>`; its password is the token's secret. */
  token(node: string, tokenId: string): string {
    return `${this.prefix}.token.${node}.${tokenId}`;
  }

  /** The account of one enrolment of a node: `<prefix>.node.<node>.<suffix>`, fresh at every enrolment. */
  node(node: string, suffix: string): string {
    return `${this.prefix}.node.${node}.${suffix}`;
  }

  /** Reads a user name this mesh made: its role and node, or undefined for any other name. */
  read(user: string | undefined): { role: "token" | "node"; node: string } | undefined {
    if (user === undefined) return undefined;
    const parts = user.split(".");
    if (parts.length !== 4 || parts[0] !== this.prefix) return undefined;
    const [, role, node, suffix] = parts;
    if (
      (role !== "token" && role !== "node") ||
      !isNodeName(node) ||
      !/^[A-Za-z0-9_-]+$/.test(suffix ?? "")
    ) {
      return undefined;
    }
    return { role, node };
  }

  /** The token id of a token account of this mesh, or undefined for any other name. */
  tokenIdOf(user: string): string | undefined {
    return this.read(user)?.role === "token" ? user.split(".")[3] : undefined;
  }
}
