/**
 * A control plane that dies before acknowledging: it consumes the control queue, prints the first message it takes
 * (base64) and never acknowledges it; the test then kills it with SIGKILL.
 *
 *   node --import tsx test/support/dying-consumer.ts DATA_DIR BROKER_URL
 */
import { openControlSide } from "../../src/bus/index.js";
import { createLogger } from "../../src/log.js";

const [dataDir, url] = process.argv.slice(2);
if (dataDir === undefined || url === undefined)
  throw new Error("usage: dying-consumer.ts DATA_DIR BROKER_URL");
const side = await openControlSide(dataDir, { url }, createLogger({ level: "error" }), {
  longLived: true,
  ackWaitMs: 1000,
});
await side.bus.assert();
process.stdout.write("consuming\n");
await side.bus.consumeControl((batch) => {
  for (const delivery of batch)
    process.stdout.write(`took ${delivery.kind} ${Buffer.from(delivery.body).toString("base64")}\n`);
  return new Promise(() => undefined);
});
