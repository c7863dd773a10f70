/**
 * Pushing an updated account JWT to a running server through the system account: how a revocation takes effect
 * at once, without a restart (the server disconnects the revoked users and refuses them from then on).
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { MeshError } from "../../errors.js";

export async function pushAccountUpdate(
  system: NatsConnection,
  accountPublicKey: string,
  accountJwt: string,
): Promise<void> {
  const reply = await system.request(`$SYS.REQ.ACCOUNT.${accountPublicKey}.CLAIMS.UPDATE`, accountJwt, {
    timeout: 5000,
  });
  const answer = reply.json<{ data?: { code?: number }; error?: { code?: number; description?: string } }>();
  if (answer.error !== undefined || answer.data?.code !== 200) {
    throw new MeshError(
      "nats_account_update",
      `the broker refused the account update: ${answer.error?.description ?? JSON.stringify(answer)}`,
    );
  }
}
