/**
 * A holder that writes a plan revision, as its own process so that a test can SIGSTOP it: it takes the lease on a
 * real NATS key-value bucket, reads the plan's newest revision, passes its own clock gate and says so (`ready`),
 * then waits for a line on stdin before it writes — the moment between a holder's gate and its write, stretched so a
 * test can pause the process inside it. The write does not look at the gate again: what stops it, if anything, is
 * the store. Usage: node --import tsx plan-holder.ts NATS_URL BUCKET STORE_URL TTL_MS
 */
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { NatsKvLease } from "../../src/bus/nats/lease-kv.js";
import { MeshError } from "../../src/errors.js";
import { LeaseHolder } from "../../src/lease/holder.js";
import { createLogger } from "../../src/log.js";
import { openStore } from "../../src/store/index.js";

const [natsUrl, bucket, storeUrl, ttl] = process.argv.slice(2);
if (natsUrl === undefined || bucket === undefined || storeUrl === undefined || ttl === undefined) {
  throw new Error("usage: plan-holder.ts NATS_URL BUCKET STORE_URL TTL_MS");
}
const ttlMs = Number(ttl);
const say = (value: unknown) => process.stdout.write(`${JSON.stringify(value)}\n`);

const nc = await connect({ servers: natsUrl });
const store = await openStore(storeUrl, { historyLimit: 5 });
const holder = new LeaseHolder({
  backend: await NatsKvLease.open(nc, ttlMs, bucket),
  epochs: store.epochs,
  timings: { renewEveryMs: Math.floor(ttlMs / 3), ttlMs, marginMs: Math.floor(ttlMs / 5) },
  holder: { id: "paused-holder", host: "test", pid: process.pid, taken_at: new Date().toISOString() },
  log: createLogger({ level: "error" }),
});
if (!(await holder.tryTake()) || holder.epoch === undefined) throw new Error("the lease was not free");
const epoch = holder.epoch;
const expected = await store.plans.newest();
say({ ready: true, epoch, expected, gate: holder.canAct() });

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (line !== "write") continue;
  try {
    const revision = await store.plans.write({
      expected,
      plan: '{"units":[]}',
      at: new Date().toISOString(),
      by: "paused-holder",
      epoch,
    });
    say({ written: revision });
  } catch (error) {
    if (!(error instanceof MeshError)) throw error;
    say({ refused: error.code, message: error.message, gate: holder.canAct() });
  }
  break;
}
lines.close();
await holder.release();
await store.close();
await nc.close();
