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

from . import isa
from .arithmetic import cast, power
from .counters import Counters
from .faults import ExecutionError
from .memory import AddressSpace, Mapping
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


class Interpreter:
    """Runs one launch of a program: its registers, its counters, its pending reductions.

    ``counting`` False runs instructions without counting them (a replay takes its counts
    from its recording)."""

    def __init__(self, program: isa.Program, space: AddressSpace, args: Args, counters: Counters,
                 ptr_dtype: PointerDtypes, counting: bool = True):
        self.program = program
        self.space = space
        self.args = args
        self.c = counters
        self.regs: dict[str, Tile] = {}
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
        for start in range(0, total, chunk):
            self.run_chunk(np.arange(start, min(total, start + chunk), dtype=np.int64), grid)
        self.flush_reductions()

    def run_chunk(self, ids: Index, grid: Grid) -> None:
        """Run the program body for the instances ``ids`` (fresh registers)."""
        self.regs = {}
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
            regs[ins.dst] = np.arange(ins.n, dtype=np.int64)[None, :]
        elif isinstance(ins, isa.Const):
            regs[ins.dst] = np.array([ins.value], dtype=isa.np_dtype(ins.dtype))
        elif isinstance(ins, isa.ScalarArg):
            p = self.program.param(ins.param)
            regs[ins.dst] = np.array([self.args[ins.param]], dtype=isa.np_dtype(p.dtype))
        elif isinstance(ins, isa.Unary):
            x = regs[ins.src]
            with np.errstate(all="ignore"):
                y = UNARY[ins.fn](compute_dtype(x))
            if y.dtype != np.bool_:
                y = cast(y, x.dtype)
            if self.counting:
                c.add_flops(c.vector_flops, dtype_name(x), y.size * (n if y.shape[0] == 1 else 1))
            regs[ins.dst] = y
            if ins.fn == "tf32":
                self.tf32.add(ins.dst)
        elif isinstance(ins, isa.Binary):
            a, b = align(regs[ins.a], regs[ins.b])
            if a.dtype != b.dtype:
                self.fail(ins, f"operand dtypes differ ({dtype_name(a)} vs {dtype_name(b)}); "
                               "insert a convert")
            if ins.fn in isa.BITWISE and a.dtype.kind not in "iu":
                self.fail(ins, f"bit operation {ins.fn} needs integer tiles, got {dtype_name(a)}")
            try:
                with np.errstate(all="ignore"):
                    y = BINARY[ins.fn](compute_dtype(a), compute_dtype(b))
            except ValueError as exc:
                self.fail(ins, f"tile shapes {a.shape[1:]} and {b.shape[1:]} do not broadcast ({exc})")
            if y.dtype != np.bool_:
                y = cast(y, a.dtype)
            if self.counting:
                c.add_flops(c.vector_flops, dtype_name(a), y.size * (n if y.shape[0] == 1 else 1))
            regs[ins.dst] = y
        elif isinstance(ins, isa.Where):
            cond = regs[ins.cond]
            a, b = align(regs[ins.a], regs[ins.b])
            cond, a = align(cond, a)
            cond, b = align(cond, b)
            regs[ins.dst] = np.where(cond.astype(bool), a, b)
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
            axis = ins.axis + 1 if ins.axis >= 0 else ins.axis
            y = REDUCE[ins.fn](compute_dtype(x), axis=axis, keepdims=True)
            y = cast(y, np.dtype(np.int64) if ins.fn in isa.ARG_REDUCE else x.dtype)
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
        elif isinstance(ins, isa.Barrier):
            pass                       # all instances run in lock step here
        else:  # pragma: no cover - verify() rejects anything else
            self.fail(ins, "unknown instruction")

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
            mask = None if mask.all() else np.broadcast_to(mask, shape)
        return offsets, mask, self.ptr_dtype[ins.ptr]

    def _direct(self, ptr: str, active: Index, dtype: np.dtype[Any]
                ) -> tuple[Mapping, Index, int, int] | None:
        """The direct form of an access whose ``active`` element offsets all lie in one
        mapping, with the pointer aligned: (mapping, element indices into it, first byte,
        end byte).  None otherwise: then the byte addresses go through gather / scatter,
        which fault, or split the access between mappings, exactly."""
        base, isz = int(self.args[ptr]), dtype.itemsize
        if base % isz or active.size == 0:
            return None
        lo = base + int(active.min()) * isz
        end = base + int(active.max()) * isz + isz
        m = self.space.holding(lo, end)
        if m is None:
            return None
        index = active.astype(np.int64, copy=False)
        delta = (base - m.va) // isz
        return m, (index + delta if delta else index), lo, end

    def _byte_addresses(self, ptr: str, offsets: Index, dtype: np.dtype[Any]) -> Index:
        return int(self.args[ptr]) + offsets.astype(np.int64) * dtype.itemsize

    def load_operands(self, ins: isa.Load) -> LoadOperands:
        """What a load reads: see :data:`LoadOperands`."""
        offsets, mask, dtype = self._offsets(ins)
        return offsets, mask, (offsets if mask is None else offsets[mask]), dtype

    def load(self, ins: isa.Load, n: int) -> Tile:
        offsets, mask, active, dtype = self.load_operands(ins)
        isz = dtype.itemsize
        direct = self._direct(ins.ptr, active, dtype)
        if direct is not None:
            m, index, lo, end = direct
            got = self.space.elements(m, dtype)[index]
            if mask is None:
                values = got
            else:
                values = np.full(offsets.shape, ins.other, dtype=dtype)
                values[mask] = got
            if self.counting:
                self.touch(False, ins.ptr, lo, end)
                self.c.bytes_read += index.size * isz * (n if offsets.shape[0] == 1 else 1)
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
        offsets, values, dtype, *_ = self.store_operands(ins)
        isz = dtype.itemsize
        direct = self._direct(ins.ptr, offsets, dtype)
        if direct is not None:
            m, index, lo, end = direct
            # registers are never written in place, so a deferred write may keep ``values``
            self.space.store_elements(m, dtype, index, values, owned=True)
            if self.counting:
                self.c.bytes_written += index.size * isz
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
        a, b, acc = self.regs[ins.a], self.regs[ins.b], self.regs[ins.acc]
        if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1]:
            self.fail(ins, f"needs [M,K] x [K,N] tiles, got {a.shape[1:]} x {b.shape[1:]}")
        acc_dt = isa.np_dtype(ins.acc_dtype)
        prod = np.matmul(operand(a, acc_dt), operand(b, acc_dt))
        if acc.shape[1:] != prod.shape[1:]:
            self.fail(ins, f"accumulator tile {acc.shape[1:]} does not match product {prod.shape[1:]}")
        y = (acc if acc.dtype == acc_dt else acc.astype(acc_dt)) + prod
        self.regs[ins.dst] = y if y.dtype == acc_dt else y.astype(acc_dt)
        if self.counting:
            m, k, nn = a.shape[1], a.shape[2], b.shape[2]
            path = "tfloat32" if ins.a in self.tf32 and ins.b in self.tf32 else dtype_name(a)
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
