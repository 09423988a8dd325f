"""The recorder: watches a launch and keeps the tape a replay runs (for :mod:`.replay`).

A register that depends only on the grid, constants, scalars and loop counters is
*static*: every launch over the same grid with the same scalars computes it the same.
The tape keeps just the instructions that read memory or depend on what was read,
each with the static registers it reads; a load or store with static offsets keeps
its layout (:class:`~.lanes.Lanes`) instead of its address registers.  A launch whose
masks, loop bounds or store_reduce targets depend on loaded data is not recordable
(what it counts depends on the data), and neither is one whose tape would outgrow its
byte limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from . import isa
from .counters import Counters
from .interpreter import (Args, Grid, Interpreter, LoadOperands, PointerDtypes, StoreOperands)
from .lanes import Lanes, frozen
from .memory import AddressSpace
from .registers import Registers, UnmadePrefix
from .tiles import LOW_PRECISION, Index, Tile, dtype_name

#: tape marks: a binary / unary whose operands need no alignment and no compute-dtype widening;
#: a load or store whose offsets were loaded (replayed the general way, its range counted live)
PLAIN_BINARY: Final = "plain binary"
PLAIN_UNARY: Final = "plain unary"
DYNAMIC: Final = "dynamic"

#: how a tape entry replays: a mark above, a static layout, or None (the general path)
How = Lanes | str | None

#: instructions whose result depends on nothing but the grid, constants and scalars
_SOURCES = frozenset({isa.ProgramId, isa.Arange, isa.Const, isa.ScalarArg})
#: instructions whose result is static when every register they read is
_PURE = frozenset({isa.Unary, isa.Binary, isa.Where, isa.Convert, isa.Reshape, isa.Broadcast,
                   isa.Reduce, isa.Dot})
_MEMORY = frozenset({isa.Load, isa.Store, isa.StoreReduce})


@dataclass
class TapeEntry:
    """One recorded instruction: the static registers it reads (bound before it runs) and
    how it replays."""

    ins: object
    statics: dict[str, Tile]
    how: How


def _plain(ins: object, regs: dict[str, Tile]) -> How:
    if isinstance(ins, isa.Binary):
        a, b = regs[ins.a], regs[ins.b]
        if (a.ndim == b.ndim and a.dtype == b.dtype and ins.fn not in isa.BITWISE
                and dtype_name(a) not in LOW_PRECISION):
            return PLAIN_BINARY
    elif isinstance(ins, isa.Unary) and dtype_name(regs[ins.src]) not in LOW_PRECISION:
        return PLAIN_UNARY
    return None


def _root(arr: Tile) -> Tile:
    """The array whose memory ``arr`` views (itself if it owns its memory)."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


class Recorder:
    """Watches a launch: which registers are static, and the tape of the rest.  Gives up
    (``ok`` False) when something depends on loaded data or the tape would hold more than
    ``limit`` bytes (then it also lets go of what it held)."""

    def __init__(self, limit: int):
        self.ok = True              # False once the launch cannot be (or is not) recorded
        self.too_large = False      # gave up only because the tape grew past ``limit``
        self.limit = limit
        self.nbytes = 0             # what the tape holds: static arrays, lane layouts, entries
        self._held: set[int] = set()    # ids of the arrays counted in nbytes (all kept alive)
        self.static: set[str] = set()
        self.tape: list[TapeEntry] = []
        self.chunks: list[tuple[int, list[TapeEntry]]] = []
        self.dynamic = False        # whether some load or store has data-dependent addresses
        self.dynamic_now = False    # whether the instruction running now is one
        #: (written?, pointer) -> the byte range the static accesses touch, relative to the pointer
        self.static_ranges: dict[tuple[bool, str], tuple[int, int]] = {}
        #: static registers the running load or store reads that are not made yet (see
        #: :mod:`.registers`): bound only if its layout is not kept (a layout replaces offsets)
        self.unmade: list[str] = []

    def start_chunk(self) -> None:
        self.static, self.tape = set(), []

    def end_chunk(self, n: int) -> None:
        if self.ok:
            self.chunks.append((n, self.tape))

    def _hold(self, nbytes: int) -> None:
        self.nbytes += nbytes
        if self.nbytes > self.limit:
            self.too_large = self.ok
            self.give_up()

    def give_up(self) -> None:
        self.ok = False
        self.tape, self.chunks, self._held = [], [], set()

    def before(self, ins: object, regs: dict[str, Tile]) -> bool:
        """Called before ``ins`` runs: True if its result is static (it needs no tape entry)."""
        t = type(ins)
        if t in _SOURCES or t is isa.Barrier:
            return True
        reads = [r for r in (getattr(ins, n) for n in isa.OPERANDS[t]) if r is not None]
        static = self.static
        if t in _PURE and all(r in static for r in reads):
            return True
        if isinstance(ins, (isa.Load, isa.Store, isa.StoreReduce)):
            if ins.offsets not in static:
                if isinstance(ins, isa.StoreReduce):  # how many distinct targets it has is counted: data
                    self.give_up()
                    return False
                self.dynamic = self.dynamic_now = True
            if ins.mask is not None and ins.mask not in static:
                self.give_up()              # a data-dependent mask changes what is counted
                return False
        unmade = regs.unmade if t in _MEMORY and isinstance(regs, Registers) else {}
        statics = {r: regs[r] for r in reads if r in static and r not in unmade}
        self.unmade = [r for r in reads if r in static and r in unmade]
        self.tape.append(TapeEntry(ins, statics, DYNAMIC if self.dynamic_now else _plain(ins, regs)))
        if t not in _MEMORY:                # a load or store is accounted once its layout is known
            self._hold_statics(statics)
        return False

    def touched(self, write: bool, ptr: str, lo: int, hi: int) -> None:
        """A static access touched [lo, hi) (relative to its pointer)."""
        key = (write, ptr)
        old = self.static_ranges.get(key)
        self.static_ranges[key] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))

    def _hold_statics(self, statics: dict[str, Tile], extra: int = 0) -> None:
        held = 256 + extra                  # the entry itself: list, dict, later a closure
        for arr in statics.values():
            root = _root(arr)
            if id(root) not in self._held:
                self._held.add(id(root))
                held += root.nbytes
        self._hold(held)

    def after(self, ins: object, static: bool, lanes: Lanes | None, regs: dict[str, Tile]) -> None:
        dst = getattr(ins, "dst", None)
        if dst is not None:
            if static:
                self.static.add(dst)
            else:
                self.static.discard(dst)
        if isinstance(ins, (isa.Load, isa.Store, isa.StoreReduce)):
            entry = self.tape[-1]
            statics = entry.statics
            if self.dynamic_now:            # its layout was data: it is replayed the general way
                lanes, self.dynamic_now = None, False
            dropped: set[str] = set()
            if lanes is not None:
                # the replayed access goes by its layout: its address registers need not be kept
                entry.how = lanes
                for r in (ins.offsets, ins.mask):
                    if r is not None and r != getattr(ins, "value", None):
                        statics.pop(r, None)
                        dropped.add(r)
            for r in self.unmade:
                if r not in dropped:
                    statics[r] = regs[r]
            self.unmade = []
            self._hold_statics(statics, 0 if lanes is None else lanes.nbytes())


def _run_lanes(ptr: str, first: int, shape: tuple[int, ...], count: int, dtype: np.dtype[Any],
               vshape: tuple[int, ...] | None) -> Lanes:
    """The layout :meth:`Lanes.of` finds for the first ``count`` lanes of ``shape`` active
    (all of them, or a prefix) at the ascending run of element offsets from ``first``."""
    isz = dtype.itemsize
    mask = None if count == math.prod(shape) else frozen(UnmadePrefix(shape, count).make())
    return Lanes(ptr, dtype, shape, mask, first * isz, (first + count - 1) * isz, first, count,
                 None, None, vshape)


class RecordingInterpreter(Interpreter):
    """The interpreter, with a :class:`Recorder` watching every instruction it runs."""

    def __init__(self, program: isa.Program, space: AddressSpace, args: Args, counters: Counters,
                 ptr_dtype: PointerDtypes, recorder: Recorder):
        super().__init__(program, space, args, counters, ptr_dtype)
        self.rec = recorder
        self.lanes: Lanes | None = None     # the layout the last load/store saw

    def run_chunk(self, ids: Index, grid: Grid) -> None:
        self.rec.start_chunk()
        super().run_chunk(ids, grid)
        self.rec.end_chunk(len(ids))

    def run(self, body: Sequence[object], ids: Index, grid: Grid) -> None:
        c, n, rec = self.c, len(ids), self.rec
        for ins in body:
            c.instructions += 1
            if isinstance(ins, isa.Loop):
                self.loop(ins, ids, grid)
                continue
            if not rec.ok:
                self.step(ins, ids, n, grid)
                continue
            static = rec.before(ins, self.regs)
            self.step(ins, ids, n, grid)
            if rec.ok:
                rec.after(ins, static, self.lanes, self.regs)
            self.lanes = None

    def loop_bound(self, ins: isa.Loop) -> int:
        stop = super().loop_bound(ins)
        if isinstance(ins.stop, str) and self.rec.ok and ins.stop not in self.rec.static:
            self.rec.give_up()              # a bound read from memory: not replayable
        return stop

    def bind_counter(self, var: str, k: int) -> None:
        super().bind_counter(var, k)
        self.rec.static.add(var)

    def _recording(self) -> bool:
        """Whether the access running now is recorded (a static one, while recording)."""
        return self.rec.ok and not self.rec.dynamic_now

    def touch(self, write: bool, ptr: str, lo: int, hi: int) -> None:
        super().touch(write, ptr, lo, hi)
        if self._recording():
            base = int(self.args[ptr])
            self.rec.touched(write, ptr, lo - base, hi - base)

    def loaded_run(self, ins: isa.Load, first: int, shape: tuple[int, ...], count: int,
                   dtype: np.dtype[Any]) -> None:
        if self._recording():       # what Lanes.of finds for these offsets: one run
            self.lanes = _run_lanes(ins.ptr, first, shape, count, dtype, None)

    def stored_run(self, ins: isa.Store, first: int, shape: tuple[int, ...], count: int,
                   vshape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        if self._recording():
            self.lanes = _run_lanes(ins.ptr, first, shape, count, dtype, vshape)

    def load_operands(self, ins: isa.Load) -> LoadOperands:
        operands = super().load_operands(ins)
        if self._recording():
            offsets, mask, active, dtype = operands
            self.lanes = Lanes.of(ins.ptr, active, offsets.shape, mask, dtype)
        return operands

    def store_operands(self, ins: isa.Store | isa.StoreReduce) -> StoreOperands:
        operands = super().store_operands(ins)
        if self._recording() and isinstance(ins, isa.Store):
            offsets, _, dtype, shape, mask, vshape = operands
            self.lanes = Lanes.of(ins.ptr, offsets, shape, mask, dtype, vshape, store=True)
        return operands
