/**
 * Pushing an updated account JWT to a running server through the system account: how a revocation takes effect
 * at once, without a restart (the server disconnects the revoked users and refuses them from then on).
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { z } from "zod";
import { MeshError } from "../../errors.js";

/** The server's answer to a claims update: `{"data":{"code":200,…}}`, or `{"error":{"code":…,"description":…}}`. */
const updateAnswer = z.object({
  data: z.object({ code: z.number().optional() }).optional(),
  error: z.object({ code: z.number().optional(), description: z.string().optional() }).optional(),
});

export async function pushAccountUpdate(
  system: NatsConnection,
  accountPublicKey: string,
  accountJwt: string,
): Promise<void> {
  const reply = await system.request(`$SYS.REQ.ACCOUNT.${accountPublicKey}.CLAIMS.UPDATE`, accountJwt, {
    timeout: 5000,
  });
  let answer: z.infer<typeof updateAnswer>;
  try {
    answer = updateAnswer.parse(JSON.parse(reply.string()));
  } catch (error) {
    throw new MeshError("nats_account_update", "the broker's answer to the account update is not one", {
      cause: error,
    });
  }
  if (answer.error !== undefined || answer.data?.code !== 200) {
    throw new MeshError(
      "nats_account_update",
      `the broker refused the account update: ${answer.error?.description ?? JSON.stringify(answer)}`,
    );
  }
}
