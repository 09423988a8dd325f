"""The executor: runs every program instance of a grid at once with numpy.

Registers hold arrays of shape ``(instances, *tile)`` or ``(1, *tile)`` for
values that are the same in every instance; numpy broadcasting does the rest.
Tile dimensions are aligned to the right (numpy's rule), with the instance
axis always first.  Every load and store goes through the context's address
space, so an access outside a live mapping is a page fault with its address.

Large grids run in chunks of instances so that memory stays bounded; there
is never a Python loop over single instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import isa
from .faults import ExecutionError
from .memory import AddressSpace

_LOW_PRECISION = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
_CHUNK_ELEMENTS = 1 << 22


@dataclass
class Counters:
    """What one kernel execution did, counted for the cost model."""

    instances: int = 0
    matrix_flops: dict[str, float] = field(default_factory=dict)
    vector_flops: dict[str, float] = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    instructions: int = 0
    #: per touched buffer parameter: the absolute byte range [lo, hi) read / written
    read_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    write_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add_flops(self, table: dict, dtype: str, n: float) -> None:
        table[dtype] = table.get(dtype, 0.0) + float(n)

    def touch(self, table: dict, name: str, addrs: np.ndarray, itemsize: int) -> None:
        if addrs.size == 0:
            return
        lo, hi = int(addrs.min()), int(addrs.max()) + itemsize
        if name in table:
            lo, hi = min(lo, table[name][0]), max(hi, table[name][1])
        table[name] = (lo, hi)

    @property
    def footprint_bytes(self) -> int:
        """Distinct bytes the kernel touched (an upper bound: the span of each buffer's accesses)."""
        spans = list(self.read_ranges.values()) + list(self.write_ranges.values())
        spans.sort()
        total, end = 0, None
        for lo, hi in spans:
            if end is None or lo >= end:
                total += hi - lo
                end = hi
            elif hi > end:
                total += hi - end
                end = hi
        return total


def _dtype_name(arr: np.ndarray) -> str:
    for name, dt in isa.DTYPES.items():
        if arr.dtype == dt:
            return name
    return arr.dtype.name


def _align(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Right-align tile dims of two registers (instance axis stays first)."""
    ra, rb = a.ndim, b.ndim
    if ra < rb:
        a = a.reshape(a.shape[:1] + (1,) * (rb - ra) + a.shape[1:])
    elif rb < ra:
        b = b.reshape(b.shape[:1] + (1,) * (ra - rb) + b.shape[1:])
    return a, b


def _compute_dtype(arr: np.ndarray) -> np.ndarray:
    return arr.astype(np.float32) if _dtype_name(arr) in _LOW_PRECISION else arr


_UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt,
    "abs": np.abs, "not": np.logical_not,
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "recip": lambda x: 1 / x,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "sin": np.sin, "cos": np.cos,
    "erf": lambda x: _erf(x), "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "sign": np.sign, "isnan": np.isnan,
    "tf32": lambda x: _round_tf32(x),
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power, "floordiv": np.floor_divide,
    "mod": np.mod, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or,
    "bitand": np.bitwise_and, "bitor": np.bitwise_or, "xor": np.bitwise_xor,
    "shl": np.left_shift, "shr": np.right_shift, "atan2": np.arctan2,
}
_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "argmax": np.argmax, "argmin": np.argmin}


def _round_tf32(x: np.ndarray) -> np.ndarray:
    """float32 rounded to TF32 (10 mantissa bits; nearest, ties away from zero), kept in float32."""
    x = np.asarray(x, np.float32)
    bits = (x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(np.isnan(x), x, bits.view(np.float32))


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf
    return erf(x)


class _Run:
    def __init__(self, program: isa.Program, space: AddressSpace, args: dict, counters: Counters):
        self.program = program
        self.space = space
        self.args = args
        self.c = counters
        self.regs: dict[str, np.ndarray] = {}
        self.pending: dict[tuple[str, str], list] = {}     # store_reduce contributions
        self.ptr_dtype = {p.name: isa.np_dtype(p.dtype) for p in program.params if p.kind == "ptr"}
        self.tf32: set[str] = set()     # registers holding TF32-rounded tiles (the TF32 matrix path)

    def fail(self, ins, msg: str):
        raise ExecutionError(f"kernel {self.program.name!r}, {ins.op}: {msg}")

    def run(self, body, ids: np.ndarray, grid: tuple[int, int, int]) -> None:
        regs, c = self.regs, self.c
        for ins in body:
            c.instructions += 1
            t = type(ins)
            if t is isa.ProgramId:
                gx, gy, _ = grid
                coord = (ids % gx, (ids // gx) % gy, ids // (gx * gy))[ins.axis]
                regs[ins.dst] = coord.astype(np.int64)
            elif t is isa.Arange:
                regs[ins.dst] = np.arange(ins.n, dtype=np.int64)[None, :]
            elif t is isa.Const:
                regs[ins.dst] = np.array([ins.value], dtype=isa.np_dtype(ins.dtype))
            elif t is isa.ScalarArg:
                p = self.program.param(ins.param)
                regs[ins.dst] = np.array([self.args[ins.param]], dtype=isa.np_dtype(p.dtype))
            elif t is isa.Unary:
                x = regs[ins.src]
                with np.errstate(all="ignore"):
                    y = _UNARY[ins.fn](_compute_dtype(x))
                if y.dtype != np.bool_:
                    y = y.astype(x.dtype, copy=False)
                c.add_flops(c.vector_flops, _dtype_name(x), y.size * (len(ids) if y.shape[0] == 1 else 1))
                regs[ins.dst] = y
                if ins.fn == "tf32":
                    self.tf32.add(ins.dst)
            elif t is isa.Binary:
                a, b = _align(regs[ins.a], regs[ins.b])
                if a.dtype != b.dtype:
                    self.fail(ins, f"operand dtypes differ ({_dtype_name(a)} vs {_dtype_name(b)}); "
                                   "insert a convert")
                if ins.fn in isa.BITWISE and a.dtype.kind not in "iu":
                    self.fail(ins, f"bit operation {ins.fn} needs integer tiles, got {_dtype_name(a)}")
                try:
                    with np.errstate(all="ignore"):
                        y = _BINARY[ins.fn](_compute_dtype(a), _compute_dtype(b))
                except ValueError as exc:
                    self.fail(ins, f"tile shapes {a.shape[1:]} and {b.shape[1:]} do not broadcast ({exc})")
                if y.dtype != np.bool_:
                    y = y.astype(a.dtype, copy=False)
                c.add_flops(c.vector_flops, _dtype_name(a), y.size * (len(ids) if y.shape[0] == 1 else 1))
                regs[ins.dst] = y
            elif t is isa.Where:
                cond = regs[ins.cond]
                a, b = _align(regs[ins.a], regs[ins.b])
                cond, a = _align(cond, a)
                cond, b = _align(cond, b)
                regs[ins.dst] = np.where(cond.astype(bool), a, b)
            elif t is isa.Convert:
                regs[ins.dst] = regs[ins.src].astype(isa.np_dtype(ins.dtype))
            elif t is isa.Reshape:
                x = regs[ins.src]
                if math.prod(x.shape[1:]) != math.prod(ins.shape):
                    self.fail(ins, f"cannot reshape tile {x.shape[1:]} to {ins.shape}")
                regs[ins.dst] = x.reshape(x.shape[:1] + tuple(ins.shape))
            elif t is isa.Broadcast:
                x = regs[ins.src]
                x, _ = _align(x, np.empty((1,) + tuple(ins.shape), dtype=np.bool_))
                try:
                    regs[ins.dst] = np.broadcast_to(x, x.shape[:1] + tuple(ins.shape))
                except ValueError:
                    self.fail(ins, f"cannot broadcast tile {x.shape[1:]} to {ins.shape}")
            elif t is isa.Reduce:
                x = regs[ins.src]
                if not -x.ndim + 1 <= ins.axis < x.ndim - 1:
                    self.fail(ins, f"axis {ins.axis} out of range for tile {x.shape[1:]}")
                axis = ins.axis + 1 if ins.axis >= 0 else ins.axis
                y = _REDUCE[ins.fn](_compute_dtype(x), axis=axis, keepdims=True)
                y = y.astype(np.int64 if ins.fn in isa.ARG_REDUCE else x.dtype)
                c.add_flops(c.vector_flops, _dtype_name(x), x.size)
                regs[ins.dst] = y
            elif t is isa.Load:
                regs[ins.dst] = self.load(ins, len(ids))
            elif t is isa.StoreReduce:
                self.store_reduce(ins, len(ids))
            elif t is isa.Store:
                self.store(ins, len(ids))
            elif t is isa.Dot:
                self.dot(ins, len(ids))
            elif t is isa.Barrier:
                pass                       # all instances run in lock step here
            elif t is isa.Loop:
                stop = ins.stop
                if isinstance(stop, str):
                    bound = regs[stop]
                    if bound.size != 1:
                        self.fail(ins, f"loop bound {stop} must be uniform across instances")
                    stop = int(bound.reshape(-1)[0])
                for k in range(ins.start, stop, ins.step):
                    regs[ins.var] = np.array([k], dtype=np.int64)
                    self.run(ins.body, ids, grid)
            else:  # pragma: no cover - verify() rejects anything else
                self.fail(ins, "unknown instruction")

    def _addresses(self, ins, n: int):
        offsets = self.regs[ins.offsets]
        if offsets.dtype.kind not in "iu":
            self.fail(ins, "offsets must be an integer tile")
        mask = self.regs[ins.mask] if ins.mask is not None else None
        if mask is not None:
            offsets, mask = _align(offsets, mask)
            shape = np.broadcast_shapes(offsets.shape, mask.shape)
            offsets = np.broadcast_to(offsets, shape)
            mask = np.broadcast_to(mask.astype(bool), shape)
        dtype = self.ptr_dtype[ins.ptr]
        base = int(self.args[ins.ptr])
        return base + offsets.astype(np.int64) * dtype.itemsize, mask, dtype

    def load(self, ins, n: int) -> np.ndarray:
        addrs, mask, dtype = self._addresses(ins, n)
        if mask is None:
            values = self.space.gather(addrs.ravel(), dtype).reshape(addrs.shape)
            active = addrs.size
            self.c.touch(self.c.read_ranges, ins.ptr, addrs, dtype.itemsize)
        else:
            values = np.full(addrs.shape, ins.other, dtype=dtype)
            values[mask] = self.space.gather(addrs[mask], dtype)
            active = int(mask.sum())
            self.c.touch(self.c.read_ranges, ins.ptr, addrs[mask], dtype.itemsize)
        scale = n if addrs.shape[0] == 1 else 1
        self.c.bytes_read += active * dtype.itemsize * scale
        return values

    def _lanes(self, ins, n: int):
        """Active lanes of a store-like instruction: flat addresses and values, and the dtype."""
        addrs, mask, dtype = self._addresses(ins, n)
        value = self.regs[ins.value]
        addrs, value = _align(addrs, value)
        shape = np.broadcast_shapes(addrs.shape, value.shape)
        if mask is not None:
            mask, _ = _align(mask, value)
            shape = np.broadcast_shapes(shape, mask.shape)
        addrs = np.broadcast_to(addrs, shape)
        value = np.broadcast_to(value.astype(dtype, copy=False), shape)
        if mask is not None:
            mask = np.broadcast_to(mask, shape)
            addrs, value = addrs[mask], value[mask]
        return addrs.ravel(), np.ascontiguousarray(value).ravel(), dtype

    def store(self, ins, n: int) -> None:
        addrs, values, dtype = self._lanes(ins, n)
        self.space.scatter(addrs, values)
        self.c.bytes_written += addrs.size * dtype.itemsize
        self.c.touch(self.c.write_ranges, ins.ptr, addrs, dtype.itemsize)

    def store_reduce(self, ins, n: int) -> None:
        """Collect contributions; they are combined once, in order, when the kernel ends."""
        addrs, values, _ = self._lanes(ins, n)
        self.pending.setdefault((ins.ptr, ins.fn), []).append((addrs, values))

    def flush_reductions(self) -> None:
        for (ptr, fn), parts in self.pending.items():
            addrs = np.concatenate([a for a, _ in parts])
            values = np.concatenate([v for _, v in parts])
            if addrs.size == 0:
                continue
            dtype = values.dtype
            uniq, inverse = np.unique(addrs, return_inverse=True)
            ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[fn]
            work = _compute_dtype(values)
            acc = self.space.gather(uniq, dtype)
            acc = _compute_dtype(acc).copy()
            ufunc.at(acc, inverse, work)          # sequential in contribution order: deterministic
            self.space.scatter(uniq, acc.astype(dtype))
            self.c.bytes_read += uniq.size * dtype.itemsize
            self.c.bytes_written += uniq.size * dtype.itemsize
            self.c.add_flops(self.c.vector_flops, _dtype_name(values), values.size)
            self.c.touch(self.c.read_ranges, ptr, uniq, dtype.itemsize)
            self.c.touch(self.c.write_ranges, ptr, uniq, dtype.itemsize)
        self.pending = {}

    def dot(self, ins, n: int) -> None:
        a, b, acc = self.regs[ins.a], self.regs[ins.b], self.regs[ins.acc]
        if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1]:
            self.fail(ins, f"needs [M,K] x [K,N] tiles, got {a.shape[1:]} x {b.shape[1:]}")
        acc_dt = isa.np_dtype(ins.acc_dtype)
        prod = np.matmul(a.astype(acc_dt), b.astype(acc_dt))
        if acc.shape[1:] != prod.shape[1:]:
            self.fail(ins, f"accumulator tile {acc.shape[1:]} does not match product {prod.shape[1:]}")
        self.regs[ins.dst] = (acc.astype(acc_dt) + prod).astype(acc_dt)
        m, k, nn = a.shape[1], a.shape[2], b.shape[2]
        path = "tfloat32" if ins.a in self.tf32 and ins.b in self.tf32 else _dtype_name(a)
        self.c.add_flops(self.c.matrix_flops, path, 2.0 * m * nn * k * n)


def execute(program: isa.Program, grid: tuple[int, int, int], args: dict,
            space: AddressSpace) -> Counters:
    """Run ``program`` over ``grid`` in ``space`` with ``args`` (parameter name -> value)."""
    missing = [p.name for p in program.params if p.name not in args]
    if missing:
        raise ExecutionError(f"kernel {program.name!r}: missing argument(s) {', '.join(missing)}")
    gx, gy, gz = grid
    total = gx * gy * gz
    counters = Counters(instances=total)
    chunk = max(1, _CHUNK_ELEMENTS // isa.max_tile_elements(program))
    runner = _Run(program, space, args, counters)
    for start in range(0, total, chunk):
        ids = np.arange(start, min(total, start + chunk), dtype=np.int64)
        runner.regs = {}
        runner.run(program.body, ids, (gx, gy, gz))
    runner.flush_reductions()
    return counters
