/**
 * One overlay node for the overlay applier's tests, run inside a network namespace:
 *   ip netns exec <ns> node --import tsx test/support/overlay-node.ts < request.json
 * The request names the node's state directory (its `overlay.key` made as at join), what to do — apply or verify
 * the items, or describe one interface — and the items. The answer is one line of JSON on stdout.
 */
import { z } from "zod";
import { OverlayApplier } from "../../src/host/overlay-applier.js";
import { declaredItemSchema } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";

const requestSchema = z.discriminatedUnion("action", [
  z.object({ action: z.literal("apply"), stateDir: z.string(), items: z.array(declaredItemSchema) }),
  z.object({ action: z.literal("verify"), stateDir: z.string(), items: z.array(declaredItemSchema) }),
  z.object({ action: z.literal("link"), stateDir: z.string(), interface: z.string() }),
]);

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

const request = requestSchema.parse(JSON.parse(await readStdin()));
const applier = new OverlayApplier({
  stateDir: request.stateDir,
  log: createLogger({ write: (line) => process.stderr.write(line), level: "info", pretty: false }),
});
switch (request.action) {
  case "apply":
    process.stdout.write(`${JSON.stringify({ results: await applier.apply(request.items) })}\n`);
    break;
  case "verify":
    process.stdout.write(`${JSON.stringify({ drifts: await applier.verify(request.items) })}\n`);
    break;
  case "link":
    process.stdout.write(`${JSON.stringify({ link: (await applier.link(request.interface)) ?? null })}\n`);
    break;
  default: {
    const unknown: never = request;
    throw new Error(`unknown request ${JSON.stringify(unknown)}`);
  }
}
