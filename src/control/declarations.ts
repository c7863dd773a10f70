/**
 * Declarations: what one node should hold, composed here, signed over its exact bytes, recorded, and sent straight
 * to the node's own queue. A node that was away gets the latest one again when it says it holds an older one.
 */
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import type { ControlBus } from "../bus/index.js";
import { MeshError, UsageError } from "../errors.js";
import type { SigningIdentity } from "../keys/index.js";
import { sealDeclaration } from "../keys/index.js";
import { encodeMessage, itemsDigest, parseDeclaration } from "../link/index.js";
import type { Store } from "../store/index.js";

const declaredFileSchema = z.strictObject({
  path: z.string().startsWith("/", { error: "must be an absolute path" }),
  content: z.string(),
  mode: z
    .string()
    .regex(/^[0-7]{3,4}$/, { error: 'must be an octal mode such as "0644"' })
    .optional(),
});
const declarationFileSchema = z.strictObject({ files: z.array(declaredFileSchema) });

export type DeclaredFile = z.infer<typeof declaredFileSchema>;

/** Reads what an operator declares for a node: YAML or JSON `{files: [{path, content, mode?}]}`. */
export function parseDeclarationFile(text: string, fileName: string): DeclaredFile[] {
  let value: unknown;
  try {
    value = parseYaml(text);
  } catch (error) {
    throw new UsageError(`${fileName} is neither YAML nor JSON: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const parsed = declarationFileSchema.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new UsageError(`${fileName}: ${issue?.path.join(".") ?? ""}: ${issue?.message ?? "invalid"}`);
  }
  return parsed.data.files;
}

export interface DeclareContext {
  store: Store;
  signing: SigningIdentity;
  bus: ControlBus;
  now: () => Date;
}

export interface SentDeclaration {
  node: string;
  sequence: number;
  epoch: number;
  digest: string;
}

export async function declare(
  context: DeclareContext,
  node: string,
  files: readonly DeclaredFile[],
  epoch: number,
): Promise<SentDeclaration> {
  const { store } = context;
  const record = await store.nodes.get(node);
  if (record === undefined) throw new MeshError("node_unknown", `no node named ${node}`);
  if (record.state === "retired") throw new MeshError("node_retired", `node ${node} is retired`);
  const items = files.map((file) => ({
    id: `file:${file.path}`,
    type: "file" as const,
    path: file.path,
    content: file.content,
    ...(file.mode === undefined ? {} : { mode: file.mode }),
  }));
  const sequence = await store.nodes.nextDeclarationSequence(node);
  const issuedAt = context.now().toISOString();
  const declaration = parseDeclaration({
    kind: "declaration",
    node,
    epoch,
    sequence,
    issued_at: issuedAt,
    items,
    digest: itemsDigest(items),
  });
  // The signature covers these bytes exactly; the node verifies them before it parses anything.
  const bytes = encodeMessage(declaration);
  const envelope = encodeMessage(
    sealDeclaration(bytes, context.signing.privateKey, context.signing.fingerprint),
  );
  await store.declarations.record({
    node,
    sequence,
    epoch,
    issuedAt,
    digest: declaration.digest,
    envelope: new TextDecoder().decode(envelope),
  });
  await context.bus.publishDeclaration(node, envelope);
  await store.events.record({
    at: issuedAt,
    kind: "declaration.sent",
    node,
    epoch,
    detail: { sequence, digest: declaration.digest, items: items.length },
  });
  return { node, sequence, epoch, digest: declaration.digest };
}

/** Sends the node its latest declaration again, exactly as it was signed. Returns whether there was one. */
export async function resendLatest(store: Store, bus: ControlBus, node: string): Promise<boolean> {
  const latest = await store.declarations.latest(node);
  if (latest === undefined) return false;
  await bus.publishDeclaration(node, new TextEncoder().encode(latest.envelope));
  return true;
}
