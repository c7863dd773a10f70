/**
 * The control plane as a NATS authority (decentralized auth, "operator mode"): an operator key, the mesh's
 * application account and the system account, all kept in the data dir. Every identity on the broker is a user
 * JWT minted here from the writers table, so the server itself enforces who may publish and read what.
 */
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { createPublicKey, sign as signWithKey } from "node:crypto";
import type { KeyObject } from "node:crypto";
import { Algorithms, encodeAccount, encodeOperator, encodeUser } from "@nats-io/jwt";
import type { KeyPair } from "@nats-io/nkeys";
import { createAccount, createOperator, fromPublic, fromSeed, Prefix } from "@nats-io/nkeys";
// The nkey text encoding (prefix, base32, checksum); the package's entry point does not export it.
import { Codec } from "@nats-io/nkeys/lib/codec.js";
import {
  ed25519PairAsJwk,
  readPrivateFile,
  signingPrivateKeyFromSeed,
  writePrivateFile,
} from "../../keys/index.js";
import type { Role } from "../../link/index.js";
import { natsPermissions } from "../../link/index.js";
import { largestBrokerMessage, messageLimit, subscriptionLimit } from "../../link/limits.js";

/** The three keys the control plane holds to run a NATS server in operator mode. */
export interface NatsAuthority {
  operator: KeyPair;
  account: KeyPair;
  system: KeyPair;
}

/** A user's revocation: users of this public key issued at or before `at` (unix seconds) are refused. */
export type Revocations = Readonly<Record<string, number>>;

const names = { operator: "mesh", account: "MESH", system: "SYS" } as const;

/** Loads the authority's keys from `dir`, creating any that are missing (seeds at 0600). */
export function loadOrCreateAuthority(dir: string): NatsAuthority {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const load = (file: string, create: () => KeyPair): KeyPair => {
    const path = join(dir, file);
    if (!existsSync(path)) writePrivateFile(path, new TextDecoder().decode(create().getSeed()));
    return fromSeed(new TextEncoder().encode(readPrivateFile(path).trim()));
  };
  return {
    operator: load("operator.nk", createOperator),
    account: load("account.nk", createAccount),
    system: load("system.nk", createAccount),
  };
}

/**
 * A key pair that signs with node:crypto. The pure-JS signer takes tens of milliseconds of blocking CPU per JWT;
 * node:crypto signs the same Ed25519 bytes in a fraction of a millisecond.
 */
export function fastSigner(pair: KeyPair): KeyPair {
  const known = fastSigners.get(pair);
  if (known !== undefined) return known;
  const seed = rawSeed(pair);
  const privateKey: KeyObject = signingPrivateKeyFromSeed(seed);
  // The pure-JS pair derives both halves from the seed on every call (milliseconds each, several per JWT: the JWT
  // library asks for the private key to check the signer): derived once here, by node:crypto.
  const publicRaw = rawPublicKey(privateKey);
  const publicKey = new TextDecoder().decode(
    Codec.encode(Codec.decodeSeed(pair.getSeed()).prefix, publicRaw),
  );
  // The nkey private key is the seed followed by the public key, as Ed25519's 64-byte secret key.
  const privateText = Codec.encode(Prefix.Private, Buffer.concat([seed, publicRaw]));
  const signer: KeyPair = {
    getPublicKey: () => publicKey,
    getPrivateKey: () => privateText.slice(),
    getSeed: () => pair.getSeed(),
    sign: (input: Uint8Array) => new Uint8Array(signWithKey(null, input, privateKey)),
    verify: (input: Uint8Array, signature: Uint8Array) => pair.verify(input, signature),
    clear: () => pair.clear(),
    // Sealing is for curve keys; signing keys never seal or open.
    seal: (...args) => pair.seal(...args),
    open: (...args) => pair.open(...args),
  };
  fastSigners.set(pair, signer);
  return signer;
}

function rawPublicKey(privateKey: KeyObject): Uint8Array {
  const jwk = createPublicKey(privateKey).export({ format: "jwk" });
  if (typeof jwk.x !== "string") throw new Error("node:crypto gave no Ed25519 public key");
  return Buffer.from(jwk.x, "base64url");
}

/** One fast signer per key pair: making the node:crypto key and deriving the public key are done once. */
const fastSigners = new WeakMap<KeyPair, KeyPair>();

function rawSeed(pair: KeyPair): Uint8Array {
  // The nkeys key pair keeps its raw 32-byte seed; the interface does not declare the accessor.
  const withRaw = pair as KeyPair & { getRawSeed?: () => Uint8Array };
  if (typeof withRaw.getRawSeed !== "function")
    throw new Error("this nkeys key pair cannot give its raw seed");
  return withRaw.getRawSeed();
}

const v2 = { algorithm: Algorithms.v2 } as const;

export function operatorJwt(authority: NatsAuthority): Promise<string> {
  return encodeOperator(
    names.operator,
    fastSigner(authority.operator),
    { system_account: fastSigner(authority.system).getPublicKey() },
    v2,
  );
}

/**
 * The mesh's account: JetStream without limits of its own (the streams carry theirs), each message at most the
 * broker's largest, and the current revocations.
 */
export function accountJwt(authority: NatsAuthority, revocations: Revocations = {}): Promise<string> {
  return encodeAccount(
    names.account,
    fromPublic(fastSigner(authority.account).getPublicKey()),
    {
      limits: {
        mem_storage: -1,
        disk_storage: -1,
        streams: -1,
        consumer: -1,
        // Account-wide totals, shared by every identity: a limit here would let one node's connections or
        // subscriptions use up the fleet's and lock out every other node and the control plane (measured with
        // conn: the control plane was refused). Each user JWT carries its own subscription limit instead.
        subs: -1,
        conn: -1,
        // Per message, on every connection of the account: it also covers a node whose user JWT was minted before
        // user JWTs carried a payload limit.
        payload: largestBrokerMessage,
        // nats-server 2.9.10 enforces no data limit (measured: 90 kB went through a limit of 1,000 bytes).
        data: -1,
      },
      revocations: { ...revocations },
    },
    { ...v2, signer: fastSigner(authority.operator) },
  );
}

export function systemAccountJwt(authority: NatsAuthority): Promise<string> {
  // Without explicit limits an account admits no connection at all.
  return encodeAccount(
    names.system,
    fromPublic(fastSigner(authority.system).getPublicKey()),
    { limits: { subs: -1, conn: -1, payload: -1, data: -1 } },
    { ...v2, signer: fastSigner(authority.operator) },
  );
}

export interface UserGrant {
  /** A name for the broker's logs: the node or token it stands for. */
  name: string;
  /** The user's public nkey (`U…`). Its seed never needs to be here. */
  userPublicKey: string;
  role: Role;
  /** The node the identity acts for; required for the token and node roles (the lab role: a list of them). */
  node?: string | readonly string[];
  /**
   * When the broker must stop accepting it (a token's identity expires with the token). The broker counts a JWT's
   * expiry in whole seconds and lets a connection in through the whole second it names (then drops it at once), so the
   * JWT names the second before the one `expiresAt` falls in: refused at connect from `expiresAt` on, and ended up to
   * two seconds before it.
   */
  expiresAt?: Date;
}

/**
 * Mints a user JWT in the mesh's account with exactly the permissions the writers table gives the role, and the
 * role's limits (src/link/limits.ts): how many subscriptions one connection may hold and how large a message may
 * be. A user JWT cannot limit how many connections its holder opens.
 */
export function userJwt(authority: NatsAuthority, grant: UserGrant): Promise<string> {
  const permissions = natsPermissions(grant.role, grant.node);
  const nodes = grant.node === undefined ? 0 : typeof grant.node === "string" ? 1 : grant.node.length;
  return encodeUser(
    grant.name,
    grant.userPublicKey,
    fastSigner(authority.account),
    {
      pub: permissions.pub,
      sub: permissions.sub,
      subs: subscriptionLimit(grant.role, nodes) ?? -1,
      payload: messageLimit(grant.role) ?? -1,
      data: -1,
    },
    {
      ...v2,
      ...(grant.expiresAt === undefined ? {} : { exp: Math.floor(grant.expiresAt.getTime() / 1000) - 1 }),
    },
  );
}

/** A system-account user, for sending account updates (revocations) to the server without a restart. */
export function systemUserJwt(authority: NatsAuthority, userPublicKey: string): Promise<string> {
  return encodeUser("mesh-system", userPublicKey, fastSigner(authority.system), {}, v2);
}

/**
 * A fresh user key pair; its seed is what the holder keeps secret. Made by node:crypto and written in the nkeys
 * encoding: deriving the public half from an nkeys seed costs an OpenSSL key import (a third of a millisecond) that a
 * key made here does not need. The pair comes out already in JWK form ({@link ed25519PairAsJwk}).
 */
export function newUserKey(): { publicKey: string; seed: string } {
  const { d, x } = ed25519PairAsJwk();
  const text = new TextDecoder();
  return {
    publicKey: text.decode(Codec.encode(Prefix.User, Buffer.from(x, "base64url"))),
    seed: text.decode(Codec.encodeSeed(Prefix.User, Buffer.from(d, "base64url"))),
  };
}
