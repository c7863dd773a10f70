/**
 * Which broker this mesh uses, recorded in the data dir on first start. Enrolled nodes hold the broker's address,
 * so the port chosen once is reused on every later start.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { MeshError } from "../errors.js";
import { writePrivateFile } from "../keys/index.js";

const recordSchema = z.strictObject({
  url: z.string().min(1),
  /** Set when the mesh runs this broker itself (`mesh up`). */
  embedded: z.strictObject({ host: z.string().min(1), port: z.int().min(1).max(65_535) }).optional(),
  /** RabbitMQ: the management API accounts are made through (it holds an administrator's password). */
  rabbitmq_api: z.string().min(1).optional(),
});

export type BrokerRecord = z.infer<typeof recordSchema>;

const fileName = "broker.json";

export function readBrokerRecord(dataDir: string): BrokerRecord | undefined {
  const path = join(dataDir, fileName);
  if (!existsSync(path)) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    throw new MeshError("broker_record", `${path} cannot be read: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const result = recordSchema.safeParse(parsed);
  if (!result.success)
    throw new MeshError("broker_record", `${path} is damaged: ${result.error.issues[0]?.message}`);
  return result.data;
}

export function writeBrokerRecord(dataDir: string, record: BrokerRecord): void {
  // Mode 0600 from its creation, like every file in the data dir: a RabbitMQ record holds an administrator's password.
  writePrivateFile(join(dataDir, fileName), `${JSON.stringify(recordSchema.parse(record), null, 2)}\n`);
}
