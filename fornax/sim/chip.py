"""A partitioned chip: the fault domain its partition devices share.

Each partition of a :class:`~fornax.sim.layout.Layout` is a
:class:`~fornax.sim.device.Device` of its own (its own memory, timeline and cost
model), so work in one never sees another's memory.  What they share is the chip:
a fault whose scope (the mode's ``faults`` table, or ``uncontained`` for an error the
hardware could not contain) is ``device`` takes every partition down, and only a
reset of the chip brings them back; a fault whose scope is ``partition`` stays where
it hit and the other partitions keep running.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from .faults import DeviceLost, EccUncorrectable, LinkFailure, SimError
from .layout import Layout, Partition


class Member(Protocol):
    """What the chip needs of a partition's device (``fornax.sim.device.Device``)."""

    index: int
    lost: SimError | None
    partition: Partition | None
    chip: Chip[Any] | None


M = TypeVar("M", bound=Member)


class Chip(Generic[M]):
    """The physical chip behind a layout's partition devices."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.devices: list[M] = []
        #: a chip-wide fault that has not been reset yet (every partition is down until then)
        self.pending: SimError | None = None
        self.resets = 0               # chip-wide resets

    def attach(self, devices: list[M]) -> None:
        """Make ``devices`` (one per partition, in order) the chip's partitions."""
        if len(devices) != len(self.layout.partitions):
            raise ValueError(f"{len(devices)} devices for {len(self.layout.partitions)} partitions")
        self.devices = list(devices)
        for dev, part in zip(devices, self.layout.partitions):
            dev.chip, dev.partition = self, part

    def scope(self, fault: SimError) -> str:
        """``partition`` or ``device``: where ``fault`` lands under the layout's mode."""
        return self.layout.mode.scope(fault.kind, fault.contained)

    def spread(self, origin: M, fault: SimError) -> None:
        """``fault`` hit partition ``origin``: if its scope is the device, every partition
        is down (the origin with the fault itself, the others with the same kind of error
        naming the origin) until the chip is reset."""
        if self.scope(fault) != "device":
            return
        self.pending = fault
        label = origin.partition.label if origin.partition is not None else f"device {origin.index}"
        why = "" if fault.contained else " that the hardware could not contain"
        for dev in self.devices:
            if dev is origin:
                dev.lost = fault
                continue
            if dev.lost is not None:
                continue
            text = (f"{fault.kind}{why} in partition {origin.index} ({label}) took partition "
                    f"{dev.index} down with it: the whole chip must be reset")
            kind = type(fault) if isinstance(fault, (EccUncorrectable, LinkFailure, DeviceLost)) \
                else DeviceLost
            dev.lost = kind(text)

    def reset_group(self, dev: M) -> list[M]:
        """The devices a reset of ``dev`` resets: every partition while a chip-wide fault is
        pending (the chip resets as a whole), else ``dev`` alone."""
        return list(self.devices) if self.pending is not None else [dev]

    def reset(self, dev: M) -> list[M]:
        """Reset what a reset of ``dev`` resets (:meth:`reset_group`); the devices reset."""
        group = self.reset_group(dev)
        if self.pending is not None:
            self.pending = None
            self.resets += 1
        return group
