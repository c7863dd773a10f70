/**
 * The acting control plane's metrics: where it stands on the lease, and what it did with the control queue. Served
 * at `/metrics` when a listen address is configured.
 */
import type { MeshOptions } from "../config/options.js";
import type { Logger } from "../log.js";
import type { MetricsServer } from "./metrics.js";
import { Metrics } from "./metrics.js";

/** What the lease metrics read when scraped. */
export interface LeaseReading {
  /** Holds the lease and its gate is open. */
  held(): boolean;
  /** The epoch acted under, if any. */
  epoch(): number | undefined;
  /** Acts without any epoch (urgent). */
  withoutEpoch(): boolean;
}

export class ControlMetrics {
  readonly metrics = new Metrics();
  /** Messages from the control queue handled. */
  readonly handled: (by?: number) => void;
  /** Messages handed back to the broker because the gate was closed. */
  readonly handedBack: (by?: number) => void;
  /** Receipts sent to nodes for their reports. */
  readonly receiptsSent: (by?: number) => void;

  constructor(lease: LeaseReading) {
    const { metrics } = this;
    metrics.gauge("mesh_lease_held", "1 while this controller holds the lease and its gate is open", () =>
      lease.held() ? 1 : 0,
    );
    metrics.gauge(
      "mesh_lease_epoch",
      "the epoch this controller acts under (0: none)",
      () => lease.epoch() ?? 0,
    );
    metrics.gauge(
      "mesh_lease_no_epoch",
      "1 while this controller acts without any epoch because the lease cannot be written (urgent)",
      () => (lease.withoutEpoch() ? 1 : 0),
    );
    this.handled = metrics.counter(
      "mesh_control_messages_total",
      "messages from the control queue this control plane has handled",
    );
    this.handedBack = metrics.counter(
      "mesh_control_messages_handed_back_total",
      "messages handed back to the broker because the gate was closed",
    );
    this.receiptsSent = metrics.counter(
      "mesh_receipts_sent_total",
      "receipts this control plane has sent to nodes for their reports (one for each node's newest of a period)",
    );
  }

  /** Serves `/metrics` where the options say, or nowhere; the address bound is logged. */
  async serve(where: MeshOptions["metrics"], log: Logger): Promise<MetricsServer | undefined> {
    if (where === undefined) return undefined;
    const server = await this.metrics.listen(where.host, where.port);
    log.info("metrics.serving", { url: server.url });
    return server;
  }
}
