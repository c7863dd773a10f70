/**
 * The embedded broker: a nats-server in operator mode, configured from the control plane's authority and run as a
 * supervised child of `mesh up`. Its account JWTs are preloaded from the config file, so the file is rewritten
 * whenever an account changes (revocations), keeping a restarted server in step with the running one.
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import {
  accessSync,
  chmodSync,
  constants,
  createWriteStream,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
} from "node:fs";
import { createServer, connect as connectTcp } from "node:net";
import { delimiter, join } from "node:path";
import { MeshError } from "../../errors.js";
import { writePrivateFile } from "../../keys/index.js";

export interface NatsServerConfig {
  /** Where the config file, the JetStream store and the log go. */
  dir: string;
  host: string;
  port: number;
  operatorJwt: string;
  systemAccount: string;
  /** Account public key → account JWT, preloaded by the server's MEMORY resolver. */
  accounts: Readonly<Record<string, string>>;
}

/**
 * Writes the server's config file atomically (0600) and returns its path. The server's directory is kept 0700:
 * nats-server makes JetStream's files 0640 and its directories 0750, and they hold every message kept.
 */
export function writeNatsServerConfig(config: NatsServerConfig): string {
  mkdirSync(join(config.dir, "jetstream"), { recursive: true, mode: 0o700 });
  // A directory made before (by an older version, or by hand) is closed too: mkdir's mode applies only to new ones.
  chmodSync(config.dir, 0o700);
  const preload = Object.entries(config.accounts)
    .map(([key, jwt]) => `  ${key}: "${jwt}"`)
    .join("\n");
  const text = [
    "# Written by the mesh control plane; changes here are overwritten.",
    `listen: "${config.host}:${config.port}"`,
    `server_name: "mesh"`,
    `jetstream { store_dir: ${JSON.stringify(join(config.dir, "jetstream"))} }`,
    `operator: "${config.operatorJwt}"`,
    `system_account: "${config.systemAccount}"`,
    "resolver: MEMORY",
    "resolver_preload: {",
    preload,
    "}",
    "",
  ].join("\n");
  const path = join(config.dir, "nats-server.conf");
  writePrivateFile(path, text);
  return path;
}

/** The nats-server binary: on PATH, or where Debian installs it. */
export function findNatsServer(env: NodeJS.ProcessEnv = process.env): string {
  const candidates = [
    ...(env.PATH ?? "")
      .split(delimiter)
      .filter(Boolean)
      .map((d) => join(d, "nats-server")),
  ];
  candidates.push("/usr/sbin/nats-server", "/usr/local/bin/nats-server");
  for (const candidate of candidates) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch (error) {
      if (
        (error as NodeJS.ErrnoException).code !== "ENOENT" &&
        (error as NodeJS.ErrnoException).code !== "EACCES"
      ) {
        throw error;
      }
    }
  }
  throw new MeshError(
    "nats_server_missing",
    "nats-server was not found on PATH or in /usr/sbin: install it (Debian: apt-get install nats-server)",
  );
}

export interface RunningNatsServer {
  url: string;
  /** The server's process id (0 if it never started). */
  pid: number;
  /** Resolves with the exit code when the server process ends, for whatever reason. */
  exited: Promise<number | null>;
  stop(): Promise<void>;
}

export interface NatsServerStart {
  /** How long it may take to accept connections (default 15 s). */
  timeoutMs?: number;
  /**
   * Run it in a process group (and session) of its own, out of reach of the terminal's signals: what started it
   * stops it, in its own order. `mesh up` gives its lease back through this server before stopping it.
   */
  ownProcessGroup?: boolean;
}

/** Starts nats-server on a written config and waits until it accepts connections. */
export async function startNatsServer(
  configPath: string,
  listen: { host: string; port: number },
  logPath: string,
  { timeoutMs = 15_000, ownProcessGroup = false }: NatsServerStart = {},
): Promise<RunningNatsServer> {
  const binary = findNatsServer();
  const child: ChildProcess = spawn(binary, ["-c", configPath], {
    stdio: ["ignore", "pipe", "pipe"],
    detached: ownProcessGroup,
  });
  const closed = logOutputs(child, logPath);
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const spawnFailed = new Promise<never>((_, reject) =>
    child.once("error", (error) =>
      reject(new MeshError("nats_server_start", `cannot start ${binary}`, { cause: error })),
    ),
  );
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(timer);
    }
    await closed;
  };
  try {
    await Promise.race([
      waitForPort(listen.host, listen.port, timeoutMs),
      spawnFailed,
      exited.then((code) => {
        throw new MeshError(
          "nats_server_start",
          `nats-server exited with code ${code} at start; see ${logPath}`,
        );
      }),
    ]);
  } catch (error) {
    await stop();
    throw error;
  }
  return { url: `nats://${listen.host}:${listen.port}`, pid: child.pid ?? 0, exited, stop };
}

/**
 * Writes both of a child's outputs into one log, ended once both have closed (and settles then). Ended when the first
 * closed, or when the process exited (before its last output is read), the other's last lines would be written after
 * its end.
 */
export function logOutputs(child: ChildProcess, logPath: string): Promise<void> {
  const log = createWriteStream(logPath, { flags: "a", mode: 0o600 });
  child.stdout?.pipe(log, { end: false });
  child.stderr?.pipe(log, { end: false });
  return new Promise((resolve) =>
    child.once("close", () => {
      log.end();
      log.once("close", resolve);
    }),
  );
}

export async function waitForPort(host: string, port: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await portAnswers(host, port)) return;
    if (Date.now() > deadline) {
      throw new MeshError("timeout", `nothing answered on ${host}:${port} within ${timeoutMs} ms`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function portAnswers(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connectTcp({ host, port });
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    // A refused connection is the expected answer while the server is still starting.
    socket.once("error", () => resolve(false));
  });
}

/** Whether a port on this host can be listened on now. */
export function portIsFree(host: string, port: number): Promise<boolean> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", (error: NodeJS.ErrnoException) => {
      if (error.code === "EADDRINUSE" || error.code === "EACCES") resolve(false);
      else reject(error);
    });
    server.listen(port, host, () => server.close(() => resolve(true)));
  });
}

/** A port the system has free right now. */
export function freePort(host = "127.0.0.1"): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, host, () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/**
 * The process listening on a TCP port of this host, as `pid command…`, when Linux's /proc shows it to this user;
 * undefined when it cannot be told (another user's process without root, another system).
 */
export function whoListens(port: number): string | undefined {
  const inodes = new Set<string>();
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text: string;
    try {
      text = readFileSync(table, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") continue;
      throw error;
    }
    for (const line of text.split("\n").slice(1)) {
      const fields = line.trim().split(/\s+/);
      const [, local, , state, , , , , , inode] = fields;
      // State 0A is LISTEN; the local address ends with the port in hex.
      if (state === "0A" && local?.endsWith(`:${port.toString(16).toUpperCase().padStart(4, "0")}`) && inode)
        inodes.add(`socket:[${inode}]`);
    }
  }
  if (inodes.size === 0) return undefined;
  for (const pid of readdirSync("/proc").filter((entry) => /^\d+$/.test(entry))) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch (error) {
      // Another user's process, or one that ended meanwhile: not ours to see.
      if (["EACCES", "ENOENT", "EPERM"].includes((error as NodeJS.ErrnoException).code ?? "")) continue;
      throw error;
    }
    for (const fd of fds) {
      let target: string;
      try {
        target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch (error) {
        if (["EACCES", "ENOENT", "EPERM"].includes((error as NodeJS.ErrnoException).code ?? "")) continue;
        throw error;
      }
      if (inodes.has(target)) {
        let command: string;
        try {
          command = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).join(" ");
        } catch (error) {
          // Ended since its descriptor was read: it listens no more.
          if (["ENOENT", "ESRCH"].includes((error as NodeJS.ErrnoException).code ?? "")) break;
          throw error;
        }
        return `${pid} ${command}`.slice(0, 200);
      }
    }
  }
  return undefined;
}
