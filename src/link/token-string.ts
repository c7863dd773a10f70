/**
 * The token an operator hands to a machine: one copy-pasteable string that carries everything `mesh-host join`
 * needs. It is `mesh1_` followed by base64url of a small JSON object.
 */
import { z } from "zod";
import { ContractError } from "./errors.js";

const prefix = "mesh1_";

/** The token's own broker identity: what `mesh-host join` connects with, until the enrol reply gives the node its own. */
export const tokenCredentialSchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("nats"), jwt: z.string().min(1), seed: z.string().min(1) }),
  z.strictObject({ type: z.literal("amqp"), username: z.string().min(1) }),
]);

export type TokenCredential = z.infer<typeof tokenCredentialSchema>;

/** What the token carries. `broker` is where the broker address and the token's own broker identity go. */
export const tokenContentSchema = z.strictObject({
  /** The token's id: what `mesh token list` and `mesh token revoke` name. */
  id: z.string().regex(/^tok_[0-9a-f]{12}$/),
  /** The node record the token was issued for. */
  node: z.string().min(1).max(63),
  /** 256 random bits, base64url. Shown once; the store keeps only its hash. */
  secret: z.string().regex(/^[A-Za-z0-9_-]{43}$/),
  /** The control plane's signing-key fingerprint, which the node checks against the key in the enrol reply. */
  fingerprint: z.string().regex(/^SHA256:[A-Za-z0-9+/]{43}$/),
  /** The broker to reach and the token's identity on it; null until a broker serves this mesh. */
  broker: z
    .strictObject({
      url: z.string().min(1),
      credential: tokenCredentialSchema,
    })
    .nullable(),
  expires_at: z.iso.datetime(),
});

export type TokenContent = z.infer<typeof tokenContentSchema>;

export function encodeToken(content: TokenContent): string {
  return (
    prefix + Buffer.from(JSON.stringify(tokenContentSchema.parse(content)), "utf8").toString("base64url")
  );
}

/** Reads a token string. Throws ContractError saying what is wrong with it, never echoing the secret. */
export function decodeToken(token: string): TokenContent {
  const trimmed = token.trim();
  if (!trimmed.startsWith(prefix)) throw new ContractError(`a mesh token starts with "${prefix}"`);
  const body = trimmed.slice(prefix.length);
  if (!/^[A-Za-z0-9_-]+$/.test(body)) throw new ContractError("the token has characters outside base64url");
  let json: unknown;
  try {
    json = JSON.parse(Buffer.from(body, "base64url").toString("utf8"));
  } catch (error) {
    throw new ContractError("the token is damaged: its body is not JSON", { cause: error });
  }
  const parsed = tokenContentSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue === undefined ? "" : `${issue.path.join(".")}: `;
    throw new ContractError(`the token is damaged: ${where}${issue?.message ?? "invalid"}`);
  }
  return parsed.data;
}
