/**
 * The systemd units of the two executables, as text: `mesh.service` (the control plane) and `mesh-host.service` (the
 * agent). Pure functions of what `mesh install` and `mesh-host install` decided; writing and enabling them is
 * `install-unit.ts`. Each unit restarts on failure but not on the exit codes a restart cannot cure (`exitCodes`),
 * and is hardened as far as its job allows — the choices, and why, are written into the unit as comments.
 */
import { exitCodes, UsageError } from "../errors.js";

/** How the executable is started: Node by its absolute path, and the installed script (bin/…js) by its own. */
export interface Executable {
  node: string;
  script: string;
}

export interface HostUnitSpec extends Executable {
  stateDir: string;
  /** Where the agent writes declared files. */
  root: string;
}

export interface MeshUnitSpec extends Executable {
  dataDir: string;
  /** Given: `mesh serve --broker URL` on a broker that runs already; absent: `mesh up` with its own nats-server. */
  broker?: string | undefined;
  /** `--store URL`, when the store is not the SQLite file in the data dir (PostgreSQL, shared by controllers). */
  store?: string | undefined;
}

export const unitNames = { mesh: "mesh.service", "mesh-host": "mesh-host.service" } as const;

/** A unit file: sections of `key=value` lines, each line optionally preceded by comment lines. */
type Line = readonly [key: string, value: string] | { comment: string };
type Sections = ReadonlyArray<readonly [section: string, lines: readonly Line[]]>;

/** Exit codes after which restarting cannot help: bad usage (nothing changes by itself) and a refused identity. */
const noRestartCodes = [exitCodes.usage, exitCodes.identityRefused] as const;

export function hostUnit(spec: HostUnitSpec): string {
  const stateDir = absolute(spec.stateDir, "--state");
  const root = absolute(spec.root, "--root");
  const execStart = [...executable(spec), "run", "--state", stateDir, "--root", root];
  const hardening: Line[] =
    root === "/"
      ? [
          {
            comment:
              "The root is /: declared files may go anywhere (/etc, /srv, /home, /tmp …), so the file system is " +
              "left writable and home and /tmp are not hidden. Join with --root DIR to confine the agent to DIR.",
          },
          ...writableState(stateDir, "mesh-host"),
        ]
      : [
          {
            comment:
              "Declared files go under the root only: the rest of the file system is read-only to the agent.",
          },
          ["ProtectSystem", "strict"],
          ["ReadWritePaths", unitWord(root)],
          ...writableState(stateDir, "mesh-host"),
          ...homeAndTmp([root, stateDir]),
        ];
  return renderUnit([
    ["Unit", unitSection("mesh-host: the mesh's agent on this node")],
    ["Service", [...serviceStart(execStart), ...hardening, ...kernelProtection]],
    ["Install", installSection],
  ]);
}

export function meshUnit(spec: MeshUnitSpec): string {
  const dataDir = absolute(spec.dataDir, "--data");
  const command = spec.broker === undefined ? ["up"] : ["serve", "--broker", spec.broker];
  const store = spec.store === undefined ? [] : ["--store", spec.store];
  const execStart = [...executable(spec), "--data", dataDir, ...store, ...command];
  return renderUnit([
    ["Unit", unitSection("mesh: the control plane of a fleet of machines")],
    [
      "Service",
      [
        ...serviceStart(execStart),
        {
          comment:
            spec.broker === undefined
              ? "It writes only its data dir (the store, its keys, its own nats-server's JetStream files)."
              : "It writes only its data dir (the store, its keys).",
        },
        ...(spec.broker === undefined ? supervisorStop : []),
        ["ProtectSystem", "strict"],
        ...writableState(dataDir, "mesh"),
        ...homeAndTmp([dataDir]),
        ["PrivateDevices", "yes"],
        ["RestrictSUIDSGID", "yes"],
        ["LockPersonality", "yes"],
        ["RestrictRealtime", "yes"],
        ...kernelProtection,
      ],
    ],
    ["Install", installSection],
  ]);
}

function unitSection(description: string): Line[] {
  return [
    ["Description", description],
    ["Wants", "network-online.target"],
    ["After", "network-online.target"],
  ];
}

const installSection: Line[] = [["WantedBy", "multi-user.target"]];

/**
 * `mesh up` stops its children itself and in order — the control plane first, which gives the lease back through the
 * broker, then the broker: the stop signal goes to it alone, and what is left after the timeout is killed.
 */
const supervisorStop: Line[] = [
  {
    comment:
      "mesh up stops its control plane, then its nats-server, in that order: the signal goes to it alone.",
  },
  ["KillMode", "mixed"],
  ["TimeoutStopSec", "45s"],
];

const kernelProtection: Line[] = [
  ["ProtectKernelTunables", "yes"],
  ["ProtectKernelModules", "yes"],
  ["ProtectControlGroups", "yes"],
];

function serviceStart(execStart: readonly string[]): Line[] {
  return [
    // exec: the unit fails to start when the binary cannot be run, rather than seeming to start.
    ["Type", "exec"],
    ["ExecStart", execStart.map(execWord).join(" ")],
    ["Restart", "on-failure"],
    ["RestartSec", "5s"],
    {
      comment:
        `No restart cures exit ${exitCodes.usage} (bad usage: a flag, a setting) or exit ${exitCodes.identityRefused} ` +
        "(the broker refused the identity this runs as: the node was retired, or joined again elsewhere).",
    },
    ["RestartPreventExitStatus", noRestartCodes.join(" ")],
    ["NoNewPrivileges", "yes"],
  ];
}

/** A dir of its own under /var/lib is the unit's StateDirectory (systemd makes it, 0700); another is made writable. */
function writableState(dir: string, name: string): Line[] {
  if (dir === `/var/lib/${name}`) {
    return [
      ["StateDirectory", name],
      ["StateDirectoryMode", "0700"],
    ];
  }
  return [["ReadWritePaths", unitWord(dir)]];
}

/**
 * Home dirs are hidden and /tmp private, unless a path the service writes lies there: then home is only read-only
 * (the path's own ReadWritePaths= makes it writable again) and /tmp is the machine's own.
 */
function homeAndTmp(paths: readonly string[]): Line[] {
  const inHome = paths.some((path) => underAny(path, ["/home", "/root", "/run/user"]));
  const inTmp = paths.some((path) => underAny(path, ["/tmp", "/var/tmp"]));
  return [["ProtectHome", inHome ? "read-only" : "yes"], ...(inTmp ? [] : [["PrivateTmp", "yes"] as const])];
}

function underAny(path: string, dirs: readonly string[]): boolean {
  return dirs.some((dir) => path === dir || path.startsWith(`${dir}/`));
}

function executable(spec: Executable): string[] {
  return [absolute(spec.node, "the node binary"), absolute(spec.script, "the script")];
}

function absolute(path: string, what: string): string {
  if (!path.startsWith("/"))
    throw new UsageError(`${what} must be an absolute path for a systemd unit: ${path}`);
  return path.length > 1 ? path.replace(/\/+$/, "") : path;
}

export function renderUnit(sections: Sections): string {
  return sections
    .map(([section, lines]) =>
      [
        `[${section}]`,
        ...lines.map((line) => ("comment" in line ? wrapComment(line.comment) : `${line[0]}=${line[1]}`)),
      ].join("\n"),
    )
    .join("\n\n")
    .concat("\n");
}

function wrapComment(text: string): string {
  const lines: string[] = [];
  let current = "#";
  for (const word of text.split(" ")) {
    if (current.length + word.length + 1 > 116 && current !== "#") {
      lines.push(current);
      current = "#";
    }
    current += ` ${word}`;
  }
  lines.push(current);
  return lines.join("\n");
}

/**
 * One word of a unit setting: `%` doubled (systemd expands specifiers), in quotes when it holds a space. A control
 * character (a newline would start a setting of its own), a double quote or a backslash is refused: systemd reads
 * escapes differently from one setting to another, and no path or URL of the mesh needs them.
 */
export function unitWord(word: string): string {
  // eslint-disable-next-line no-control-regex -- control characters are exactly what is refused here
  if (/[\u0000-\u001f\u007f"\\]/.test(word) || word === "") {
    throw new UsageError(
      `a systemd unit cannot carry ${JSON.stringify(word)}: it is empty or holds a control character, " or \\`,
    );
  }
  const escaped = word.replace(/%/g, "%%");
  return /[\s';]/.test(escaped) ? `"${escaped}"` : escaped;
}

/** A word of ExecStart=: as `unitWord`, and `$` doubled (systemd expands environment variables there). */
export function execWord(word: string): string {
  return unitWord(word).replace(/\$/g, "$$$$");
}
