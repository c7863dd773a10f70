/**
 * The control plane's metrics in the Prometheus text format, served over HTTP at `/metrics` when a listen address
 * is configured. Gauges are set, counters only rise; both are plain numbers read when scraped.
 */
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { MeshError } from "../errors.js";

interface Family {
  type: "gauge" | "counter";
  help: string;
  value: () => number;
}

export class Metrics {
  private readonly families = new Map<string, Family>();

  /** A gauge read when scraped. */
  gauge(name: string, help: string, read: () => number): void {
    this.define(name, { type: "gauge", help, value: read });
  }

  /** A counter; the returned function raises it. */
  counter(name: string, help: string): (by?: number) => void {
    let total = 0;
    this.define(name, { type: "counter", help, value: () => total });
    return (by = 1) => {
      total += by;
    };
  }

  /** The exposition text: HELP, TYPE and one sample per family. */
  text(): string {
    const lines: string[] = [];
    for (const [name, family] of this.families) {
      lines.push(
        `# HELP ${name} ${family.help}`,
        `# TYPE ${name} ${family.type}`,
        `${name} ${family.value()}`,
      );
    }
    return `${lines.join("\n")}\n`;
  }

  /** Serves `/metrics` on host:port (port 0: any free one). Resolves with the address actually bound. */
  async listen(host: string, port: number): Promise<MetricsServer> {
    const server = createServer((request, response) => {
      if (request.method === "GET" && request.url?.split("?")[0] === "/metrics") {
        response.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
        response.end(this.text());
        return;
      }
      response.writeHead(404, { "content-type": "text/plain" });
      response.end("only /metrics is served here\n");
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", (error) =>
        reject(new MeshError("metrics", `cannot serve metrics on ${host}:${port}: ${error.message}`)),
      );
      server.listen(port, host, resolve);
    });
    return new MetricsServer(server);
  }

  private define(name: string, family: Family): void {
    if (this.families.has(name)) throw new MeshError("metrics", `metric ${name} is defined twice`);
    this.families.set(name, family);
  }
}

export class MetricsServer {
  constructor(private readonly server: Server) {}

  get url(): string {
    const address = this.server.address() as AddressInfo;
    return `http://${address.address}:${address.port}/metrics`;
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve, reject) =>
      this.server.close((error) => (error === undefined ? resolve() : reject(error))),
    );
  }
}
