"""The shared driver a vendor subclasses: :class:`DriverBase` assembles the core rules,
contexts, memory, modules and media (decode) sessions, and owns the queues, context synchronisation and the
driver's report.

A vendor supplies its facts (``vendor.toml``: API call names, error codes,
formats and their load rules, arch names) and small hooks: how to decode its
binary container (:meth:`~.module.ModuleLoader.decode_image`), how its queues
put work on the hardware (``queue_class``, a :class:`~.queue.QueueBase`), and
how it describes a device in its own vocabulary
(:meth:`~.core.DriverCore.native_properties`).
"""

from __future__ import annotations

from typing import Any

from ...sim.faults import SimError
from .media import MediaRules
from .memory import DriverMemory
from .module import ModuleLoader
from .protocol import Context, Queue
from .queue import QueueBase


class DriverBase(DriverMemory, ModuleLoader, MediaRules):
    """Shared driver policy.  Vendors subclass it and set the hooks."""

    queue_class: type[QueueBase]

    # -- queues ---------------------------------------------------------------
    def create_queue(self, ctx: Context | None, priority: int = 0) -> QueueBase:
        ctx = self.resolve_context(ctx, "create_queue")
        self.check(ctx, "create_queue")
        queue = self.queue_class(self, ctx)
        queue.hwq.priority = int(priority)
        return queue

    def destroy_queue(self, queue: Queue) -> None:
        """Release a queue (``[driver.calls] destroy_queue``).  Work already submitted still
        runs: the hardware queue retires once it has drained.  Later use is an error."""
        if not isinstance(queue, QueueBase) or queue.destroyed:
            raise self.fail("invalid_handle", "the queue was already destroyed or is not a queue",
                            call="destroy_queue")
        queue.destroyed = True
        queue._pending_waits = []          # waits with no command after them order nothing
        if queue in queue.ctx.queues:
            queue.ctx.queues.remove(queue)
        queue.release()
        queue.device.timeline.remove_queue(queue.hwq)

    def handles(self) -> dict[str, int]:
        """Live handles: contexts, queues, modules and memory mappings (device, pinned,
        managed and the queues' own) — all zero once everything is released."""
        return {"contexts": len(self.contexts),
                "queues": sum(len(c.queues) for c in self.contexts),
                "modules": len(self.modules),
                "mappings": sum(len(c.space.mappings()) for c in self.contexts)}

    def synchronize(self, ctx: Context | None) -> None:
        ctx = self.resolve_context(ctx, "synchronize")
        self.check(ctx, "synchronize")
        try:
            ctx.device.timeline.drain()
        except SimError as exc:
            raise self.fault(ctx, exc, "synchronize") from None
        # a context synchronise reports a fault of any of its queues' work (cuCtxSynchronize)
        failure = next((q.hwq.failure for q in ctx.queues if q.hwq.failure is not None), None)
        if failure is not None:
            raise self.fault(ctx, failure, "synchronize")

    def report(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "api": self.facts["driver"]["api"],
            "devices": [self.target(i) for i in range(len(self.devices))],
            "loadable_formats": list(self.formats),
            **self.counts,
            "ecc_corrected": sum(d.ecc_corrected for d in self.devices),
            "devices_lost": sorted(self.lost),
            "races": [r.to_dict() for d in self.devices for r in d.timeline.races],
            "kernels_executed": self.kernel_log.total,
            "module_load_s": self.module_load_s,
            "managed_migration_s": self.managed_migration_s,
        }
