/**
 * The overlay applier: the node's WireGuard interface as the control plane composes it — its address, its port and
 * its peers. Kernel WireGuard when the kernel has it, else wireguard-go (a TUN device served by a userspace daemon).
 * Peers change in place (`wg syncconf`), so a node joining or retiring never drops the tunnels of the others.
 *
 * Each interface's configuration is kept in `overlay/<interface>.conf` in the state directory (mode 0600: it holds
 * the private key). That file is also the record of what the mesh brought up: an interface with a file here and no
 * longer declared is removed; an interface without one is someone else's and is never touched.
 *
 * wireguard-go is left to daemonize, as wg-quick does: its first process creates the TUN device and the control
 * socket and reports a failure on stderr before it exits, and the daemon it leaves behind lives exactly as long as
 * the device. So nothing needs a pid: `ip link del` ends both, for kernel and userspace alike, and the daemon
 * outlives an agent restart, as the tunnels should.
 */
import { execFile } from "node:child_process";
import { lstatSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { MeshError } from "../errors.js";
import { overlayPublicKeyOf, readPrivateFile, writePrivateFile } from "../keys/index.js";
import { boundText } from "../link/index.js";
import type { DeclaredItem } from "../link/index.js";
import type { Logger } from "../log.js";
import { errorText } from "../log.js";
import type { Drift, ItemResult, KindApplier } from "./appliers.js";
import { stateFiles } from "./state.js";

type OverlayItem = Extract<DeclaredItem, { type: "overlay" }>;

export interface OverlayApplierOptions {
  /** The agent's state directory: the key is read from `overlay.key`, configurations go in `overlay/`. */
  stateDir: string;
  log: Logger;
  /**
   * The node's WireGuard private key, base64 of 32 bytes. Default: `overlay.key` in the state directory (made at
   * join), read at each apply so a replaced key is taken up.
   */
  privateKey?: () => string;
  /** Where wireguard-go keeps its control sockets: /var/run/wireguard (compiled into wireguard-go and wg). */
  socketDir?: string;
}

/** The tools the applier runs, and the Debian package of each, named when one is missing. */
const toolPackages = { ip: "iproute2", wg: "wireguard-tools", "wireguard-go": "wireguard-go" } as const;
type Tool = keyof typeof toolPackages;

const keepaliveSeconds = 25;
const configDirMode = 0o700;
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
// `wg show <if> dump` lists every peer on a line; 100 000 peers take a few tens of MiB.
const outputMaxBytes = 64 * 1024 * 1024;

/**
 * A tool could not be run, or ended in failure; the message names the tool and its last line of stderr, or the
 * Debian package to install when `missing`.
 */
export class OverlayToolError extends MeshError {
  constructor(
    message: string,
    readonly missing = false,
    options?: { cause?: unknown },
  ) {
    super("applier", message, options);
    this.name = "OverlayToolError";
  }
}

/** An item that will not be applied as declared, with the reason a person reads in the report. */
class Refusal extends Error {
  override name = "Refusal";
}

/** What `ip -j -d address show` says of one interface (only the fields read here). */
const linkSchema = z.object({
  ifindex: z.int(),
  ifname: z.string(),
  flags: z.array(z.string()).default([]),
  linkinfo: z.object({ info_kind: z.string().optional() }).optional(),
  addr_info: z
    .array(
      z.object({
        family: z.string().optional(),
        local: z.string().optional(),
        prefixlen: z.int().optional(),
      }),
    )
    .default([]),
});
const linksSchema = z.array(linkSchema);

/** An interface as the system holds it now. */
export interface OverlayLink {
  ifindex: number;
  /** "kernel" (type wireguard), "wireguard-go" (a TUN device with a control socket), or what else it is. */
  driver: "kernel" | "wireguard-go" | { other: string };
  up: boolean;
  /** IPv4 addresses as `a.b.c.d/prefix`. */
  addresses: string[];
}

/**
 * Applies `overlay` items: one WireGuard interface per item, at most one item per interface. Apply and verify run
 * one at a time.
 */
export class OverlayApplier implements KindApplier {
  readonly types = ["overlay"] as const;
  private readonly stateDir: string;
  private readonly log: Logger;
  private readonly privateKey: () => string;
  private readonly socketDir: string;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(options: OverlayApplierOptions) {
    this.stateDir = options.stateDir;
    this.log = options.log;
    this.socketDir = options.socketDir ?? "/var/run/wireguard";
    this.privateKey =
      options.privateKey ?? (() => readPrivateFile(join(options.stateDir, stateFiles.overlayKey)).trim());
  }

  apply(given: readonly DeclaredItem[]): Promise<ItemResult[]> {
    return this.serially(() => this.applyNow(overlayItems(given)));
  }

  /** Where each declared interface is missing, down, addressed otherwise or holds other peers; nothing changes. */
  verify(given: readonly DeclaredItem[]): Promise<Drift[]> {
    return this.serially(async () => {
      const drifts: Drift[] = [];
      for (const item of overlayItems(given)) {
        const what = await this.driftOf(item).catch(
          (error: unknown) => `cannot be looked at: ${errorText(error)}`,
        );
        if (what !== undefined) drifts.push({ id: item.id, what: boundText(what) });
      }
      return drifts;
    });
  }

  /** Takes as its own each `overlay:<interface>` that is a WireGuard interface here: the next apply manages it. */
  adopt(ids: readonly string[]): Promise<void> {
    return this.serially(async () => {
      const links = await this.links();
      for (const id of ids) {
        const name = id.startsWith("overlay:") ? id.slice("overlay:".length) : undefined;
        if (name === undefined || !interfacePattern.test(name)) continue;
        const link = links.get(name);
        if (link === undefined || typeof link.driver !== "string" || this.owns(name)) continue;
        // A placeholder: the record that it is the mesh's; the next apply writes the real configuration over it.
        this.writeConfig(name, "# adopted by mesh-host; written again on the next apply\n");
      }
    });
  }

  /** The interface as it stands, or undefined when there is none (for tests and `mesh-host` diagnostics). */
  async link(name: string): Promise<OverlayLink | undefined> {
    return (await this.links()).get(name);
  }

  private serially<T>(work: () => Promise<T>): Promise<T> {
    const next = this.queue.then(work);
    this.queue = next.catch((error: unknown) => error);
    return next;
  }

  private async applyNow(items: OverlayItem[]): Promise<ItemResult[]> {
    const results: ItemResult[] = [];
    const declared = new Set<string>();
    let privateKey: string | undefined;
    let keyProblem: string | undefined;
    try {
      privateKey = this.privateKey();
      overlayPublicKeyOf(privateKey);
    } catch (error) {
      keyProblem = `the node's overlay private key cannot be used: ${errorText(error)}`;
    }
    for (const item of items) {
      const first = !declared.has(item.interface);
      declared.add(item.interface);
      if (!first) {
        results.push(failed(item.id, `interface ${item.interface} is declared by more than one item`));
      } else if (privateKey === undefined) {
        results.push(failed(item.id, keyProblem ?? "the node's overlay private key cannot be used"));
      } else {
        try {
          results.push({ id: item.id, state: "applied", detail: await this.applyOne(item, privateKey) });
        } catch (error) {
          const reason = error instanceof Refusal ? error.message : `${item.interface}: ${errorText(error)}`;
          results.push(failed(item.id, reason));
        }
      }
    }
    for (const name of this.ownedInterfaces()) {
      if (declared.has(name)) continue;
      try {
        await this.remove(name);
      } catch (error) {
        results.push(failed(`overlay:${name}`, `could not remove interface ${name}: ${errorText(error)}`));
      }
    }
    return results;
  }

  /** Makes one interface as declared; returns how it stands, for the report. */
  private async applyOne(item: OverlayItem, privateKey: string): Promise<string> {
    const name = item.interface;
    const address = canonicalCidr(item.address, "address");
    const config = renderConfig(item, privateKey);
    let link = await this.link(name);
    if (link !== undefined && !this.owns(name)) {
      throw new Refusal(
        `${name} exists and was not brought up by the mesh; remove it or declare another interface name`,
      );
    }
    if (link !== undefined && typeof link.driver !== "string") {
      throw new Refusal(`${name} exists and is not a WireGuard interface (it is ${link.driver.other})`);
    }
    const path = this.writeConfig(name, config);
    if (link === undefined) {
      const created = await this.create(name);
      link = await this.link(name);
      if (link === undefined) throw new Refusal(`${name} was created with ${created} but is gone again`);
      this.log.info("overlay.up", { interface: name, driver: created });
    }
    const driver = link.driver;
    if (typeof driver !== "string")
      throw new Refusal(`${name} is not a WireGuard interface (${driver.other})`);
    // In place: peers that stay keep their sessions, so the tunnels of the rest of the fleet never drop.
    await run("wg", ["syncconf", name, path]);
    for (const held of link.addresses) {
      if (held !== address) await run("ip", ["address", "del", held, "dev", name]);
    }
    if (!link.addresses.includes(address)) await run("ip", ["address", "replace", address, "dev", name]);
    if (!link.up) await run("ip", ["link", "set", name, "up"]);
    const peers = item.peers.length === 1 ? "1 peer" : `${item.peers.length} peers`;
    return `${driver === "kernel" ? "kernel WireGuard" : "wireguard-go"} on ${name}, ${address}, port ${item.listen_port}, ${peers}`;
  }

  /** Brings the interface up: kernel WireGuard when the kernel has it, else wireguard-go. */
  private async create(name: string): Promise<"kernel" | "wireguard-go"> {
    let kernelProblem: string;
    try {
      await run("ip", ["link", "add", name, "type", "wireguard"]);
      return "kernel";
    } catch (error) {
      if (!(error instanceof OverlayToolError) || error.missing) throw error;
      kernelProblem = error.message;
    }
    try {
      await run("wireguard-go", [name]);
      return "wireguard-go";
    } catch (error) {
      if (error instanceof OverlayToolError && error.missing) {
        throw new Refusal(
          `this kernel has no WireGuard (${kernelProblem}) and wireguard-go is not installed; ` +
            `install Debian's wireguard-go package`,
          { cause: error },
        );
      }
      throw new Refusal(`no WireGuard: kernel: ${kernelProblem}; userspace: ${errorText(error)}`, {
        cause: error,
      });
    }
  }

  /** Takes down an interface the mesh brought up (its wireguard-go ends with it) and forgets it. */
  private async remove(name: string): Promise<void> {
    const link = await this.link(name);
    // Something else under the same name now (the mesh's was deleted by hand and the name reused) is not ours.
    if (link !== undefined && typeof link.driver === "string") await run("ip", ["link", "del", name]);
    rmSync(this.configPath(name), { force: true });
    this.log.info("overlay.removed", { interface: name, was: link === undefined ? "absent" : "up" });
  }

  private async driftOf(item: OverlayItem): Promise<string | undefined> {
    const name = item.interface;
    const link = await this.link(name);
    if (link === undefined) return `interface ${name} is missing`;
    if (typeof link.driver !== "string")
      return `${name} is not a WireGuard interface (it is ${link.driver.other})`;
    const differences: string[] = [];
    if (!link.up) differences.push(`${name} is down`);
    const address = canonicalCidr(item.address, "address");
    if (link.addresses.length !== 1 || link.addresses[0] !== address) {
      const held = link.addresses.length === 0 ? "none" : link.addresses.join(", ");
      differences.push(`address is ${held}, declared ${address}`);
    }
    const dump = parseDump((await run("wg", ["show", name, "dump"])).stdout);
    if (dump.listenPort !== item.listen_port)
      differences.push(`listens on port ${dump.listenPort}, declared ${item.listen_port}`);
    let publicKey: string | undefined;
    try {
      publicKey = overlayPublicKeyOf(this.privateKey());
    } catch (error) {
      differences.push(`the node's overlay private key cannot be used: ${errorText(error)}`);
    }
    if (publicKey !== undefined && dump.publicKey !== publicKey)
      differences.push("runs with another private key than the node's");
    const peers = peerDifferences(item, dump.peers);
    if (peers !== undefined) differences.push(peers);
    return differences.length === 0 ? undefined : differences.join("; ");
  }

  /** Every interface on this machine, by name. */
  private async links(): Promise<Map<string, OverlayLink>> {
    const { stdout } = await run("ip", ["-j", "-d", "address", "show"]);
    let value: unknown;
    try {
      value = JSON.parse(stdout);
    } catch (error) {
      throw new OverlayToolError(`ip -j address show printed no JSON: ${errorText(error)}`, false, {
        cause: error,
      });
    }
    const parsed = linksSchema.safeParse(value);
    if (!parsed.success)
      throw new OverlayToolError(`ip -j address show printed something unexpected: ${parsed.error.message}`);
    const links = new Map<string, OverlayLink>();
    for (const raw of parsed.data) {
      const kind = raw.linkinfo?.info_kind ?? "a device without a kind";
      const driver: OverlayLink["driver"] =
        kind === "wireguard"
          ? "kernel"
          : kind === "tun" && this.isSocket(join(this.socketDir, `${raw.ifname}.sock`))
            ? "wireguard-go"
            : { other: kind === "tun" ? "a TUN device no wireguard-go serves" : `of kind ${kind}` };
      const addresses = raw.addr_info.flatMap((entry) =>
        entry.family === "inet" && entry.local !== undefined && entry.prefixlen !== undefined
          ? [`${entry.local}/${entry.prefixlen}`]
          : [],
      );
      links.set(raw.ifname, { ifindex: raw.ifindex, driver, up: raw.flags.includes("UP"), addresses });
    }
    return links;
  }

  private isSocket(path: string): boolean {
    return lstatSync(path, { throwIfNoEntry: false })?.isSocket() === true;
  }

  private configPath(name: string): string {
    return join(this.stateDir, "overlay", `${name}.conf`);
  }

  private owns(name: string): boolean {
    return lstatSync(this.configPath(name), { throwIfNoEntry: false }) !== undefined;
  }

  /** Writes the configuration when it changed (0600, atomically); returns its path. */
  private writeConfig(name: string, config: string): string {
    const path = this.configPath(name);
    mkdirSync(join(this.stateDir, "overlay"), { recursive: true, mode: configDirMode });
    const present =
      lstatSync(path, { throwIfNoEntry: false }) === undefined ? undefined : readFileSync(path, "utf8");
    if (present !== config) writePrivateFile(path, config);
    return path;
  }

  /** The interfaces the mesh brought up: those with a configuration in the state directory. */
  private ownedInterfaces(): string[] {
    const dir = join(this.stateDir, "overlay");
    if (lstatSync(dir, { throwIfNoEntry: false }) === undefined) return [];
    return readdirSync(dir)
      .filter((file) => file.endsWith(".conf"))
      .map((file) => file.slice(0, -".conf".length))
      .filter((name) => interfacePattern.test(name))
      .sort();
  }
}

const interfacePattern = /^[a-z][a-z0-9]{0,14}$/;

/**
 * The configuration `wg syncconf` takes: no Address (that is ip's), keys and addresses as validated by the item's
 * schema, so nothing declared can add a line of its own. Allowed IPs are written as networks, the form wg keeps.
 */
export function renderConfig(item: OverlayItem, privateKey: string): string {
  const lines = ["[Interface]", `PrivateKey = ${privateKey}`, `ListenPort = ${item.listen_port}`];
  for (const peer of item.peers) {
    lines.push("", "[Peer]", `PublicKey = ${peer.public_key}`);
    lines.push(`AllowedIPs = ${peer.allowed_ips.map((cidr) => networkOf(cidr)).join(", ")}`);
    if (peer.endpoint !== undefined) lines.push(`Endpoint = ${peer.endpoint}`);
    lines.push(`PersistentKeepalive = ${keepaliveSeconds}`);
  }
  return `${lines.join("\n")}\n`;
}

interface Dump {
  publicKey: string;
  listenPort: number;
  /** Public key → allowed IPs, sorted. */
  peers: Map<string, string[]>;
}

/** `wg show <if> dump`: the interface's line (private key, public key, port, fwmark), then one line per peer. */
function parseDump(text: string): Dump {
  const [head, ...rest] = text.split("\n").filter((line) => line !== "");
  const fields = head?.split("\t") ?? [];
  if (fields.length < 4) throw new OverlayToolError("wg show dump printed no interface line");
  const peers = new Map<string, string[]>();
  for (const line of rest) {
    const [publicKey, , , allowed] = line.split("\t");
    if (publicKey === undefined || allowed === undefined)
      throw new OverlayToolError("wg show dump printed a peer line it should not");
    peers.set(publicKey, allowed === "(none)" ? [] : allowed.split(",").sort());
  }
  return { publicKey: fields[1] ?? "", listenPort: Number(fields[2]), peers };
}

/** How the peers held differ from the declared ones, by public key and allowed IPs; undefined when they do not. */
function peerDifferences(item: OverlayItem, held: Map<string, string[]>): string | undefined {
  const declared = new Map(
    item.peers.map((peer) => [peer.public_key, peer.allowed_ips.map((cidr) => networkOf(cidr)).sort()]),
  );
  const missing = [...declared.keys()].filter((key) => !held.has(key));
  const extra = [...held.keys()].filter((key) => !declared.has(key));
  const changed = [...declared].filter(([key, ips]) => {
    const now = held.get(key);
    return now !== undefined && now.join(",") !== ips.join(",");
  });
  const parts: string[] = [];
  if (missing.length > 0) parts.push(`${missing.length} declared peers missing (${shortKeys(missing)})`);
  if (extra.length > 0) parts.push(`${extra.length} undeclared peers held (${shortKeys(extra)})`);
  if (changed.length > 0)
    parts.push(`${changed.length} peers with other allowed IPs (${shortKeys(changed.map(([key]) => key))})`);
  return parts.length === 0 ? undefined : `peers differ: ${parts.join(", ")}`;
}

function shortKeys(keys: string[]): string {
  const shown = keys.slice(0, 3).map((key) => `${key.slice(0, 8)}…`);
  return keys.length > 3 ? `${shown.join(", ")} and ${keys.length - 3} more` : shown.join(", ");
}

/**
 * An IPv4 address with prefix in the form ip prints it. The schema allows "10.099.0.5/24", which ip would read as
 * octal, so the octets are read as decimal here and checked for range.
 */
function canonicalCidr(cidr: string, what: string): string {
  const [address = "", prefix = ""] = cidr.split("/");
  const octets = address.split(".").map(Number);
  const bits = Number(prefix);
  if (
    octets.length !== 4 ||
    octets.some((octet) => !(octet >= 0 && octet <= 255)) ||
    !(bits >= 0 && bits <= 32)
  )
    throw new Refusal(`${what} ${cidr} is not an IPv4 address with a prefix of 0–32`);
  return `${octets.join(".")}/${bits}`;
}

/** The network a CIDR names, host bits cleared: wg keeps allowed IPs so, and they are compared so. */
function networkOf(cidr: string): string {
  const canonical = canonicalCidr(cidr, "allowed IP");
  const [address = "", prefix = ""] = canonical.split("/");
  const bits = Number(prefix);
  const value = address.split(".").reduce((sum, octet) => sum * 256 + Number(octet), 0);
  const mask = bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
  const network = (value & mask) >>> 0;
  return `${[24, 16, 8, 0].map((shift) => (network >>> shift) & 255).join(".")}/${bits}`;
}

/**
 * Runs a tool without a shell. The environment is this one's less LOG_LEVEL and the WG_ variables: with LOG_LEVEL
 * set, wireguard-go hands our stdout and stderr to the daemon it leaves behind, which would hold them open for good,
 * and WG_PROCESS_FOREGROUND would keep it from daemonizing at all.
 */
function run(tool: Tool, args: readonly string[]): Promise<{ stdout: string; stderr: string }> {
  const env: NodeJS.ProcessEnv = { PATH: defaultPath };
  for (const [key, value] of Object.entries(process.env)) {
    if (key !== "LOG_LEVEL" && !key.startsWith("WG_")) env[key] = value;
  }
  return new Promise((resolve, reject) => {
    execFile(tool, args, { env, encoding: "utf8", maxBuffer: outputMaxBytes }, (error, stdout, stderr) => {
      if (error === null) {
        resolve({ stdout, stderr });
        return;
      }
      const command = `${tool} ${args.join(" ")}`;
      if ((error as NodeJS.ErrnoException).code === "ENOENT") {
        reject(
          new OverlayToolError(
            `${tool} is not installed: install Debian's ${toolPackages[tool]} package`,
            true,
            {
              cause: error,
            },
          ),
        );
        return;
      }
      const line = lastLine(stderr) ?? `exit code ${String(error.code ?? error.signal ?? "unknown")}`;
      reject(new OverlayToolError(`${command}: ${line}`, false, { cause: error }));
    });
  });
}

/** The last line of a tool's stderr that says something (wireguard-go frames a notice in box-drawing lines). */
function lastLine(stderr: string): string | undefined {
  return stderr
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "" && !/^[│┌└]/.test(line))
    .at(-1);
}

function failed(id: string, reason: string): ItemResult {
  return { id, state: "failed", reason: boundText(reason) };
}

function overlayItems(items: readonly DeclaredItem[]): OverlayItem[] {
  return items.filter((item): item is OverlayItem => item.type === "overlay");
}
