/**
 * What a declaration can hold, one schema per kind: files (regular files, directories, symlinks), users, groups and
 * services. The wire carries each item with its `id` and `type`; an operator writes the same fields without them
 * (`mesh declare -f`, a plan unit's contents), and those schemas are derived from these, so whatever the node would
 * refuse is refused when the operator writes it.
 */
import { z } from "zod";

/** The most bytes one file's content may have (as decoded): a declaration travels in one message of 1 MiB. */
export const fileContentMaxBytes = 512 * 1024;

/** True for an absolute path with no `..` segment and no NUL, so an item cannot point outside where it says. */
export function isPlainAbsolutePath(path: string): boolean {
  return path.startsWith("/") && !path.includes("\0") && !path.split("/").includes("..");
}

const absolutePath = z
  .string()
  .max(4_096)
  .refine(isPlainAbsolutePath, { error: "expected an absolute path with no '..' segment" });

const mode = z.string().regex(/^[0-7]{3,4}$/, { error: 'expected an octal file mode such as "0644"' });

/** A user or group as the system's tools take it: a name, or a numeric id. */
const accountName = z.string().regex(/^[a-z_][a-z0-9_-]{0,31}$/, {
  error: "expected a user or group name: 1–32 of a-z, 0-9, '_' and '-', starting with a letter or '_'",
});
const owner = z.union([accountName, z.int().min(0).max(4_294_967_294)]);
const systemId = z.int().min(0).max(4_294_967_294);

const fileFields = {
  path: absolutePath,
};
const fileAccess = {
  mode: mode.optional(),
  owner: owner.optional(),
  group: owner.optional(),
};

function utf8Bytes(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

/** A regular file's content: `content` (UTF-8 text) or `content_base64` (any bytes), not both. */
const contentFields = {
  content: z
    .string()
    .refine((text) => utf8Bytes(text) <= fileContentMaxBytes, {
      error: `expected at most ${fileContentMaxBytes} bytes of content`,
    })
    .optional(),
  content_base64: z
    .string()
    .regex(/^[A-Za-z0-9+/]*={0,2}$/, { error: "expected base64" })
    .refine((text) => Buffer.from(text, "base64").byteLength <= fileContentMaxBytes, {
      error: `expected at most ${fileContentMaxBytes} bytes of content`,
    })
    .optional(),
};
const oneContent = [
  (file: { content?: string | undefined; content_base64?: string | undefined }) =>
    (file.content === undefined) !== (file.content_base64 === undefined),
  { error: "give content or content_base64, exactly one" },
] as const;

const userFields = {
  name: accountName,
  uid: systemId.optional(),
  /** The primary group, by name or id (absent: the system's default, a group of the user's own name). */
  group: owner.optional(),
  /** Supplementary groups. */
  groups: z.array(accountName).max(64).optional(),
  shell: absolutePath.optional(),
  home: absolutePath.optional(),
  /** Lines of `~/.ssh/authorized_keys`, managed whole. */
  authorized_keys: z.array(z.string().min(1).max(16_384)).max(256).optional(),
  /** Take over a user that exists and was not made by the mesh (refused otherwise). */
  adopt: z.boolean().optional(),
};

const groupFields = {
  name: accountName,
  gid: systemId.optional(),
  adopt: z.boolean().optional(),
};

const signalName = z.enum(["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGKILL"]);

const serviceFields = {
  name: z.string().regex(/^[a-z0-9][a-z0-9_.-]{0,62}$/, {
    error: "expected a service name: 1–63 of a-z, 0-9, '.', '_' and '-'",
  }),
  /** argv: the program (an absolute path) and its arguments; no shell is involved. */
  command: z
    .tuple([absolutePath], z.string().max(4_096))
    .refine((argv) => argv.length <= 256, { error: "expected at most 256 arguments" }),
  env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string().max(16_384)).optional(),
  cwd: absolutePath.optional(),
  user: owner.optional(),
  group: owner.optional(),
  restart: z.enum(["always", "on-failure", "never"]).default("on-failure"),
  stop_signal: signalName.optional(),
  /** How long a stop waits after the signal before SIGKILL, in milliseconds. */
  stop_grace_ms: z.int().min(0).max(600_000).optional(),
};

/** A WireGuard public key: base64 of 32 bytes. */
const wireguardKey = z.string().regex(/^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$/, {
  error: "expected a WireGuard public key: base64 of 32 bytes",
});
const cidr = z.string().regex(/^(\d{1,3}\.){3}\d{1,3}\/\d{1,2}$/, {
  error: "expected an IPv4 address with its prefix, e.g. 10.99.0.5/32",
});
const endpoint = z.string().regex(/^(\d{1,3}\.){3}\d{1,3}:\d{1,5}$/, {
  error: "expected an IPv4 address and port, e.g. 192.0.2.7:51820",
});

/**
 * The overlay network as one node holds it: its own address, the port it listens on, and its peers — each other
 * node's overlay public key, the addresses routed to it, and where to reach it when known. Composed by the control
 * plane only (never written by an operator); the node's private overlay key never leaves it.
 */
const overlayFields = {
  interface: z
    .string()
    .regex(/^[a-z][a-z0-9]{0,14}$/, { error: "expected an interface name: up to 15 of a-z, 0-9" }),
  address: cidr,
  listen_port: z.int().min(1).max(65_535),
  peers: z
    .array(
      z.strictObject({
        node: z.string().min(1).max(63),
        public_key: wireguardKey,
        allowed_ips: z.array(cidr).min(1).max(16),
        endpoint: endpoint.optional(),
      }),
    )
    .max(100_000),
};

/** The operator's forms (and what the node applies, less `id`). */
export const plannedFileSchema = z.preprocess(
  // A file entry without a type is a regular file: the type is then filled in, so errors name the right fields.
  (value) =>
    typeof value === "object" && value !== null && !Array.isArray(value) && !("type" in value)
      ? { ...value, type: "file" }
      : value,
  z.discriminatedUnion("type", [
    z
      .strictObject({ type: z.literal("file"), ...fileFields, ...contentFields, ...fileAccess })
      .refine(...oneContent),
    z.strictObject({ type: z.literal("directory"), ...fileFields, ...fileAccess }),
    z.strictObject({ type: z.literal("symlink"), ...fileFields, target: z.string().min(1).max(4_096) }),
  ]),
);
export const plannedUserSchema = z.strictObject(userFields);
export const plannedGroupSchema = z.strictObject(groupFields);
export const plannedServiceSchema = z.strictObject(serviceFields);

/**
 * The wire's forms: each with its id (`<kind>:<name>`, what reports name it by) and its type first. The encoding
 * lists fields in this order, and an item's digest is over that encoding.
 */
const itemId = z.string().max(4_200);
export const fileItem = z
  .strictObject({ id: itemId, type: z.literal("file"), ...fileFields, ...contentFields, ...fileAccess })
  .refine(...oneContent);
export const directoryItem = z.strictObject({
  id: itemId,
  type: z.literal("directory"),
  ...fileFields,
  ...fileAccess,
});
export const symlinkItem = z.strictObject({
  id: itemId,
  type: z.literal("symlink"),
  ...fileFields,
  target: z.string().min(1).max(4_096),
});
export const userItem = z.strictObject({ id: itemId, type: z.literal("user"), ...userFields });
export const groupItem = z.strictObject({ id: itemId, type: z.literal("group"), ...groupFields });
export const serviceItem = z.strictObject({ id: itemId, type: z.literal("service"), ...serviceFields });
export const overlayItem = z.strictObject({ id: itemId, type: z.literal("overlay"), ...overlayFields });

export type PlannedFile = z.infer<typeof plannedFileSchema>;
export type PlannedUser = z.infer<typeof plannedUserSchema>;
export type PlannedGroup = z.infer<typeof plannedGroupSchema>;
export type PlannedService = z.infer<typeof plannedServiceSchema>;

/** Every wire item, by its `type`. */
export const declaredItemSchema = z.discriminatedUnion("type", [
  fileItem,
  directoryItem,
  symlinkItem,
  userItem,
  groupItem,
  serviceItem,
  overlayItem,
]);
export type DeclaredItem = z.infer<typeof declaredItemSchema>;

/**
 * The id an item must carry: a path for what lives in the file system (so a file and a directory cannot both claim
 * one), a name for the rest.
 */
export function itemIdOf(item: DeclaredItem): string {
  switch (item.type) {
    case "file":
    case "directory":
    case "symlink":
      return `file:${item.path}`;
    case "user":
      return `user:${item.name}`;
    case "group":
      return `group:${item.name}`;
    case "service":
      return `service:${item.name}`;
    case "overlay":
      return `overlay:${item.interface}`;
    default: {
      const unknown: never = item;
      return unknown;
    }
  }
}

/** The drivers a node must advertise to hold items of this type. */
export function driverOf(type: DeclaredItem["type"]): string {
  return type === "directory" || type === "symlink" ? "file" : type;
}

/** What a unit holds, as the operator writes it, made into wire items (ids and types added), in a fixed order. */
export function itemsOfContents(contents: {
  files?: readonly PlannedFile[];
  users?: readonly PlannedUser[];
  groups?: readonly PlannedGroup[];
  services?: readonly PlannedService[];
}): DeclaredItem[] {
  const raw: unknown[] = [];
  for (const group of contents.groups ?? []) raw.push({ id: `group:${group.name}`, type: "group", ...group });
  for (const user of contents.users ?? []) raw.push({ id: `user:${user.name}`, type: "user", ...user });
  for (const file of contents.files ?? []) raw.push({ id: `file:${file.path}`, ...file });
  for (const service of contents.services ?? [])
    raw.push({ id: `service:${service.name}`, type: "service", ...service });
  // Through the wire's schema: its field order is the encoding's, so the digest of these items is the digest of
  // what is signed and sent.
  return raw.map((item) => declaredItemSchema.parse(item));
}
