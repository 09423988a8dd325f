"""Executing a kernel launch: the entry point the device calls.

:func:`execute` runs a program over a grid in an address space.  With no
:class:`~.replay.ReplayCache` it is the plain interpreter (:mod:`.interpreter`,
the tile ISA's reference semantics); with one (a :class:`~.device.Device` owns
one) a launch may be recorded and later ones replayed (:mod:`.replay`), which
agree with the interpreter bit for bit in memory, counters and faults.
"""

from __future__ import annotations

from . import isa
from .counters import Counters
from .interpreter import Args, Grid, interpret
from .memory import AddressSpace
from .replay import ReplayCache

__all__ = ["Counters", "execute"]


def execute(program: isa.Program, grid: Grid, args: Args, space: AddressSpace,
            replays: ReplayCache | None = None) -> Counters:
    """Run ``program`` over ``grid`` in ``space`` with ``args`` (parameter name -> value);
    ``replays``: the caller's recordings (None: interpret every launch plainly).

    Arithmetic is IEEE without traps, as on a device: ``inf - inf``, ``0 * nan`` in a matrix
    product, a float overflow give NaN or inf in the tile and raise no host warning."""
    if replays is None:
        return interpret(program, grid, args, space)
    return replays.execute(program, grid, args, space)
