/**
 * A TCP proxy in front of PostgreSQL that the suite can cut: every connection through it is destroyed, and new ones
 * are refused (taken and closed at once, before the server's first byte) until it forwards again. To the control
 * plane behind it the store is unreachable, while the real server, and everyone else on it, goes on.
 */
import type { Socket } from "node:net";
import { createConnection, createServer } from "node:net";

export class CuttableProxy {
  private readonly sockets = new Set<Socket>();
  private cut = false;
  private readonly server = createServer((client) => this.take(client));
  /** Connections refused while cut: the control plane trying again. */
  refused = 0;
  port = 0;

  constructor(private readonly target: { host: string; port: number }) {}

  async listen(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(0, "127.0.0.1", () => resolve());
    });
    const address = this.server.address();
    if (address === null || typeof address === "string") throw new Error("the proxy has no port");
    this.port = address.port;
  }

  /** Destroys every connection through the proxy and refuses new ones until `restore()`. */
  cutOff(): void {
    this.cut = true;
    for (const socket of this.sockets) socket.destroy();
  }

  restore(): void {
    this.cut = false;
  }

  async close(): Promise<void> {
    this.cutOff();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private take(client: Socket): void {
    if (this.cut) {
      this.refused++;
      client.destroy();
      return;
    }
    const upstream = createConnection(this.target);
    for (const socket of [client, upstream]) {
      this.sockets.add(socket);
      socket.once("close", () => this.sockets.delete(socket));
      // A reset on either side ends the pair: each side then sees its own socket close, as through a real path.
      socket.on("error", () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    upstream.pipe(client);
  }
}
