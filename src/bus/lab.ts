/** The lab's side of the broker: simulated nodes sharing connections (see nats/lab-bus.ts). */
import type { NodeBus } from "./bus.js";
import { authorityDir, brokerKindOf } from "./index.js";
import { NatsLabConnection } from "./nats/lab-bus.js";
import { MeshError } from "../errors.js";

/** One connection shared by a named group of lab nodes. */
export interface LabConnection {
  /** How many broker connections the group's nodes share: more than one when its identity was too long for one. */
  readonly parts: number;
  nodeBus(node: string): NodeBus;
  /** Stops reading what the broker sends the group (it waits, in order), until `resumeReading`. */
  pauseReading(): void;
  resumeReading(): void;
  close(): Promise<void>;
}

/** Opens a connection for `nodes` on the writers table's lab identity, minted with this mesh's account key. */
export async function openLabConnection(
  dataDir: string,
  url: string,
  nodes: readonly string[],
): Promise<LabConnection> {
  if (brokerKindOf(url) !== "nats") {
    throw new MeshError("unsupported_broker", "lab nodes share connections on NATS only");
  }
  return NatsLabConnection.open(authorityDir(dataDir), url, nodes);
}
