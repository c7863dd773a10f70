/**
 * Broker identities on RabbitMQ: accounts made through the management API with permissions compiled from the
 * writers table. A token's account has the token's secret as its password; a node's account gets a fresh password
 * at each enrolment; the control plane's password is kept in the data dir. Revoking deletes the account, which
 * also closes its connections.
 */
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { readPrivateFile, writePrivateFile } from "../../keys/index.js";
import { errorText } from "../../log.js";
import { nodeQueue, rabbitPermissions } from "../../link/index.js";
import type { BrokerIdentities, NodeCredential, TokenCredential } from "../bus.js";
import { BusError } from "../errors.js";
import type { AmqpAddress } from "./link.js";
import type { RabbitManagement } from "./management.js";
import { boundControlQueue } from "./management.js";
import { MeshUsers } from "./users.js";

export class AmqpBrokerIdentities implements BrokerIdentities {
  readonly users: MeshUsers;
  /** RabbitMQ has no account expiry: a token's account is deleted by the control plane. */
  readonly sweepsTokens = true;
  /** Token accounts gathering for the next delete, which starts once the one under way has ended. */
  private nextTokenEnd: { users: string[]; done: Promise<void> } | undefined;
  private tokenEnds: Promise<void> = Promise.resolve();

  constructor(
    private readonly management: RabbitManagement,
    private readonly address: AmqpAddress,
    /** Where the control plane's password is kept (the data dir's `rabbitmq/`). */
    private readonly dir: string,
  ) {
    this.users = new MeshUsers(address.vhost);
  }

  /** What nodes are told: the broker's address without anyone's credentials. */
  get url(): string {
    return this.address.url;
  }

  get vhost(): string {
    return this.address.vhost;
  }

  async forToken(token: {
    id: string;
    node: string;
    secret: string;
    expiresAt: Date;
  }): Promise<{ user: string; credential: TokenCredential }> {
    const user = this.users.token(token.node, token.id);
    await this.management.putUser(user, token.secret);
    await this.management.setPermissions(this.vhost, user, rabbitPermissions("token", token.node));
    return { user, credential: { type: "amqp", username: user } };
  }

  async forNode(node: string): Promise<{ user: string; credential: NodeCredential }> {
    const user = this.users.node(node, randomBytes(6).toString("hex"));
    const password = randomBytes(32).toString("base64url");
    // The queue beside the account: the node learns its password only from the reply sent after both, so it never
    // finds its account without its queue. (One definitions import for many joins was measured and costs the
    // broker more: about 85 ms of its CPU per import whatever its size, against about 8 ms for these calls.)
    const [queue, account] = await Promise.allSettled([
      this.management.putQueue(this.vhost, nodeQueue(node)),
      this.management
        .putUser(user, password)
        .then(() => this.management.setPermissions(this.vhost, user, rabbitPermissions("node", node))),
    ]);
    const failures: unknown[] = [queue, account].flatMap((made) =>
      made.status === "rejected" ? [made.reason as unknown] : [],
    );
    if (failures.length > 0) {
      // The enrolment is refused, and its name is stored nowhere: an account made for it would never be deleted.
      const cleanup = await this.management.deleteUser(user).then(
        (): string[] => [],
        (error: unknown) => [`and its account ${user} could not be deleted: ${errorText(error)}`],
      );
      throw new BusError(
        "broker",
        [`the account and queue of ${node} could not be made`, ...failures.map(errorText), ...cleanup].join(
          "; ",
        ),
        { cause: failures[0] },
      );
    }
    return { user, credential: { type: "amqp", username: user, password } };
  }

  /**
   * Deletes every listed node account that still exists; deleting closes its connections at once. Token accounts
   * are not deleted here: a spent token's joiner may still be reading its enrol reply on that account's connection.
   * They end by `endToken` (at revoke, and once the joiner had its answer) and by the token sweep.
   */
  async revoke(revoked: ReadonlyMap<string, Date>): Promise<void> {
    const nodeAccounts = new Set(
      [...revoked.keys()].filter((user) => this.users.tokenIdOf(user) === undefined),
    );
    // After a burst of joins the list holds only spent tokens' accounts: then there is nothing to delete here, and
    // listing every user on the broker (thousands, while a fleet joins) is work it need not do.
    if (nodeAccounts.size === 0) return;
    const due = (await this.management.users()).filter((user) => nodeAccounts.has(user));
    await this.management.deleteUsers(due);
  }

  /**
   * Deletes one token's account, closing its connections; an account already gone is not an error. Resolves once
   * it is deleted. While a fleet joins, the accounts whose grace ended while one delete was under way are deleted
   * together by the next, in one call: none waits longer than it would have for its own call, and the broker
   * takes one request instead of one per join.
   */
  async endToken(user: string): Promise<void> {
    if (this.users.tokenIdOf(user) === undefined) {
      throw new BusError("internal", `${user} is not a token account of this mesh`);
    }
    let batch = this.nextTokenEnd;
    if (batch === undefined) {
      const users: string[] = [];
      const done = this.tokenEnds.then(async () => {
        // From here on, accounts ending join the batch after this one.
        if (this.nextTokenEnd?.users === users) this.nextTokenEnd = undefined;
        await this.management.deleteUsers(users);
      });
      // The next batch waits for this one whatever became of it: a failure is each caller's, told to them below.
      this.tokenEnds = Promise.allSettled([done]).then(() => undefined);
      batch = { users, done };
      this.nextTokenEnd = batch;
    }
    batch.users.push(user);
    await batch.done;
  }

  /**
   * Deletes the account of every token of this mesh not in `keep` (token ids: the valid ones, and those that ended
   * within the grace). Returns how many. Keyed by token id, which is stored before the account is made, so a token
   * issued during a sweep keeps its account.
   */
  async sweepTokens(keep: () => Promise<ReadonlySet<string>>): Promise<number> {
    const users = await this.management.users();
    // Asked only now: every account listed above had its token's row written before it was made.
    const kept = await keep();
    return this.management.deleteUsers(
      users.filter((user) => {
        const id = this.users.tokenIdOf(user);
        return id !== undefined && !kept.has(id);
      }),
    );
  }

  /** A retired node's queue goes with it. */
  async forget(node: string): Promise<void> {
    await this.management.deleteQueue(this.vhost, nodeQueue(node));
  }

  /**
   * The control plane's own account, made (with the vhost) or brought up to date from the writers table. Its
   * password is made once and kept, so every controller sharing the data dir's keys logs in as the same account.
   */
  async controlCredential(): Promise<{ username: string; password: string }> {
    const file = join(this.dir, "control.password");
    if (!existsSync(file)) {
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      writePrivateFile(file, randomBytes(32).toString("base64url"));
    }
    const password = readPrivateFile(file).trim();
    await this.management.ensureVhost(this.vhost);
    await boundControlQueue(this.management, this.vhost);
    await this.management.putUser(this.users.control, password);
    await this.management.setPermissions(this.vhost, this.users.control, rabbitPermissions("control"));
    return { username: this.users.control, password };
  }

  async close(): Promise<void> {
    await Promise.resolve();
  }
}
