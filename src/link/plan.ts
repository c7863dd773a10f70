/**
 * The plan: the fleet's desired state as named units, each a selector over the nodes' profiles and the items its
 * nodes should hold. A unit without `count` goes to every node it matches; one with `count: N` to N distinct nodes
 * (with its `resources` fitting each). The operator writes it as YAML or JSON; this contract checks it whole before
 * anything is allotted or written, and names each problem by where it is in the file.
 */
import { z } from "zod";
import { plannedFileSchema, plannedGroupSchema, plannedServiceSchema, plannedUserSchema } from "./items.js";
import { labelKey, nodeName, word } from "./messages.js";

/**
 * A unit's name: what conditions, `plan show` and `node show` call it. Up to 67 characters, so `pin-` and any node
 * name fit (the units `mesh declare` keeps).
 */
const unitName = z.string().regex(/^[a-z0-9](?:[a-z0-9-]{0,65}[a-z0-9])?$/, {
  error: "expected a unit name: 1–67 of a-z, 0-9 and '-', not starting or ending with '-'",
});

/** Which nodes a unit may go to; every condition given must hold (an empty selector matches every node). */
export const selectorSchema = z.strictObject({
  /** Each label equal to the value, or one of the values when a list is given. */
  labels: z
    .record(labelKey, z.union([z.string().max(1_024), z.array(z.string().max(1_024)).min(1)]))
    .optional(),
  /** Every driver named is advertised by the node. */
  drivers: z.array(word).min(1).optional(),
  /** At least this many CPUs. */
  cpu: z.int().min(1).optional(),
  /** At least this much memory. */
  memory_mb: z.int().min(1).optional(),
  /** Only these nodes. */
  nodes: z.array(nodeName).min(1).optional(),
});

/** What one placement of a unit takes of its node's capacity. */
export const resourcesSchema = z.strictObject({
  cpu: z.number().positive().optional(),
  memory_mb: z.int().min(1).optional(),
});

/**
 * What a unit holds, and all that `mesh declare -f FILE` takes: the items by kind. A new kind is a new field here
 * and in the wire's declaration; allot, compose and send carry it without knowing it.
 */
export const unitContentsShape = {
  files: z.array(plannedFileSchema).default([]),
  users: z.array(plannedUserSchema).default([]),
  groups: z.array(plannedGroupSchema).default([]),
  services: z.array(plannedServiceSchema).default([]),
};
export const unitContentsSchema = z.strictObject(unitContentsShape);

export const durationText = z.string().regex(/^\d+(ms|s|m|h|d)$/, {
  error: 'expected a duration such as "90s", "10m" or "2h"',
});

export const unitSchema = z
  .strictObject({
    name: unitName,
    where: selectorSchema.optional(),
    count: z.int().min(1).max(100_000).optional(),
    resources: resourcesSchema.optional(),
    /** How long a placed node may be out of touch before the placement moves (absent: never). */
    move_after: durationText.optional(),
    ...unitContentsShape,
  })
  .superRefine((unit, context) => {
    if (unit.move_after !== undefined && unit.count === undefined) {
      context.addIssue({
        code: "custom",
        path: ["move_after"],
        message: "applies only to a unit with a count: a unit on every match has nowhere to move",
      });
    }
    if (unit.resources !== undefined && unit.count === undefined) {
      context.addIssue({
        code: "custom",
        path: ["resources"],
        message: "applies only to a unit with a count: a unit on every match is placed whatever is free",
      });
    }
  });

/**
 * The overlay network: every node it selects (and whose agent can apply it) gets a stable address from `cidr` and,
 * as peers, every other such node's overlay key, address and endpoint (its `overlay-endpoint` label, `IP:PORT`).
 */
export const overlaySchema = z.strictObject({
  cidr: z.string().regex(/^(\d{1,3}\.){3}\d{1,3}\/(1[6-9]|2[0-9]|30)$/, {
    error: "expected an IPv4 network from /16 to /30, e.g. 10.99.0.0/16",
  }),
  port: z.int().min(1).max(65_535).default(51_820),
  interface: z
    .string()
    .regex(/^[a-z][a-z0-9]{0,14}$/, { error: "expected an interface name: up to 15 of a-z, 0-9" })
    .default("mesh0"),
  where: selectorSchema.optional(),
});

export const planSchema = z
  .strictObject({ units: z.array(unitSchema), overlay: overlaySchema.optional() })
  .superRefine((plan, context) => {
    const seen = new Set<string>();
    plan.units.forEach((unit, index) => {
      if (seen.has(unit.name)) {
        context.addIssue({
          code: "custom",
          path: ["units", index, "name"],
          message: "repeats an earlier unit's name",
        });
      }
      seen.add(unit.name);
    });
  });

export type Plan = z.infer<typeof planSchema>;
export type PlanUnit = Plan["units"][number];
export type Selector = z.infer<typeof selectorSchema>;
export type Resources = z.infer<typeof resourcesSchema>;
export type UnitContents = z.infer<typeof unitContentsSchema>;
export type OverlayPlan = z.infer<typeof overlaySchema>;
