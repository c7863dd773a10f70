/**
 * Pushing an updated account JWT to a running server through the system account: how a revocation takes effect
 * at once, without a restart (the server disconnects the revoked users and refuses them from then on).
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { TimeoutError } from "@nats-io/transport-node";
import { z } from "zod";
import { MeshError } from "../../errors.js";
import { asBusError, noAnswer } from "./connect.js";

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
  const timeoutMs = 5000;
  // The broker's failures as the mesh's, so a caller that carries on without the broker (it applies the same
  // list when the control plane starts) can tell them from a bug.
  const reply = await system
    .request(`$SYS.REQ.ACCOUNT.${accountPublicKey}.CLAIMS.UPDATE`, accountJwt, { timeout: timeoutMs })
    .catch((error: unknown) => {
      throw error instanceof TimeoutError
        ? noAnswer(system.getServer(), timeoutMs, error)
        : asBusError(error, system.getServer());
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
