/**
 * Broker identities on NATS: user JWTs minted from the writers table and signed by the mesh's account key, and
 * revocation through the system account. When the mesh runs the server itself, the server's preload config is
 * rewritten with every change so that a restarted server refuses the same users as the running one.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { MeshError } from "../../errors.js";
import type { BrokerIdentities, NodeCredential, TokenCredential } from "../bus.js";
import type { NatsAuthority, Revocations } from "./authority.js";
import {
  accountJwt,
  fastSigner,
  newUserKey,
  operatorJwt,
  systemAccountJwt,
  systemUserJwt,
  userJwt,
} from "./authority.js";
import { pushAccountUpdate } from "./account-update.js";
import { connectNats } from "./connect.js";
import type { NatsIdentity } from "./connect.js";
import { writeNatsServerConfig } from "./server.js";

/** Where the mesh's own nats-server keeps its config, when the mesh runs one (`mesh up`). */
export interface EmbeddedServer {
  dir: string;
  host: string;
  port: number;
}

export class NatsBrokerIdentities implements BrokerIdentities {
  private system: NatsConnection | undefined;
  private revoking: Promise<void> = Promise.resolve();

  constructor(
    private readonly authority: NatsAuthority,
    readonly url: string,
    private readonly embedded: EmbeddedServer | undefined,
  ) {}

  async forToken(token: {
    id: string;
    node: string;
    secret: string;
    expiresAt: Date;
  }): Promise<{ user: string; credential: TokenCredential }> {
    const key = newUserKey();
    const jwt = await userJwt(this.authority, {
      name: `token ${token.id} for ${token.node}`,
      userPublicKey: key.publicKey,
      role: "token",
      node: token.node,
      expiresAt: token.expiresAt,
    });
    return { user: key.publicKey, credential: { type: "nats", jwt, seed: key.seed } };
  }

  async forNode(
    node: string,
    nodeUser: string | undefined,
  ): Promise<{ user: string; credential: NodeCredential }> {
    if (nodeUser === undefined) {
      throw new MeshError(
        "enrol_incomplete",
        "on NATS a node sends its own broker user key (keys.broker_user)",
      );
    }
    const jwt = await userJwt(this.authority, { name: node, userPublicKey: nodeUser, role: "node", node });
    return { user: nodeUser, credential: { type: "nats", jwt } };
  }

  /** A token's JWT expires with the token (`UserGrant.expiresAt`): the server itself refuses it, nothing to sweep. */
  readonly sweepsTokens = false;

  async sweepTokens(): Promise<number> {
    return Promise.resolve(0);
  }

  /**
   * A token's identity ends on NATS by its user key in the account's revocations, which `revoke` pushes as one
   * whole list (the token's key among them, from the store): nothing here could push it alone.
   */
  async endToken(): Promise<void> {
    await Promise.resolve();
  }

  /** Nothing on NATS belongs to one node but its subjects, which need no removing. */
  async forget(): Promise<void> {
    await Promise.resolve();
  }

  /** The control plane's own identity: a fresh user key each start, so no seed of it is ever stored. */
  async controlIdentity(): Promise<NatsIdentity> {
    const key = newUserKey();
    return {
      seed: key.seed,
      jwt: await userJwt(this.authority, { name: "control", userPublicKey: key.publicKey, role: "control" }),
    };
  }

  /**
   * One at a time: each push carries the whole list, so two racing pushes could leave the older one last (and each
   * would open its own system connection).
   */
  revoke(revoked: ReadonlyMap<string, Date>): Promise<void> {
    const run = this.revoking.then(
      () => this.pushRevocations(revoked),
      () => this.pushRevocations(revoked),
    );
    this.revoking = run;
    return run;
  }

  private async pushRevocations(revoked: ReadonlyMap<string, Date>): Promise<void> {
    const account = await accountJwt(this.authority, asRevocations(revoked));
    if (this.embedded !== undefined) await this.writeServerConfig(revoked);
    await pushAccountUpdate(
      await this.systemConnection(),
      fastSigner(this.authority.account).getPublicKey(),
      account,
    );
  }

  /** Writes the config of the mesh's own nats-server, its account carrying the current revocations. */
  async writeServerConfig(revoked: ReadonlyMap<string, Date>): Promise<string> {
    if (this.embedded === undefined) {
      throw new MeshError("no_embedded_server", "this mesh does not run its own nats-server");
    }
    return writeNatsServerConfig({
      ...this.embedded,
      ...(await serverConfigFragment(this.authority, revoked)),
    });
  }

  private async systemConnection(): Promise<NatsConnection> {
    if (this.system !== undefined && !this.system.isClosed()) return this.system;
    const key = newUserKey();
    this.system = await connectNats({
      url: this.url,
      identity: { seed: key.seed, jwt: await systemUserJwt(this.authority, key.publicKey) },
      name: "mesh system",
      reconnect: false,
    });
    return this.system;
  }

  async close(): Promise<void> {
    if (this.system !== undefined && !this.system.isClosed()) await this.system.close();
  }
}

function asRevocations(revoked: ReadonlyMap<string, Date>): Revocations {
  return Object.fromEntries([...revoked].map(([user, since]) => [user, Math.ceil(since.getTime() / 1000)]));
}

/** What a nats-server needs to know about the mesh: the operator, the system account and the accounts to preload. */
export async function serverConfigFragment(
  authority: NatsAuthority,
  revoked: ReadonlyMap<string, Date>,
): Promise<{ operatorJwt: string; systemAccount: string; accounts: Record<string, string> }> {
  return {
    operatorJwt: await operatorJwt(authority),
    systemAccount: fastSigner(authority.system).getPublicKey(),
    accounts: {
      [fastSigner(authority.account).getPublicKey()]: await accountJwt(authority, asRevocations(revoked)),
      [fastSigner(authority.system).getPublicKey()]: await systemAccountJwt(authority),
    },
  };
}
