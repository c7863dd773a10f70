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
import { checkDeclaredFiles, encodeMessage, itemsDigest } from "../link/index.js";
import { errorText } from "../log.js";
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
  // Checked against the wire contract here, before any sequence is allocated: a refused item writes nothing.
  checkDeclaredFiles(parsed.data.files, fileName);
  return parsed.data.files;
}

export interface DeclareContext {
  store: Store;
  signing: SigningIdentity;
  bus: ControlBus;
  now: () => Date;
  /**
   * Asked before each chunk: whether the epoch declared under still holds (the lease's gate). A fleet takes many
   * chunks, and nothing is sent under an epoch that has moved on.
   */
  gate?: () => boolean | Promise<boolean>;
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
  const [sent] = await declareMany(context, [node], files, epoch);
  if (sent === undefined) throw new MeshError("internal", `nothing was declared for ${node}`);
  return sent;
}

/** How many declarations are signed, recorded and sent together: the first nodes hear while the rest are signed. */
export const declarationChunk = 250;

/**
 * Declares the same files to many nodes at once. Every node is checked first (an unknown or retired one refuses
 * the whole batch, so nothing is started) and every sequence is allocated in one transaction; then the nodes are
 * taken a chunk at a time: each envelope signed over its own bytes, the chunk recorded, sent with one wait for the
 * broker, and its sending put in the audit trail. Recorded before sent, so a node that missed its declaration gets
 * it again when its alive says it holds an older one. Should a chunk fail, the error says how many nodes the
 * declaration reached before it.
 */
export async function declareMany(
  context: DeclareContext,
  nodes: readonly string[],
  files: readonly DeclaredFile[],
  epoch: number,
): Promise<SentDeclaration[]> {
  const { store } = context;
  const names = [...new Set(nodes)];
  const standings = await store.nodes.standings(names);
  const unknown = names.filter((name) => !standings.has(name));
  if (unknown.length > 0) throw new MeshError("node_unknown", `no node named ${unknown.join(", ")}`);
  const retired = names.filter((name) => standings.get(name)?.state === "retired");
  if (retired.length > 0) {
    throw new MeshError(
      "node_retired",
      retired.length === 1 ? `node ${retired.join("")} is retired` : `retired: ${retired.join(", ")}`,
    );
  }
  const items = files.map((file) => ({
    id: `file:${file.path}`,
    type: "file" as const,
    path: file.path,
    content: file.content,
    ...(file.mode === undefined ? {} : { mode: file.mode }),
  }));
  const digest = itemsDigest(items);
  const sequences = await store.nodes.nextDeclarationSequences(names);
  const issuedAt = context.now().toISOString();
  const compose = (node: string) => {
    const sequence = sequences.get(node);
    if (sequence === undefined) throw new MeshError("internal", `no sequence was allocated for ${node}`);
    // Checked as it is encoded; the signature covers these bytes exactly, and the node verifies them before it
    // parses anything.
    const bytes = encodeMessage({
      kind: "declaration",
      node,
      epoch,
      sequence,
      issued_at: issuedAt,
      items,
      digest,
    });
    const envelope = encodeMessage(
      sealDeclaration(bytes, context.signing.privateKey, context.signing.fingerprint),
    );
    return { node, sequence, envelope };
  };
  const sent: SentDeclaration[] = [];
  /** The chunk recorded but not yet sent: its nodes get it when their alives say they hold an older one. */
  let recorded: string[] = [];
  try {
    for (let start = 0; start < names.length; start += declarationChunk) {
      if (context.gate !== undefined && !(await context.gate())) {
        throw new MeshError(
          "lease_moved",
          `the lease no longer stands at epoch ${epoch} (it moved on, or this command's own lapsed)`,
        );
      }
      const composed = names.slice(start, start + declarationChunk).map(compose);
      await store.declarations.recordMany(
        composed.map(({ node, sequence, envelope }) => ({
          node,
          sequence,
          epoch,
          issuedAt,
          digest,
          envelope: new TextDecoder().decode(envelope),
        })),
      );
      recorded = composed.map(({ node }) => node);
      await context.bus.publishDeclarations(composed.map(({ node, envelope }) => ({ node, envelope })));
      recorded = [];
      for (const { node, sequence } of composed) sent.push({ node, sequence, epoch, digest });
      await store.events.recordMany(
        composed.map(({ node, sequence }) => ({
          at: issuedAt,
          kind: "declaration.sent",
          node,
          epoch,
          detail: { sequence, digest, items: items.length },
        })),
      );
    }
  } catch (error) {
    if (sent.length === 0 && recorded.length === 0) throw error;
    throw new MeshError("declared_in_part", partly(names.length, sent, recorded, error), { cause: error });
  }
  return sent;
}

/** What a declaration that failed part-way did: sent, recorded only, and not begun, with the failure. */
function partly(
  total: number,
  sent: readonly SentDeclaration[],
  recorded: readonly string[],
  error: unknown,
): string {
  const range = (nodes: readonly string[]) => `${nodes[0] ?? ""} to ${nodes.at(-1) ?? ""}`;
  const parts = [`the declaration was sent to ${sent.length} of ${total} nodes`];
  if (sent.length > 0) parts[0] += ` (${range(sent.map((one) => one.node))})`;
  if (recorded.length > 0) {
    parts.push(
      `${recorded.length} more (${range(recorded)}) are recorded and are sent when their alives say they hold an older one`,
    );
  }
  const notBegun = total - sent.length - recorded.length;
  if (notBegun > 0) parts.push(`${notBegun} were not declared`);
  return `${parts.join("; ")}; then it failed: ${errorText(error)}`;
}

/** Sends the node its latest declaration again, exactly as it was signed. Returns whether there was one. */
export async function resendLatest(store: Store, bus: ControlBus, node: string): Promise<boolean> {
  const latest = await store.declarations.latest(node);
  if (latest === undefined) return false;
  await bus.publishDeclaration(node, new TextEncoder().encode(latest.envelope));
  return true;
}
