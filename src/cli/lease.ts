/** `mesh lease show`: who acts, under which epoch, for how much longer, and the floor below which no epoch goes. */
import type { Command } from "commander";
import { epochOf } from "../lease/lease.js";
import type { GlobalFlags } from "./context.js";
import { openRecordedControlSide, optionsFrom, withStore } from "./context.js";
import { stdoutOutput } from "../program/output.js";

export function registerLeaseCommands(program: Command): void {
  const lease = program.command("lease").description("the lease that decides which controller acts");
  lease
    .command("show")
    .description(
      "the holder, its epoch, when it was taken and renewed, seconds until expiry, the epoch floor",
    )
    .option(
      "--json",
      'print {"holder":{"id","host","pid"},"epoch","taken_at","renewed_at","expires_in_s","floor","no_epoch":[…]}',
    )
    .action(async (_flags: unknown, command: Command) => {
      const globals = command.optsWithGlobals<GlobalFlags>();
      const options = optionsFrom(globals);
      const side = await openRecordedControlSide(options);
      // A controller without an epoch refreshes its row every renewal period; older rows are of stopped ones.
      const freshSince = new Date(Date.now() - Math.max(options.lease.ttlMs, 3 * options.lease.renewEveryMs));
      const [current, floor, noEpoch] = await withStore(options, (store) =>
        Promise.all([
          side.lease(options.lease.ttlMs, store).then((backend) => backend.read()),
          store.epochs.floor(),
          store.noEpoch.current(freshSince),
        ]),
      )
        .catch((error: unknown) => {
          throw options.deadline.explain(error);
        })
        .finally(() => side.close());
      const renewedAt = current?.holder.renewed_at ?? current?.holder.taken_at ?? null;
      const shown = {
        holder:
          current === undefined
            ? null
            : { id: current.holder.id, host: current.holder.host, pid: current.holder.pid },
        epoch: current === undefined ? null : epochOf(current),
        taken_at: current?.holder.taken_at ?? null,
        renewed_at: renewedAt,
        expires_in_s:
          renewedAt === null
            ? null
            : Math.max(0, Math.round((Date.parse(renewedAt) + options.lease.ttlMs - Date.now()) / 1000)),
        floor,
        // Urgent: controllers acting without any epoch because the lease could not be written.
        no_epoch: noEpoch.map(({ controller, host, pid, reason, since }) => ({
          id: controller,
          host,
          pid,
          since,
          reason,
        })),
      };
      const out = stdoutOutput(globals.json === true);
      if (out.json) {
        out.document(shown);
        return;
      }
      for (const controller of shown.no_epoch) {
        out.line(
          `URGENT: controller ${controller.id} (${controller.host}, pid ${controller.pid}) acts WITHOUT an epoch ` +
            `since ${controller.since}: the lease cannot be written (${controller.reason})`,
        );
      }
      if (shown.holder === null) {
        out.line(`nobody holds the lease (epoch floor ${floor})`);
        return;
      }
      out.line(`holder      ${shown.holder.id} (${shown.holder.host}, pid ${shown.holder.pid})`);
      out.line(`epoch       ${shown.epoch}`);
      out.line(`taken at    ${shown.taken_at}`);
      out.line(`renewed at  ${shown.renewed_at}`);
      out.line(`expires in  ${shown.expires_in_s}s`);
      out.line(`floor       ${floor}`);
    });
}
