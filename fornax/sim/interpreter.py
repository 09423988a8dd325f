"""The interpreter: the tile ISA's semantics, by definition.

It runs every program instance of a grid at once with numpy.  Registers hold
arrays of shape ``(instances, *tile)`` or ``(1, *tile)`` for values that are the
same in every instance; numpy broadcasting does the rest (:mod:`.tiles`).  Every
load and store goes through the context's address space, so an access outside a
live mapping is a page fault with its address.  An access whose active elements
all lie in one mapping (with an aligned pointer) indexes that mapping's elements
directly; anything else goes by byte address through gather / scatter, which
fault, or split the access between mappings, exactly.  Either way the same
elements are read or written in the same order.

Large grids run in chunks of instances so that memory stays bounded; there is
never a Python loop over single instances.

How an instruction is carried out never changes what it reads, writes or counts
(:attr:`Interpreter.shortcuts`): element indices that form one ascending run are read or
written as a slice, a load whose offsets are broadcast reads each distinct element once,
and an index register far larger than what it is computed from (a reduction row's long
:class:`~.isa.Arange`, a pointwise kernel's ``pid * block + lane``) is held unmade
(:mod:`.registers`) until an instruction needs its elements: a load or store at one run
of elements, or a bounds check true in every lane or in a prefix of the lanes, needs
only its shape and range.
While a packet runs, committed memory cannot change, so such a load reads its run in
place (a store copies what it keeps of such a register).

Arithmetic is IEEE without traps, as on a device: ``inf - inf``, ``0 * nan`` in a
matrix product, a float overflow give NaN or inf in the tile and raise no host
warning.  Numerics never depend on the path taken: a matrix product is one numpy
matmul of the same tiles, with the same strides, in the same order.

This module is the reference.  Record and replay (:mod:`.replay`) is an
optimisation that must agree with it bit for bit: memory, counters and faults.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from . import isa, sparsity
from .arithmetic import cast, power
from .counters import Counters
from .faults import ExecutionError
from .memory import AddressSpace, ElementIndex, Mapping, capturing
from .registers import (LAZY_RANGE, Registers, UnmadePrefix, UnmadeRange, UnmadeSum, all_true,
                        arange, distinct_lanes, run_start, shaped)
from .tiles import Index, Tile, align, compute_dtype, dtype_name, operand

#: elements of registers a chunk of instances may hold (the largest tile times the instances)
CHUNK_ELEMENTS = 1 << 22

#: the grid of a launch: program instances along x, y and z
Grid = tuple[int, int, int]
#: a launch's arguments: parameter name -> pointer (a byte address) or scalar value
Args = dict[str, Any]
#: pointer parameter name -> the dtype of the elements it points to
PointerDtypes = dict[str, np.dtype[Any]]


def _round_tf32(x: Tile) -> Tile:
    """float32 rounded to TF32 (10 mantissa bits; nearest, ties away from zero), kept in float32."""
    x = np.asarray(x, np.float32)
    bits = (x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(np.isnan(x), x, bits.view(np.float32))


def _erf(x: Tile) -> Tile:
    """erf in double precision, rounded to ``x``'s dtype.  A float32 tile takes PyTorch's
    vectorised double erf, several times faster than SciPy's on the host and the same bits
    once rounded to float32 (SciPy's float32 erf is its double erf rounded); other dtypes
    take SciPy's."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        import torch
        wide = torch.from_numpy(x.astype(np.float64))
        rounded: Tile = torch.special.erf(wide).numpy().astype(np.float32)
        return rounded
    from scipy.special import erf
    result: Tile = erf(x)
    return result


def _relu(x: Tile) -> Tile:
    return np.maximum(x, np.zeros((), x.dtype))


#: the unary functions, on a tile in its compute dtype
UNARY: dict[str, Callable[[Tile], Tile]] = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt,
    "abs": np.abs, "not": np.logical_not,
    "relu": _relu,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "recip": lambda x: 1 / x,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "sin": np.sin, "cos": np.cos,
    "erf": _erf, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "sign": np.sign, "isnan": np.isnan,
    "tf32": _round_tf32,
}
#: the binary functions, on two aligned tiles in their compute dtype
BINARY: dict[str, Callable[[Tile, Tile], Tile]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "max": np.maximum, "min": np.minimum, "pow": power,
    "floordiv": np.floor_divide,
    "mod": np.mod, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or,
    "bitand": np.bitwise_and, "bitor": np.bitwise_or, "xor": np.bitwise_xor,
    "shl": np.left_shift, "shr": np.right_shift, "atan2": np.arctan2,
}
#: the reductions along one tile axis (keeping it, with length 1)
REDUCE: dict[str, Callable[..., Tile]] = {
    "sum": np.sum, "max": np.max, "min": np.min, "argmax": np.argmax, "argmin": np.argmin}
#: comparisons of values in [lo, hi] with c: the result when every lane has the same one, else None
_BOUNDED: dict[str, Callable[[int, int, int], bool | None]] = {
    "lt": lambda lo, hi, c: True if hi < c else False if lo >= c else None,
    "le": lambda lo, hi, c: True if hi <= c else False if lo > c else None,
    "gt": lambda lo, hi, c: True if lo > c else False if hi <= c else None,
    "ge": lambda lo, hi, c: True if lo >= c else False if hi < c else None,
}
#: unsigned integers as wide as an element (its bits, to compare values exactly)
_BITS: dict[int, type[np.unsignedinteger[Any]]] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
#: how store_reduce combines contributions to one element
_COMBINE: dict[str, np.ufunc] = {"sum": np.add, "max": np.maximum, "min": np.minimum}

#: a load's operands: offsets and mask (aligned and broadcast together; mask None when every
#: lane is active), the active lanes' element offsets (in lane order) and the element dtype
LoadOperands = tuple[Index, npt.NDArray[np.bool_] | None, Index, np.dtype[Any]]
#: a store's operands: the active lanes' element offsets and values (flat, in lane order) and
#: the element dtype; the lane shape, the mask (None when every lane is active) and the value
#: register's shape as the store aligned it, before broadcasting
StoreOperands = tuple[Index, Tile, np.dtype[Any], tuple[int, ...], npt.NDArray[np.bool_] | None,
                      tuple[int, ...]]


def pointer_dtypes(program: isa.Program) -> PointerDtypes:
    """The element dtype of each pointer parameter of ``program``."""
    return {p.name: isa.np_dtype(p.dtype) for p in program.params if p.kind == "ptr"}


def chunk_instances(program: isa.Program) -> int:
    """How many program instances of ``program`` one chunk runs (at least one)."""
    return max(1, CHUNK_ELEMENTS // isa.max_tile_elements(program))


def check_arguments(program: isa.Program, names: Sequence[str], args: Args) -> None:
    """Raise :class:`ExecutionError` naming every parameter of ``names`` that ``args`` lacks."""
    missing = [name for name in names if name not in args]
    if missing:
        raise ExecutionError(f"kernel {program.name!r}: missing argument(s) {', '.join(missing)}")



# -- the value of one instruction, shared with the replay (fornax.sim.replay) ---------------------
def unary_value(fn: str, x: Tile) -> Tile:
    """A unary in ``x``'s compute dtype, back in ``x``'s dtype (a bool result stays bool)."""
    y = UNARY[fn](compute_dtype(x))
    return y if y.dtype == np.bool_ else cast(y, x.dtype)


def binary_value(fn: str, a: Tile, b: Tile) -> Tile:
    """A binary of two aligned tiles of one dtype, computed as :func:`unary_value` is; raises
    ValueError when their shapes do not broadcast."""
    y = BINARY[fn](compute_dtype(a), compute_dtype(b))
    return y if y.dtype == np.bool_ else cast(y, a.dtype)


def where_value(cond: Tile, a: Tile, b: Tile) -> Tile:
    """``a`` where ``cond`` holds, else ``b``, the three aligned."""
    a, b = align(a, b)
    cond, a = align(cond, a)
    cond, b = align(cond, b)
    return np.where(cond.astype(bool), a, b)


def reduce_value(fn: str, x: Tile, axis: int) -> Tile:
    """A reduction of ``x`` (instances first) along tile axis ``axis`` (in range), kept as a
    length-1 axis: in the compute dtype, back in ``x``'s dtype (int64 for an arg-reduction)."""
    y = REDUCE[fn](compute_dtype(x), axis=axis + 1 if axis >= 0 else axis, keepdims=True)
    return cast(y, np.dtype(np.int64) if fn in isa.ARG_REDUCE else x.dtype)


class Interpreter:
    """Runs one launch of a program: its registers, its counters, its pending reductions.

    ``counting`` False runs instructions without counting them (a replay takes its counts
    from its recording)."""

    #: False runs every instruction the plain way: each register made when its instruction
    #: runs, each access by index arrays, nothing read in place (what the shortcuts are
    #: checked against; they change how, never what, an instruction reads and writes)
    shortcuts = True

    def __init__(self, program: isa.Program, space: AddressSpace, args: Args, counters: Counters,
                 ptr_dtype: PointerDtypes, counting: bool = True):
        self.program = program
        self.space = space
        self.args = args
        self.c = counters
        self.regs: dict[str, Tile] = Registers() if self.shortcuts else {}
        #: loaded registers that view committed memory (a launch's own, while a packet runs)
        self.borrowed: list[Tile] = []
        self.borrowing = False
        #: store_reduce contributions per (pointer, function): (byte addresses, values)
        self.pending: dict[tuple[str, str], list[tuple[Index, Tile]]] = {}
        self.ptr_dtype = ptr_dtype
        self.tf32: set[str] = set()     # registers holding TF32-rounded tiles (the TF32 matrix path)
        self.counting = counting

    def fail(self, ins: object, msg: str) -> NoReturn:
        raise ExecutionError(f"kernel {self.program.name!r}, {getattr(ins, 'op', '?')}: {msg}")

    # -- the grid, chunks and instruction sequences -----------------------------------------
    def launch(self, grid: Grid, chunk: int) -> None:
        """Run the whole grid, ``chunk`` instances at a time, then combine the reductions."""
        gx, gy, gz = grid
        total = gx * gy * gz
        # a load may view committed memory only while a packet runs (then memory changes
        # only when the packet's log commits, after the launch)
        self.borrowing = self.shortcuts and capturing()
        try:
            for start in range(0, total, chunk):
                self.run_chunk(np.arange(start, min(total, start + chunk), dtype=np.int64), grid)
            self.flush_reductions()
        finally:
            self.borrowing, self.borrowed = False, []

    def run_chunk(self, ids: Index, grid: Grid) -> None:
        """Run the program body for the instances ``ids`` (fresh registers)."""
        self.regs = Registers() if self.shortcuts else {}
        self.borrowed = []
        self.run(self.program.body, ids, grid)

    def run(self, body: Sequence[object], ids: Index, grid: Grid) -> None:
        c, n = self.c, len(ids)
        for ins in body:
            c.instructions += 1
            if isinstance(ins, isa.Loop):
                self.loop(ins, ids, grid)
            else:
                self.step(ins, ids, n, grid)

    def loop(self, ins: isa.Loop, ids: Index, grid: Grid) -> None:
        for k in range(ins.start, self.loop_bound(ins), ins.step):
            self.bind_counter(ins.var, k)
            self.run(ins.body, ids, grid)

    def loop_bound(self, ins: isa.Loop) -> int:
        """A loop's stop: a constant, or a register holding one bound for every instance."""
        stop = ins.stop
        if isinstance(stop, str):
            bound = self.regs[stop]
            if bound.size != 1:
                self.fail(ins, f"loop bound {stop} must be uniform across instances")
            return int(bound.reshape(-1)[0])
        return stop

    def bind_counter(self, var: str, k: int) -> None:
        """Set a loop's counter register to ``k`` (the same in every instance)."""
        self.regs[var] = np.array([k], dtype=np.int64)

    # -- one instruction ----------------------------------------------------------------------
    def step(self, ins: object, ids: Index | None, n: int, grid: Grid) -> None:
        """Run one instruction (not a loop); ``n``: instances in this chunk, ``ids`` their
        indices (needed by program_id only)."""
        regs, c = self.regs, self.c
        if isinstance(ins, isa.ProgramId):
            if ids is None:
                self.fail(ins, "program_id needs the chunk's instance ids")
            gx, gy, _ = grid
            coord = (ids % gx, (ids // gx) % gy, ids // (gx * gy))[ins.axis]
            regs[ins.dst] = coord.astype(np.int64)
        elif isinstance(ins, isa.Arange):
            if ins.n >= LAZY_RANGE and isinstance(regs, Registers):
                regs.hold(ins.dst, UnmadeRange(ins.n))
            else:
                regs[ins.dst] = arange(ins.n)
        elif isinstance(ins, isa.Const):
            regs[ins.dst] = np.array([ins.value], dtype=isa.np_dtype(ins.dtype))
        elif isinstance(ins, isa.ScalarArg):
            p = self.program.param(ins.param)
            regs[ins.dst] = np.array([self.args[ins.param]], dtype=isa.np_dtype(p.dtype))
        elif isinstance(ins, isa.Unary):
            x = regs[ins.src]
            with np.errstate(all="ignore"):
                y = unary_value(ins.fn, x)
            if self.counting:
                c.add_flops(c.vector_flops, dtype_name(x), y.size * (n if y.shape[0] == 1 else 1))
            regs[ins.dst] = y
            if ins.fn == "tf32":
                self.tf32.add(ins.dst)
        elif isinstance(ins, isa.Binary):
            if isinstance(regs, Registers) and self._unmade_binary(ins, regs, n):
                return
            a, b = align(regs[ins.a], regs[ins.b])
            if a.dtype != b.dtype:
                self.fail(ins, f"operand dtypes differ ({dtype_name(a)} vs {dtype_name(b)}); "
                               "insert a convert")
            if ins.fn in isa.BITWISE and a.dtype.kind not in "iu":
                self.fail(ins, f"bit operation {ins.fn} needs integer tiles, got {dtype_name(a)}")
            try:
                with np.errstate(all="ignore"):
                    y = binary_value(ins.fn, a, b)
            except ValueError as exc:
                self.fail(ins, f"tile shapes {a.shape[1:]} and {b.shape[1:]} do not broadcast ({exc})")
            if self.counting:
                c.add_flops(c.vector_flops, dtype_name(a), y.size * (n if y.shape[0] == 1 else 1))
            regs[ins.dst] = y
        elif isinstance(ins, isa.Where):
            if isinstance(regs, Registers) and self._prefix_where(ins, regs):
                return
            regs[ins.dst] = where_value(regs[ins.cond], regs[ins.a], regs[ins.b])
        elif isinstance(ins, isa.Convert):
            # to its own dtype, a C-contiguous register is what the copy would be (registers
            # are never written in place, so the two may share it)
            regs[ins.dst] = operand(regs[ins.src], isa.np_dtype(ins.dtype))
        elif isinstance(ins, isa.Reshape):
            x = regs[ins.src]
            if math.prod(x.shape[1:]) != math.prod(ins.shape):
                self.fail(ins, f"cannot reshape tile {x.shape[1:]} to {ins.shape}")
            regs[ins.dst] = x.reshape(x.shape[:1] + tuple(ins.shape))
        elif isinstance(ins, isa.Broadcast):
            x, _ = align(regs[ins.src], np.empty((1,) + tuple(ins.shape), dtype=np.bool_))
            try:
                regs[ins.dst] = np.broadcast_to(x, x.shape[:1] + tuple(ins.shape))
            except ValueError:
                self.fail(ins, f"cannot broadcast tile {x.shape[1:]} to {ins.shape}")
        elif isinstance(ins, isa.Reduce):
            x = regs[ins.src]
            if not -x.ndim + 1 <= ins.axis < x.ndim - 1:
                self.fail(ins, f"axis {ins.axis} out of range for tile {x.shape[1:]}")
            y = reduce_value(ins.fn, x, ins.axis)
            if self.counting:
                c.add_flops(c.vector_flops, dtype_name(x), x.size)
            regs[ins.dst] = y
        elif isinstance(ins, isa.Load):
            regs[ins.dst] = self.load(ins, n)
        elif isinstance(ins, isa.StoreReduce):
            self.store_reduce(ins)
        elif isinstance(ins, isa.Store):
            self.store(ins)
        elif isinstance(ins, isa.Dot):
            self.dot(ins, n)
        elif isinstance(ins, isa.SparseDot):
            self.sparse_dot(ins, n)
        elif isinstance(ins, isa.Barrier):
            pass                       # all instances run in lock step here
        else:  # pragma: no cover - verify() rejects anything else
            self.fail(ins, "unknown instruction")

    def _unmade_binary(self, ins: isa.Binary, regs: Registers, n: int) -> bool:
        """Run a Binary without making index registers, where its result needs none: an
        integer ``add`` much larger than its operands is held unmade; a comparison of an
        unmade register with one value, true (or false) in every lane by its bounds, is
        that value broadcast, and ``run < c`` (``<= c``) of an unmade run true in only some
        lanes is an unmade prefix mask.  False when the instruction must run the general way."""
        fn, unmade = ins.fn, regs.unmade
        if fn == "add":
            if ins.a in unmade or ins.b in unmade:
                return False
            a, b = align(regs[ins.a], regs[ins.b])
            held = UnmadeSum.of(a, b)
            if held is None:
                return False
            regs.hold(ins.dst, held)
            self._count_vector(a, held.shape, n)
            return True
        x = regs.described(ins.a)
        if x is None or fn not in _BOUNDED or ins.b in unmade or x.dtype.kind not in "iu":
            return False
        bound = regs[ins.b]
        if bound.size != 1 or bound.dtype != x.dtype:
            return False
        try:
            dummy, bound = align(shaped(x.shape), bound)
            shape = np.broadcast_shapes(dummy.shape, bound.shape)
        except ValueError:
            return False
        c = int(bound.reshape(-1)[0])
        value = _BOUNDED[fn](x.lo, x.hi, c)
        if value is not None:
            regs[ins.dst] = np.broadcast_to(np.array(value), shape)
        else:
            first = x.run() if fn in ("lt", "le") and shape == x.shape else None
            if first is None:
                return False
            # lanes in order hold first, first + 1, ...: the comparison holds for a prefix
            regs.hold(ins.dst, UnmadePrefix(shape, c - first + (fn == "le")))
        self._count_vector(np.empty(0, x.dtype), shape, n)
        return True

    def _prefix_where(self, ins: isa.Where, regs: Registers) -> bool:
        """``where(prefix, a, b)`` for an unmade prefix mask (made since or not), ``a`` of its
        shape and ``b`` one value of ``a``'s dtype: ``a`` with the lanes past the prefix set to
        ``b``, the same bytes numpy's where gives; ``a`` itself when they hold ``b`` already
        (a masked load's ``other``: registers are never written in place).  False when the
        instruction must run the general way."""
        prefix = regs.described(ins.cond)
        if not isinstance(prefix, UnmadePrefix):
            return False
        a, b = regs[ins.a], regs[ins.b]
        bits = _BITS.get(a.dtype.itemsize)
        if (a.shape != prefix.shape or b.size != 1 or a.dtype != b.dtype or bits is None
                or not a.flags.c_contiguous):
            return False
        fill = b.reshape(-1)[:1]
        tail = a.reshape(-1)[prefix.count:].view(bits)
        value = fill.view(bits)[0]
        if tail.min() == value == tail.max():
            regs[ins.dst] = a
        else:
            out = a.copy()
            out.reshape(-1)[prefix.count:] = fill
            regs[ins.dst] = out
        return True

    def _count_vector(self, x: Tile, shape: tuple[int, ...], n: int) -> None:
        """Count a vector instruction on ``x``'s dtype with a result of ``shape``, as step does."""
        if self.counting:
            self.c.add_flops(self.c.vector_flops, dtype_name(x),
                             math.prod(shape) * (n if shape[0] == 1 else 1))

    # -- memory -------------------------------------------------------------------------------
    def touch(self, write: bool, ptr: str, lo: int, hi: int) -> None:
        """Count the byte range [lo, hi) an access of pointer ``ptr`` touched."""
        c = self.c
        c.touch_range(c.write_ranges if write else c.read_ranges, ptr, lo, hi)

    def _offsets(self, ins: isa.Load | isa.Store | isa.StoreReduce
                 ) -> tuple[Index, npt.NDArray[np.bool_] | None, np.dtype[Any]]:
        """A load's or store's offsets and mask (aligned and broadcast together), and dtype."""
        offsets = self.regs[ins.offsets]
        if offsets.dtype.kind not in "iu":
            self.fail(ins, "offsets must be an integer tile")
        mask = self.regs[ins.mask] if ins.mask is not None else None
        if mask is not None:
            offsets, mask = align(offsets, mask)
            shape = np.broadcast_shapes(offsets.shape, mask.shape)
            offsets = np.broadcast_to(offsets, shape)
            mask = mask.astype(bool, copy=False)
            # every lane active: the same access as no mask (the mask still shaped the offsets)
            mask = None if all_true(mask) else np.broadcast_to(mask, shape)
        return offsets, mask, self.ptr_dtype[ins.ptr]

    def _direct(self, ptr: str, active: Index, dtype: np.dtype[Any]
                ) -> tuple[Mapping, ElementIndex, int, int] | None:
        """The direct form of an access whose ``active`` element offsets all lie in one
        mapping, with the pointer aligned: (mapping, element indices into it, first byte,
        end byte); the indices are a slice when ``active`` is one ascending run (the same
        elements in the same order).  None otherwise: then the byte addresses go through
        gather / scatter, which fault, or split the access between mappings, exactly."""
        base, isz = int(self.args[ptr]), dtype.itemsize
        if base % isz or active.size == 0:
            return None
        first = run_start(active) if self.shortcuts else None
        if first is None:
            low, high = int(active.min()), int(active.max())
        else:
            low, high = first, first + active.size - 1
        lo = base + low * isz
        end = base + high * isz + isz
        m = self.space.holding(lo, end)
        if m is None:
            return None
        delta = (base - m.va) // isz
        if first is not None:
            return m, slice(first + delta, first + delta + active.size), lo, end
        index = active.astype(np.int64, copy=False)
        return m, (index + delta if delta else index), lo, end

    def _borrows(self, values: Tile) -> bool:
        """Whether ``values`` may view committed memory (a register a load read in place)."""
        return any(np.may_share_memory(values, b) for b in self.borrowed)

    def loaded_run(self, ins: isa.Load, first: int, shape: tuple[int, ...], count: int,
                   dtype: np.dtype[Any]) -> None:
        """A load at unmade offsets read its one run of ``count`` elements from offset
        ``first``, in the first ``count`` lanes of ``shape`` (the recorder notes the layout)."""

    def stored_run(self, ins: isa.Store, first: int, shape: tuple[int, ...], count: int,
                   vshape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        """A store at unmade offsets wrote its one run of elements (see :meth:`loaded_run`;
        ``vshape``: its value register's shape as the store aligned it)."""

    def _unmade_run(self, ins: isa.Load | isa.Store
                    ) -> tuple[int, tuple[int, ...], tuple[int, ...], int] | None:
        """For a load or store whose offsets are an unmade register that is one ascending run
        of elements, no lane repeated by broadcasting, and every lane active or the active
        ones a prefix (an unmade bounds mask): (the run's first offset, the lane shape, a
        store's value shape as the store aligns it, else the lane shape, how many lanes are
        active).  None otherwise: then the general path makes the offsets."""
        regs = self.regs
        if not isinstance(regs, Registers):
            return None
        unmade = regs.described(ins.offsets)
        if unmade is None:
            return None
        offsets = shaped(unmade.shape)
        vshape = offsets.shape
        count = unmade.size
        try:
            if ins.mask is not None:        # aligned as _offsets aligns them
                prefix = regs.described(ins.mask)
                if isinstance(prefix, UnmadePrefix):
                    offsets, mask = align(offsets, shaped(prefix.shape))
                    count = prefix.count
                else:
                    offsets, mask = align(offsets, regs[ins.mask])
                    if not all_true(mask.astype(bool, copy=False)):
                        return None
                if np.broadcast_shapes(offsets.shape, mask.shape) != offsets.shape:
                    return None
                if count < unmade.size and mask.shape != offsets.shape:
                    return None
            if isinstance(ins, isa.Store):  # aligned as store_operands aligns them
                offsets, value = align(offsets, regs[ins.value])
                vshape = value.shape
                if np.broadcast_shapes(offsets.shape, vshape) != offsets.shape:
                    return None
                if count < unmade.size and len(vshape) != len(unmade.shape):
                    return None             # (the mask would be aligned to the value anew)
        except ValueError:                  # shapes that do not broadcast: the general path says so
            return None
        first = unmade.run()
        if first is None:
            return None
        return first, offsets.shape, vshape, count

    def _run_mapping(self, ptr: str, first: int, count: int, dtype: np.dtype[Any]
                     ) -> tuple[Mapping, int, int, int] | None:
        """(mapping, index of the run's first element in it, first byte, end byte) of a run of
        ``count`` elements from offset ``first`` of pointer ``ptr``, when one mapping holds it
        all and the pointer is aligned; else None."""
        base, isz = int(self.args[ptr]), dtype.itemsize
        if base % isz:
            return None
        lo = base + first * isz
        end = lo + count * isz
        m = self.space.holding(lo, end)
        if m is None:
            return None
        return m, (lo - m.va) // isz, lo, end

    def _load_run(self, ins: isa.Load, n: int, first: int, shape: tuple[int, ...], count: int
                  ) -> Tile | None:
        """A load of one run of elements (see :meth:`_unmade_run`): a slice of the mapping
        holding it, in the first ``count`` lanes (the rest hold the load's ``other``); with
        every lane active and a packet running it is read in place (committed memory cannot
        change before the launch ends).  None when the run is not in one mapping (the
        general path then faults or splits it exactly)."""
        dtype = self.ptr_dtype[ins.ptr]
        at = self._run_mapping(ins.ptr, first, count, dtype)
        if at is None:
            return None
        m, start, lo, end = at
        self.loaded_run(ins, first, shape, count, dtype)
        run = self.space.elements(m, dtype)[start: start + count]
        values: Tile
        if count < math.prod(shape):
            values = np.full(shape, ins.other, dtype=dtype)
            values.reshape(-1)[:count] = run
        elif self.borrowing:
            values = run.reshape(shape).view()
            values.flags.writeable = False
            self.borrowed.append(values)
        else:
            values = run.reshape(shape).copy()
        if self.counting:
            self.touch(False, ins.ptr, lo, end)
            self.c.bytes_read += count * dtype.itemsize * (n if shape[0] == 1 else 1)
        return values

    def _store_run(self, ins: isa.Store, first: int, shape: tuple[int, ...], vshape: tuple[int, ...],
                   count: int) -> bool:
        """A store of one run of elements from its first ``count`` lanes (see
        :meth:`_unmade_run`) as a slice of the mapping holding it; False when the run is
        not in one mapping (the general path then faults or splits it exactly)."""
        dtype = self.ptr_dtype[ins.ptr]
        at = self._run_mapping(ins.ptr, first, count, dtype)
        if at is None:
            return False
        m, start, lo, end = at
        _, value = align(shaped(shape), self.regs[ins.value])
        values = np.ascontiguousarray(np.broadcast_to(cast(value, dtype), shape)).ravel()
        if count < values.size:
            values = values[:count]
        self.stored_run(ins, first, shape, count, vshape, dtype)
        # registers are never written in place, so a deferred write may keep ``values``
        # (unless they view committed memory, which a later commit may change)
        self.space.store_elements(m, dtype, slice(start, start + count), values,
                                  owned=not self._borrows(values))
        if self.counting:
            self.c.bytes_written += count * dtype.itemsize
            self.touch(True, ins.ptr, lo, end)
        return True

    def _byte_addresses(self, ptr: str, offsets: Index, dtype: np.dtype[Any]) -> Index:
        return int(self.args[ptr]) + offsets.astype(np.int64) * dtype.itemsize

    def load_operands(self, ins: isa.Load) -> LoadOperands:
        """What a load reads: see :data:`LoadOperands`."""
        offsets, mask, dtype = self._offsets(ins)
        return offsets, mask, (offsets if mask is None else offsets[mask]), dtype

    def load(self, ins: isa.Load, n: int) -> Tile:
        run = self._unmade_run(ins)
        if run is not None:
            loaded = self._load_run(ins, n, run[0], run[1], run[3])
            if loaded is not None:
                return loaded
        offsets, mask, active, dtype = self.load_operands(ins)
        isz = dtype.itemsize
        # a broadcast index reads each element once
        lanes = distinct_lanes(active) if self.shortcuts else active
        direct = self._direct(ins.ptr, lanes, dtype)
        if direct is not None:
            m, index, lo, end = direct
            elements = self.space.elements(m, dtype)
            if isinstance(index, slice):
                got = np.broadcast_to(elements[index].reshape(lanes.shape), active.shape).copy()
            elif lanes is active:
                got = elements[index]
            else:
                got = np.broadcast_to(elements[index], active.shape).copy()
            if mask is None:
                values = got
            else:
                values = np.full(offsets.shape, ins.other, dtype=dtype)
                values[mask] = got
            if self.counting:
                self.touch(False, ins.ptr, lo, end)
                self.c.bytes_read += active.size * isz * (n if offsets.shape[0] == 1 else 1)
            return values
        addrs = self._byte_addresses(ins.ptr, offsets, dtype)
        if mask is None:
            values = self.space.gather(addrs.ravel(), dtype).reshape(addrs.shape)
            count = addrs.size
            if self.counting and count:
                self.touch(False, ins.ptr, int(addrs.min()), int(addrs.max()) + isz)
        else:
            values = np.full(addrs.shape, ins.other, dtype=dtype)
            values[mask] = self.space.gather(addrs[mask], dtype)
            hit = addrs[mask]
            count = hit.size
            if self.counting and count:
                self.touch(False, ins.ptr, int(hit.min()), int(hit.max()) + isz)
        if self.counting:
            scale = n if addrs.shape[0] == 1 else 1
            self.c.bytes_read += count * isz * scale
        return values

    def store_operands(self, ins: isa.Store | isa.StoreReduce) -> StoreOperands:
        """What a store-like instruction writes: see :data:`StoreOperands`."""
        offsets, mask, dtype = self._offsets(ins)
        value = self.regs[ins.value]
        offsets, value = align(offsets, value)
        vshape = value.shape
        shape = np.broadcast_shapes(offsets.shape, value.shape)
        if mask is not None:
            mask, _ = align(mask, value)
            shape = np.broadcast_shapes(shape, mask.shape)
            mask = np.broadcast_to(mask, shape)
        offsets = np.broadcast_to(offsets, shape)
        value = np.broadcast_to(cast(value, dtype), shape)
        if mask is not None:
            offsets, value = offsets[mask], value[mask]
        else:
            offsets = offsets.ravel()
        return offsets, np.ascontiguousarray(value).ravel(), dtype, shape, mask, vshape

    def store(self, ins: isa.Store) -> None:
        run = self._unmade_run(ins)
        if run is not None and self._store_run(ins, *run):
            return
        offsets, values, dtype, *_ = self.store_operands(ins)
        isz = dtype.itemsize
        direct = self._direct(ins.ptr, offsets, dtype)
        if direct is not None:
            m, index, lo, end = direct
            # registers are never written in place, so a deferred write may keep ``values``
            # (unless they view committed memory, which a later commit may change)
            self.space.store_elements(m, dtype, index, values, owned=not self._borrows(values))
            if self.counting:
                self.c.bytes_written += offsets.size * isz
                self.touch(True, ins.ptr, lo, end)
            return
        addrs = self._byte_addresses(ins.ptr, offsets, dtype)
        self.space.scatter(addrs, values)
        if self.counting:
            self.c.bytes_written += addrs.size * isz
            if addrs.size:
                self.touch(True, ins.ptr, int(addrs.min()), int(addrs.max()) + isz)

    def store_reduce(self, ins: isa.StoreReduce) -> None:
        """Collect contributions; they are combined once, in order, when the kernel ends."""
        offsets, values, dtype, *_ = self.store_operands(ins)
        addrs = self._byte_addresses(ins.ptr, offsets, dtype)
        self.pending.setdefault((ins.ptr, ins.fn), []).append((addrs, values))

    def flush_reductions(self) -> None:
        """Combine every store_reduce contribution with memory: per element, in instance
        then lane order, then with the element's prior contents."""
        for (ptr, fn), parts in self.pending.items():
            addrs = np.concatenate([a for a, _ in parts])
            values = np.concatenate([v for _, v in parts])
            if addrs.size == 0:
                continue
            dtype = values.dtype
            uniq, inverse = np.unique(addrs, return_inverse=True)
            work = compute_dtype(values)
            acc = self.space.gather(uniq, dtype)
            acc = compute_dtype(acc).copy()
            _COMBINE[fn].at(acc, inverse, work)     # sequential in contribution order: deterministic
            self.space.scatter(uniq, cast(acc, dtype))
            if self.counting:
                self.c.bytes_read += uniq.size * dtype.itemsize
                self.c.bytes_written += uniq.size * dtype.itemsize
                self.c.add_flops(self.c.vector_flops, dtype_name(values), values.size)
                lo, hi = int(uniq[0]), int(uniq[-1]) + dtype.itemsize     # np.unique sorts
                self.touch(False, ptr, lo, hi)
                self.touch(True, ptr, lo, hi)
        self.pending = {}

    # -- the matrix unit ----------------------------------------------------------------------
    def dot(self, ins: isa.Dot, n: int) -> None:
        a, b = self.regs[ins.a], self.regs[ins.b]
        if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1]:
            self.fail(ins, f"needs [M,K] x [K,N] tiles, got {a.shape[1:]} x {b.shape[1:]}")
        path = "tfloat32" if ins.a in self.tf32 and ins.b in self.tf32 else dtype_name(a)
        self._accumulate(ins, a, b, path, n)

    def sparse_dot(self, ins: isa.SparseDot, n: int) -> None:
        """:class:`~fornax.sim.isa.SparseDot`: the product of the expanded 2:4 operand, computed
        as :meth:`dot` computes a dense one; counts the dense-equivalent work."""
        a, e, b = self.regs[ins.a], self.regs[ins.e], self.regs[ins.b]
        if a.ndim != 3 or e.ndim != 3 or b.ndim != 3 or 2 * a.shape[2] != b.shape[1]:
            self.fail(ins, f"needs [M,K/2] values x [K,N] tiles, got {a.shape[1:]} x {b.shape[1:]}")
        k = b.shape[1]
        if e.dtype != np.int32 or e.shape[1:] != (a.shape[1], sparsity.metadata_words(k)):
            self.fail(ins, f"metadata must be int32 [{a.shape[1]},{sparsity.metadata_words(k)}] "
                           f"for K={k}, got {dtype_name(e)} {e.shape[1:]}")
        self._accumulate(ins, sparsity.expand(a, e, k), b, dtype_name(a), n)

    def _accumulate(self, ins: isa.Dot | isa.SparseDot, a: Tile, b: Tile, path: str, n: int) -> None:
        """``dst = acc + a @ b`` in the accumulator dtype; counts ``2 M N K`` per instance on
        the matrix unit's ``path`` (a dtype, or tfloat32)."""
        acc = self.regs[ins.acc]
        acc_dt = isa.np_dtype(ins.acc_dtype)
        prod = np.matmul(operand(a, acc_dt), operand(b, acc_dt))
        if acc.shape[1:] != prod.shape[1:]:
            self.fail(ins, f"accumulator tile {acc.shape[1:]} does not match product {prod.shape[1:]}")
        y = (acc if acc.dtype == acc_dt else acc.astype(acc_dt)) + prod
        self.regs[ins.dst] = y if y.dtype == acc_dt else y.astype(acc_dt)
        if self.counting:
            m, k, nn = a.shape[1], a.shape[2], b.shape[2]
            self.c.add_flops(self.c.matrix_flops, path, 2.0 * m * nn * k * n)


def interpret(program: isa.Program, grid: Grid, args: Args, space: AddressSpace) -> Counters:
    """Run ``program`` over ``grid`` in ``space`` with ``args`` (parameter name -> value):
    the tile ISA's reference semantics.  Returns what the launch did."""
    with np.errstate(all="ignore"):
        check_arguments(program, [p.name for p in program.params], args)
        gx, gy, gz = grid
        counters = Counters(instances=gx * gy * gz)
        runner = Interpreter(program, space, args, counters, pointer_dtypes(program))
        runner.launch((gx, gy, gz), chunk_instances(program))
        return counters
