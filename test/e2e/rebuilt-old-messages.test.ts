/**
 * A machine rebuilt and joined again under its name, while its old self's last report still waits in the control
 * queue: on each real broker, ingest refuses the old report (RabbitMQ names the account that published it; on NATS,
 * JetStream received it before the enrolment) and takes the new machine's reports, counted from 1 again.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { NodeCredential } from "../../src/bus/index.js";
import { Ingest } from "../../src/control/ingest.js";
import { encodeMessage } from "../../src/link/index.js";
import { createLogger } from "../../src/log.js";
import type { Store } from "../../src/store/index.js";
import { openStore } from "../../src/store/index.js";
import { eventually } from "../support/processes.js";
import { reportOfNothing } from "../support/reports.js";
import { tempDir } from "../support/tmp.js";
import type { Transport } from "../support/transports.js";
import { transports } from "../support/transports.js";

const report = (node: string, reportSequence: number) =>
  encodeMessage(reportOfNothing(node, reportSequence, new Date()));

for (const { name, open } of transports) {
  describe(`a rebuilt machine's old messages (${name})`, () => {
    let transport: Transport;
    let store: Store;
    const dir = tempDir();
    before(async () => {
      transport = await open();
      store = await openStore(`sqlite:${join(dir.path, "mesh.db")}`, { historyLimit: 10 });
    });
    after(async () => {
      await store.close();
      await transport.stop();
      dir.remove();
    });

    test(`rebuilt (${name}) — the old machine's queued report is refused; the new machine's reports are its order`, async () => {
      const node = "rebuilt-e2e";
      /** The node's record as an enrolment leaves it: this identity, enrolled now. */
      const enrol = async (credential: NodeCredential, n: number) => {
        await store.nodes.enrol(node, {
          signingKey: `s${n}`,
          overlayKey: `o${n}`,
          brokerUser: credential.type === "amqp" ? credential.username : `nats-user-${n}`,
          profile: "{}",
          at: new Date().toISOString(),
        });
      };
      const at = new Date();
      await store.tokens.issue({
        id: "tok_rebuilt0001",
        node,
        secretHash: "00",
        createdAt: at.toISOString(),
        expiresAt: new Date(at.getTime() + 60_000).toISOString(),
      });
      const side = await transport.openControl();
      await side.bus.assert();
      const old = await transport.nodeFor(node);
      await enrol(old.credential, 1);
      // The old machine's last report, sent while no control plane consumed.
      const oldBus = await transport.openNode(node, old);
      await oldBus.publishReport(report(node, 7));
      await eventually("the broker to hold the old report", () =>
        transport.peekControl("report", node).then(
          () => true,
          () => undefined,
        ),
      );
      await oldBus.close();
      // The machine is rebuilt (more than the second the broker's clock is allowed to be behind) and joins again.
      await new Promise((resolve) => setTimeout(resolve, 1500));
      const fresh = await transport.nodeFor(node);
      await enrol(fresh.credential, 2);
      const freshBus = await transport.openNode(node, fresh);
      await freshBus.publishReport(report(node, 1));

      const ingest = new Ingest({
        store,
        bus: side.bus,
        log: createLogger({ level: "error" }),
        now: () => new Date(),
        resendAfterMs: 5000,
      });
      const consuming = side.bus.consumeControl((batch) => ingest.handleBatch(batch));
      try {
        await eventually("both reports judged", async () => {
          const counters = await store.counters.of(node);
          const kept = await store.accounts.history(node);
          return counters.report_from_before_enrolment === 1 && kept.length === 1 ? kept : undefined;
        });
        assert.deepEqual(
          (await store.accounts.history(node)).map((account) => account.reportSequence),
          [1],
          "only the new machine's report is kept",
        );
        await freshBus.publishReport(report(node, 2));
        await eventually("the new machine's next report kept", async () =>
          (await store.accounts.recoveryCopy(node))?.reportSequence === 2 ? true : undefined,
        );
      } finally {
        ingest.close();
        await freshBus.close();
        await side.close();
        await consuming;
      }
    });
  });
}
