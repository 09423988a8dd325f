"""The executor: runs every program instance of a grid at once with numpy.

Registers hold arrays of shape ``(instances, *tile)`` or ``(1, *tile)`` for
values that are the same in every instance; numpy broadcasting does the rest.
Tile dimensions are aligned to the right (numpy's rule), with the instance
axis always first.  Every load and store goes through the context's address
space, so an access outside a live mapping is a page fault with its address.
An access whose active elements all lie in one mapping (with an aligned
pointer) indexes that mapping's elements directly; anything else goes by byte
address through gather / scatter, which fault, or split the access between
mappings, exactly.

Large grids run in chunks of instances so that memory stays bounded; there
is never a Python loop over single instances.

**Replay.**  A kernel launched again over the same grid with the same scalar
arguments computes the same indices, touches the same offsets of its buffers
and counts the same work; only the buffers' contents and base addresses
differ.  So the second launch of each (program, grid, scalars) is *recorded*
(the first runs plainly: many kernels run only once): a register that
depends only on the grid, constants, scalars and loop counters is static,
and the tape keeps just the instructions that read memory or depend on what
was read, each with the static registers it reads.
A later launch replays the tape and takes its counters from the recording
(byte ranges rebased on the pointer arguments).  A replayed load or store
keeps its layout, not its addresses: one ascending run, an n-d box of
elements (a transpose, a broadcast row, a tile of a matrix: a strided view,
no index array), or else the element indices; when its elements all lie in
one mapping it reads or writes that mapping directly, and anything else (a
fault, a misaligned base, an access spanning mappings) takes the general
path from the same addresses, which raises exactly what a first launch would.
A load or store at offsets read from memory (a gather, a scatter) replays the
general way and counts the byte range it touches live; everything else it
counts does not depend on the data.  A kernel whose masks, loop bounds or
store_reduce targets depend on loaded data is never recorded, and recordings
are bounded in memory (:data:`REPLAY_BYTES`; 0 switches replay off).

Numerics never depend on these paths: a matrix product is one numpy matmul of
the same tiles, with the same strides, in the same order either way.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from . import isa
from .arithmetic import cast as _cast
from .arithmetic import power as _power
from .faults import ExecutionError
from .memory import AddressSpace

_LOW_PRECISION = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
_CHUNK_ELEMENTS = 1 << 22

#: bytes of static registers all replay recordings together may hold (least recently used
#: recordings go first); a single recording larger than an eighth of it is not kept
REPLAY_BYTES = 64 << 20


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
        self.touch_range(table, name, int(addrs.min()), int(addrs.max()) + itemsize)

    def touch_range(self, table: dict, name: str, lo: int, hi: int) -> None:
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


_DTYPE_NAMES = {dt: name for name, dt in isa.DTYPES.items()}


def _dtype_name(arr: np.ndarray) -> str:
    name = _DTYPE_NAMES.get(arr.dtype)
    if name is not None:
        return name
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


def _operand(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``arr`` converted to ``dtype`` (:func:`_cast`) without the copy when it already is a
    C-contiguous array of ``dtype``: the same values and strides (for a matrix product, the
    same BLAS call)."""
    return arr if arr.dtype == dtype and arr.flags.c_contiguous else _cast(arr, dtype)


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
    "max": np.maximum, "min": np.minimum, "pow": lambda a, b: _power(a, b),
    "floordiv": np.floor_divide,
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


# ---- what replay needs to know about instructions -----------------------------------------
#: instructions whose result depends on nothing but the grid, constants and scalars
_SOURCES = frozenset({isa.ProgramId, isa.Arange, isa.Const, isa.ScalarArg})
#: instructions whose result is static when every register they read is
_PURE = frozenset({isa.Unary, isa.Binary, isa.Where, isa.Convert, isa.Reshape, isa.Broadcast,
                   isa.Reduce, isa.Dot})
_MEMORY = frozenset({isa.Load, isa.Store, isa.StoreReduce})
_OPERANDS = isa.OPERANDS


def _frozen(arr: np.ndarray) -> np.ndarray:
    """A recording's arrays are shared by every replay: make accidental writes fail loudly."""
    arr.flags.writeable = False
    return arr


def _box(index: np.ndarray):
    """``index`` (element indices in lane order) as a row-major walk of an n-d box from
    ``index[0]``: ``(shape, strides)`` in elements (a stride may be 0 or negative), or None
    when it is not one.  Checked element by element, so a box is never a guess."""
    dims, x = [], index
    while x.size > 1:
        steps = np.diff(x)
        d = steps[0]
        breaks = np.flatnonzero(steps != d)
        run = x.size if breaks.size == 0 else int(breaks[0]) + 1
        if run < 2 or x.size % run:
            return None
        dims.append((run, int(d)))
        x = x[::run]
    shape = tuple(r for r, _ in reversed(dims))
    strides = tuple(d for _, d in reversed(dims))
    if not np.array_equal(_box_index(int(index[0]), shape, strides), index):
        return None
    return shape, strides


def _box_index(start: int, shape: tuple, strides: tuple) -> np.ndarray:
    """The element indices of a box, flat in row-major order."""
    out = np.full(shape, start, dtype=np.int64)
    for axis, (r, d) in enumerate(zip(shape, strides)):
        out += (np.arange(r, dtype=np.int64) * d).reshape((r,) + (1,) * (len(shape) - axis - 1))
    return out.ravel()


def _one_to_one(shape: tuple, strides: tuple) -> bool:
    """Whether a box's elements are all distinct (a mixed-radix layout: each stride clears
    the span of the smaller ones), so a store into it writes each element once."""
    span = 0
    for r, d in sorted(zip(shape, (abs(d) for d in strides)), key=lambda e: e[1]):
        if d <= span:
            return False
        span += (r - 1) * d
    return True


class _Lanes:
    """The static layout of one load or store: which elements of its buffer it touches.

    ``lo``/``hi``: byte offsets (from the pointer argument) of the first and last active
    element; ``start``/``count``: the first active element and how many there are.  They
    are one ascending run (``box`` and ``index`` None), an n-d box walked in lane order
    (``box``: shape and element strides; a store's box never repeats an element), or
    ``index``: the elements in lane order.  ``mask``: the lanes that are active, when not
    all are; ``shape``: the register (load) or lane (store) shape; ``vshape``: a store's
    value register as the store aligns it, before broadcasting."""

    __slots__ = ("ptr", "dtype", "itemsize", "shape", "mask", "lo", "hi", "start", "count", "index",
                 "box", "vshape")

    @classmethod
    def of(cls, ptr: str, active: np.ndarray, shape: tuple, mask, dtype: np.dtype, vshape=None,
           store: bool = False):
        """The layout of the ``active`` lanes' element offsets (in lane order) of an access
        of ``shape`` lanes; None when there are none."""
        if active.size == 0:
            return None
        isz = dtype.itemsize
        index = np.array(active, dtype=np.int64).ravel()
        lo, hi = int(index.min()), int(index.max())
        if lo < -(1 << 59) or hi >= 1 << 59:
            # byte offsets wrap around int64 like the plain path's addresses do
            index = index * isz // isz
            lo, hi = int(index.min()), int(index.max())
        lanes = cls()
        lanes.ptr, lanes.dtype, lanes.itemsize, lanes.shape = ptr, dtype, isz, shape
        lanes.mask = None if mask is None or mask.all() else _frozen(np.array(mask, dtype=bool))
        lanes.lo, lanes.hi = lo * isz, hi * isz
        lanes.start, lanes.count = int(index[0]), int(index.size)
        run = lanes.count == int(index[-1]) - lanes.start + 1 and (
            lanes.count == 1 or bool((np.diff(index) == 1).all()))
        lanes.index = lanes.box = None
        if not run:
            box = _box(index)
            if box is not None and (not store or _one_to_one(*box)):
                lanes.box = (box[0], tuple(d * lanes.itemsize for d in box[1]))
            else:
                lanes.index = _frozen(index)
        lanes.vshape = vshape
        return lanes

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.mask, self.index) if a is not None)

    def addresses(self, base: int) -> np.ndarray:
        """The active lanes' byte addresses for pointer ``base``, in lane order: what the
        plain path would gather from or scatter to."""
        if self.index is not None:
            index = self.index
        elif self.box is not None:
            shape, strides = self.box
            index = _box_index(self.start, shape, tuple(d // self.itemsize for d in strides))
        else:
            index = np.arange(self.start, self.start + self.count, dtype=np.int64)
        return base + index * self.itemsize


#: tape marks: a binary / unary whose operands need no alignment and no compute-dtype widening;
#: a load or store whose offsets were loaded (replayed the general way, its range counted live)
_PLAIN_BINARY, _PLAIN_UNARY, _DYNAMIC = "plain binary", "plain unary", "dynamic"


def _plain(ins, t, regs):
    if t is isa.Binary:
        a, b = regs[ins.a], regs[ins.b]
        if (a.ndim == b.ndim and a.dtype == b.dtype and ins.fn not in isa.BITWISE
                and _dtype_name(a) not in _LOW_PRECISION):
            return _PLAIN_BINARY
    elif t is isa.Unary and _dtype_name(regs[ins.src]) not in _LOW_PRECISION:
        return _PLAIN_UNARY
    return None


def _root(arr: np.ndarray) -> np.ndarray:
    """The array whose memory ``arr`` views (itself if it owns its memory)."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


class _Recorder:
    """Watches a launch: which registers are static, and the tape of the rest.  Gives up
    (``ok`` False) when something depends on loaded data or the tape would hold more than
    ``limit`` bytes (then it also lets go of what it held)."""

    def __init__(self, limit: int):
        self.ok = True              # False once the launch cannot be (or is not) recorded
        self.limit = limit
        self.nbytes = 0             # what the tape holds: static arrays, lane layouts, entries
        self._held: set[int] = set()
        self.static: set[str] = set()
        self.tape: list[list] = []  # [instruction, {static register: value}, lanes or None]
        self.chunks: list[tuple[int, list]] = []
        self.dynamic = False        # whether some load or store has data-dependent addresses
        self.dynamic_now = False    # whether the instruction running now is one
        #: (written?, pointer) -> the byte range the static accesses touch, relative to the pointer
        self.static_ranges: dict[tuple[bool, str], tuple[int, int]] = {}

    def start_chunk(self) -> None:
        self.static, self.tape = set(), []

    def end_chunk(self, n: int) -> None:
        if self.ok:
            self.chunks.append((n, self.tape))

    def _hold(self, nbytes: int) -> None:
        self.nbytes += nbytes
        if self.nbytes > self.limit:
            self.give_up()

    def give_up(self) -> None:
        self.ok = False
        self.tape, self.chunks, self._held = [], [], set()

    def before(self, ins, t, regs) -> bool:
        """Called before ``ins`` runs: True if its result is static (it needs no tape entry)."""
        if t in _SOURCES or t is isa.Barrier:
            return True
        reads = [r for r in (getattr(ins, n) for n in _OPERANDS[t]) if r is not None]
        static = self.static
        if t in _PURE and all(r in static for r in reads):
            return True
        if t in _MEMORY and ins.offsets not in static:
            if t is isa.StoreReduce:        # how many distinct targets it has is counted: data
                self.give_up()
                return False
            self.dynamic = self.dynamic_now = True
        if t in _MEMORY and ins.mask is not None and ins.mask not in static:
            self.give_up()                  # a data-dependent mask changes what is counted
            return False
        statics = {r: regs[r] for r in reads if r in static}
        self.tape.append([ins, statics, _DYNAMIC if self.dynamic_now else _plain(ins, t, regs)])
        if t not in _MEMORY:                # a load or store is accounted once its layout is known
            self._hold_statics(statics)
        return False

    def touched(self, write: bool, ptr: str, lo: int, hi: int) -> None:
        """A static access touched [lo, hi) (relative to its pointer)."""
        key = (write, ptr)
        old = self.static_ranges.get(key)
        self.static_ranges[key] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))

    def _hold_statics(self, statics: dict, extra: int = 0) -> None:
        held = 256 + extra                  # the entry itself: list, dict, later a closure
        for arr in statics.values():
            root = _root(arr)
            if id(root) not in self._held:
                self._held.add(id(root))
                held += root.nbytes
        self._hold(held)

    def after(self, ins, static: bool, lanes) -> None:
        dst = getattr(ins, "dst", None)
        if dst is not None:
            if static:
                self.static.add(dst)
            else:
                self.static.discard(dst)
        if type(ins) in _MEMORY:
            entry = self.tape[-1]
            statics = entry[1]
            if self.dynamic_now:            # its layout was data: it is replayed the general way
                lanes, self.dynamic_now = None, False
            if lanes is not None:
                # the replayed access goes by its layout: its address registers need not be kept
                entry[2] = lanes
                for r in (ins.offsets, ins.mask):
                    if r != getattr(ins, "value", None):
                        statics.pop(r, None)
            self._hold_statics(statics, 0 if lanes is None else lanes.nbytes())


class _Run:
    def __init__(self, program: isa.Program, space: AddressSpace, args: dict, counters: Counters | None,
                 ptr_dtype: dict, recorder: _Recorder | None = None):
        self.program = program
        self.space = space
        self.args = args
        self.c = counters
        self.regs: dict[str, np.ndarray] = {}
        self.pending: dict[tuple[str, str], list] = {}     # store_reduce contributions
        self.ptr_dtype = ptr_dtype
        self.tf32: set[str] = set()     # registers holding TF32-rounded tiles (the TF32 matrix path)
        self.counting = True            # False while replaying: the recording has the counts
        self.rec = recorder
        self.lanes: _Lanes | None = None   # the layout the last load/store saw (while recording)

    def fail(self, ins, msg: str):
        raise ExecutionError(f"kernel {self.program.name!r}, {ins.op}: {msg}")

    def run(self, body, ids: np.ndarray, grid: tuple[int, int, int]) -> None:
        c, n = self.c, len(ids)
        for ins in body:
            c.instructions += 1
            t = type(ins)
            if t is isa.Loop:
                self.loop(ins, ids, grid)
                continue
            rec = self.rec
            if rec is None or not rec.ok:
                self.step(ins, t, ids, n, grid)
                continue
            static = rec.before(ins, t, self.regs)
            self.step(ins, t, ids, n, grid)
            if rec.ok:
                rec.after(ins, static, self.lanes)
            self.lanes = None

    def loop(self, ins, ids: np.ndarray, grid: tuple[int, int, int]) -> None:
        regs, rec = self.regs, self.rec
        stop = ins.stop
        if isinstance(stop, str):
            bound = regs[stop]
            if bound.size != 1:
                self.fail(ins, f"loop bound {stop} must be uniform across instances")
            if rec is not None and rec.ok and stop not in rec.static:
                rec.give_up()               # a bound read from memory: not replayable
            stop = int(bound.reshape(-1)[0])
        for k in range(ins.start, stop, ins.step):
            regs[ins.var] = np.array([k], dtype=np.int64)
            if rec is not None:
                rec.static.add(ins.var)
            self.run(ins.body, ids, grid)

    def step(self, ins, t, ids, n: int, grid: tuple[int, int, int]) -> None:
        """Run one instruction (not a loop); ``n``: instances in this chunk."""
        regs, c = self.regs, self.c
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
                y = _cast(y, x.dtype)
            if self.counting:
                c.add_flops(c.vector_flops, _dtype_name(x), y.size * (n if y.shape[0] == 1 else 1))
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
                y = _cast(y, a.dtype)
            if self.counting:
                c.add_flops(c.vector_flops, _dtype_name(a), y.size * (n if y.shape[0] == 1 else 1))
            regs[ins.dst] = y
        elif t is isa.Where:
            cond = regs[ins.cond]
            a, b = _align(regs[ins.a], regs[ins.b])
            cond, a = _align(cond, a)
            cond, b = _align(cond, b)
            regs[ins.dst] = np.where(cond.astype(bool), a, b)
        elif t is isa.Convert:
            # to its own dtype, a C-contiguous register is what the copy would be (registers
            # are never written in place, so the two may share it)
            regs[ins.dst] = _operand(regs[ins.src], isa.np_dtype(ins.dtype))
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
            y = _cast(y, np.int64 if ins.fn in isa.ARG_REDUCE else x.dtype)
            if self.counting:
                c.add_flops(c.vector_flops, _dtype_name(x), x.size)
            regs[ins.dst] = y
        elif t is isa.Load:
            regs[ins.dst] = self.load(ins, n)
        elif t is isa.StoreReduce:
            self.store_reduce(ins, n)
        elif t is isa.Store:
            self.store(ins, n)
        elif t is isa.Dot:
            self.dot(ins, n)
        elif t is isa.Barrier:
            pass                       # all instances run in lock step here
        else:  # pragma: no cover - verify() rejects anything else
            self.fail(ins, "unknown instruction")

    def _recording(self) -> bool:
        """Whether the access running now is recorded (a static one, while recording)."""
        return self.rec is not None and self.rec.ok and not self.rec.dynamic_now

    def _touch(self, write: bool, ptr: str, lo: int, hi: int) -> None:
        c = self.c
        c.touch_range(c.write_ranges if write else c.read_ranges, ptr, lo, hi)
        if self._recording():
            base = int(self.args[ptr])
            self.rec.touched(write, ptr, lo - base, hi - base)

    def _offsets(self, ins):
        """A load's or store's offsets and mask (aligned and broadcast together), and dtype."""
        offsets = self.regs[ins.offsets]
        if offsets.dtype.kind not in "iu":
            self.fail(ins, "offsets must be an integer tile")
        mask = self.regs[ins.mask] if ins.mask is not None else None
        if mask is not None:
            offsets, mask = _align(offsets, mask)
            shape = np.broadcast_shapes(offsets.shape, mask.shape)
            offsets = np.broadcast_to(offsets, shape)
            mask = mask.astype(bool, copy=False)
            # every lane active: the same access as no mask (the mask still shaped the offsets)
            mask = None if mask.all() else np.broadcast_to(mask, shape)
        return offsets, mask, self.ptr_dtype[ins.ptr]

    def _direct(self, ptr: str, active: np.ndarray, dtype: np.dtype):
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

    def load(self, ins, n: int) -> np.ndarray:
        offsets, mask, dtype = self._offsets(ins)
        isz = dtype.itemsize
        active = offsets if mask is None else offsets[mask]
        if self._recording():
            self.lanes = _Lanes.of(ins.ptr, active, offsets.shape, mask, dtype)
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
                self._touch(False, ins.ptr, lo, end)
                self.c.bytes_read += index.size * isz * (n if offsets.shape[0] == 1 else 1)
            return values
        addrs = self._byte_addresses(ins.ptr, offsets, dtype)
        if mask is None:
            values = self.space.gather(addrs.ravel(), dtype).reshape(addrs.shape)
            if self.counting:
                active = addrs.size
                if active:
                    self._touch(False, ins.ptr, int(addrs.min()), int(addrs.max()) + isz)
        else:
            values = np.full(addrs.shape, ins.other, dtype=dtype)
            values[mask] = self.space.gather(addrs[mask], dtype)
            if self.counting:
                hit = addrs[mask]
                active = hit.size
                if active:
                    self._touch(False, ins.ptr, int(hit.min()), int(hit.max()) + isz)
        if self.counting:
            scale = n if addrs.shape[0] == 1 else 1
            self.c.bytes_read += active * isz * scale
        return values

    def _lanes(self, ins, n: int):
        """Active lanes of a store-like instruction: flat element offsets and values, and the dtype."""
        offsets, mask, dtype = self._offsets(ins)
        value = self.regs[ins.value]
        offsets, value = _align(offsets, value)
        vshape = value.shape
        shape = np.broadcast_shapes(offsets.shape, value.shape)
        if mask is not None:
            mask, _ = _align(mask, value)
            shape = np.broadcast_shapes(shape, mask.shape)
            mask = np.broadcast_to(mask, shape)
        offsets = np.broadcast_to(offsets, shape)
        value = np.broadcast_to(_cast(value, dtype), shape)
        if mask is not None:
            offsets, value, full = offsets[mask], value[mask], offsets.shape
        else:
            offsets, full = offsets.ravel(), offsets.shape
        if self._recording() and type(ins) is isa.Store:
            self.lanes = _Lanes.of(ins.ptr, offsets, full, mask, dtype, vshape, store=True)
        return offsets, np.ascontiguousarray(value).ravel(), dtype

    def _byte_addresses(self, ptr: str, offsets: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return int(self.args[ptr]) + offsets.astype(np.int64) * dtype.itemsize

    def store(self, ins, n: int) -> None:
        offsets, values, dtype = self._lanes(ins, n)
        isz = dtype.itemsize
        direct = self._direct(ins.ptr, offsets, dtype)
        if direct is not None:
            m, index, lo, end = direct
            # registers are never written in place, so a deferred write may keep ``values``
            self.space.store_elements(m, dtype, index, values, owned=True)
            if self.counting:
                self.c.bytes_written += index.size * isz
                self._touch(True, ins.ptr, lo, end)
            return
        addrs = self._byte_addresses(ins.ptr, offsets, dtype)
        self.space.scatter(addrs, values)
        if self.counting:
            self.c.bytes_written += addrs.size * isz
            if addrs.size:
                self._touch(True, ins.ptr, int(addrs.min()), int(addrs.max()) + isz)

    def store_reduce(self, ins, n: int) -> None:
        """Collect contributions; they are combined once, in order, when the kernel ends."""
        offsets, values, dtype = self._lanes(ins, n)
        addrs = self._byte_addresses(ins.ptr, offsets, dtype)
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
            self.space.scatter(uniq, _cast(acc, dtype))
            if self.counting:
                self.c.bytes_read += uniq.size * dtype.itemsize
                self.c.bytes_written += uniq.size * dtype.itemsize
                self.c.add_flops(self.c.vector_flops, _dtype_name(values), values.size)
                lo, hi = int(uniq[0]), int(uniq[-1]) + dtype.itemsize     # np.unique sorts
                self._touch(False, ptr, lo, hi)
                self._touch(True, ptr, lo, hi)
        self.pending = {}

    def dot(self, ins, n: int) -> None:
        a, b, acc = self.regs[ins.a], self.regs[ins.b], self.regs[ins.acc]
        if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1]:
            self.fail(ins, f"needs [M,K] x [K,N] tiles, got {a.shape[1:]} x {b.shape[1:]}")
        acc_dt = isa.np_dtype(ins.acc_dtype)
        prod = np.matmul(_operand(a, acc_dt), _operand(b, acc_dt))
        if acc.shape[1:] != prod.shape[1:]:
            self.fail(ins, f"accumulator tile {acc.shape[1:]} does not match product {prod.shape[1:]}")
        y = (acc if acc.dtype == acc_dt else acc.astype(acc_dt)) + prod
        self.regs[ins.dst] = y if y.dtype == acc_dt else y.astype(acc_dt)
        if self.counting:
            m, k, nn = a.shape[1], a.shape[2], b.shape[2]
            path = "tfloat32" if ins.a in self.tf32 and ins.b in self.tf32 else _dtype_name(a)
            self.c.add_flops(self.c.matrix_flops, path, 2.0 * m * nn * k * n)


# ---- recordings ----------------------------------------------------------------------------
class _Program:
    """What a program needs at every launch, worked out once: chunk size, pointer dtypes,
    scalar parameters; and the keys of its recordings (dropped when the program is)."""

    __slots__ = ("ref", "tile", "ptr_dtype", "names", "scalars", "keys", "skip", "seen", "__weakref__")

    def __init__(self, program: isa.Program):
        self.tile: int | None = None    # isa.max_tile_elements (worked out at the first run)
        self.ptr_dtype = {p.name: isa.np_dtype(p.dtype) for p in program.params if p.kind == "ptr"}
        self.names = tuple(p.name for p in program.params)
        self.scalars = tuple((p.name, p.dtype) for p in program.params if p.kind == "scalar")
        self.keys: set = set()          # recordings of this program held in _RECORDINGS
        self.skip: set = set()          # keys found not replayable (or too large to keep)
        self.seen: set = set()          # keys launched once: the second launch records


class _Recording:
    """One replayable launch: its tape per chunk and its counters (ranges relative to the
    pointer arguments).  With data-dependent accesses (``dynamic``), a range is what the
    static accesses touched (None if none did) joined with what the replay counts live."""

    __slots__ = ("chunks", "counters", "read_rel", "write_rel", "nbytes", "pricing", "dynamic")

    def __init__(self, rec: _Recorder, counters: Counters, args: dict):
        self.counters = counters
        self.dynamic = rec.dynamic
        if rec.dynamic:
            # which pointers are touched, and in what order, does not depend on the data
            self.read_rel = [(k, rec.static_ranges.get((False, k))) for k in counters.read_ranges]
            self.write_rel = [(k, rec.static_ranges.get((True, k))) for k in counters.write_ranges]
        else:
            self.read_rel = [(k, lo - int(args[k]), hi - int(args[k]))
                             for k, (lo, hi) in counters.read_ranges.items()]
            self.write_rel = [(k, lo - int(args[k]), hi - int(args[k]))
                              for k, (lo, hi) in counters.write_ranges.items()]
        for _, tape in rec.chunks:
            for _, statics, _how in tape:
                for arr in statics.values():
                    _frozen(arr)
        self.nbytes = rec.nbytes
        #: per chunk, the tape as (static registers to bind, operation) pairs
        self.chunks = [[(statics, _operation(ins, how, n)) for ins, statics, how in tape]
                       for n, tape in rec.chunks]
        self.pricing: dict = {}         # the device's kernel prices of this work (see Device)

    def counted(self, args: dict, live: Counters | None) -> Counters:
        """The recorded counts for a launch with ``args``; ``live``: the ranges the replay's
        data-dependent accesses touched."""
        c = self.counters
        out = Counters(c.instances, dict(c.matrix_flops), dict(c.vector_flops), c.bytes_read,
                       c.bytes_written, c.instructions, {}, {})
        if self.dynamic:
            live = live or Counters()
            for table, rel, seen in ((out.read_ranges, self.read_rel, live.read_ranges),
                                     (out.write_ranges, self.write_rel, live.write_ranges)):
                for k, part in rel:
                    got = seen.get(k)
                    if part is not None:
                        base = int(args[k])
                        part = (base + part[0], base + part[1])
                        got = part if got is None else (min(got[0], part[0]), max(got[1], part[1]))
                    table[k] = got
        else:
            for table, rel in ((out.read_ranges, self.read_rel), (out.write_ranges, self.write_rel)):
                for k, lo, hi in rel:
                    base = int(args[k])
                    table[k] = (base + lo, base + hi)
        out.pricing = self.pricing      # not a field: the same work, priced once per footprint
        return out


class _Replay:
    """One replayed launch: its registers, and the general executor when an operation needs
    it (an instruction with no fast form, a load or store the fast path cannot take)."""

    __slots__ = ("program", "space", "args", "grid", "ptr_dtype", "regs", "run", "live")

    def __init__(self, program, space, args, grid, ptr_dtype):
        self.program, self.space, self.args, self.grid, self.ptr_dtype = program, space, args, grid, ptr_dtype
        self.regs: dict = {}
        self.run: _Run | None = None
        self.live: Counters | None = None   # what the data-dependent accesses counted

    def _runner(self) -> _Run:
        run = self.run
        if run is None:
            run = self.run = _Run(self.program, self.space, self.args, None, self.ptr_dtype)
            run.counting = False
        run.regs = self.regs
        return run

    def general(self, ins, n: int) -> None:
        self._runner().step(ins, type(ins), None, n, self.grid)

    def dynamic(self, ins, n: int) -> None:
        """A load or store at loaded offsets: the general way, its ranges counted into ``live``."""
        if self.live is None:
            self.live = Counters()
        run = self._runner()
        run.c, run.counting = self.live, True
        try:
            run.step(ins, type(ins), None, n, self.grid)
        finally:
            run.c, run.counting = None, False


def _operation(ins, how, n: int):
    """A tape entry as a function ``(regs, args, space, replay)`` doing what :meth:`_Run.step`
    does with counting off (the general path itself when there is no faster form)."""
    if how is _PLAIN_BINARY:
        fn, a, b, dst = _BINARY[ins.fn], ins.a, ins.b, ins.dst

        def binary(regs, args, space, replay):
            x = regs[a]
            with np.errstate(all="ignore"):
                y = fn(x, regs[b])
            regs[dst] = y if y.dtype == np.bool_ else _cast(y, x.dtype)
        return binary
    if how is _PLAIN_UNARY:
        fn, src, dst = _UNARY[ins.fn], ins.src, ins.dst

        def unary(regs, args, space, replay):
            x = regs[src]
            with np.errstate(all="ignore"):
                y = fn(x)
            regs[dst] = y if y.dtype == np.bool_ else _cast(y, x.dtype)
        return unary
    if how is _DYNAMIC:
        def dynamic(regs, args, space, replay):
            replay.dynamic(ins, n)
        return dynamic
    if not isinstance(how, _Lanes):
        def general(regs, args, space, replay):
            replay.general(ins, n)
        return general
    # a load or store with a static layout: index the one mapping that holds it, directly
    ptr, isz, lo, end = how.ptr, how.itemsize, how.lo, how.hi + how.itemsize
    dtype, start, count, index, mask, shape = how.dtype, how.start, how.count, how.index, how.mask, how.shape
    box = how.box
    if type(ins) is isa.Load:
        dst, other = ins.dst, ins.other

        def load(regs, args, space, replay):
            base = int(args[ptr])
            m = None if base % isz else space.holding(base + lo, base + end)
            if m is None:                   # misaligned, spanning mappings or faulting
                got = space.gather(how.addresses(base), dtype)
            elif index is not None:
                got = space.elements(m, dtype)[index + (base - m.va) // isz]
            else:
                first = base - m.va + start * isz
                view = (space.box(m, dtype, (first, (count,), (isz,))) if box is None
                        else space.box(m, dtype, (first,) + box))
                got = view.copy().reshape(-1)
            if mask is None:
                regs[dst] = got.reshape(shape)
            else:
                values = np.full(shape, other, dtype=dtype)
                values[mask] = got
                regs[dst] = values
        return load
    src, vshape = ins.value, how.vshape

    def store(regs, args, space, replay):
        value = regs[src]
        if value.shape != vshape:
            value = value.reshape(vshape)
        value = _cast(value, dtype)
        if value.shape != shape:
            value = np.broadcast_to(value, shape)
        values = value[mask] if mask is not None else np.ascontiguousarray(value).ravel()
        base = int(args[ptr])
        m = None if base % isz else space.holding(base + lo, base + end)
        # registers are never written in place, so a deferred write may keep ``values``
        if m is None:
            space.scatter(how.addresses(base), values)
        elif index is not None:
            space.store_elements(m, dtype, index + (base - m.va) // isz, values, owned=True)
        elif box is None:
            off = (base - m.va) // isz + start
            space.store_elements(m, dtype, slice(off, off + count), values, owned=True)
        else:
            space.store_box(m, dtype, (base - m.va + start * isz,) + box, values.reshape(box[0]))
    return store


_PROGRAMS: dict[int, _Program] = {}
_RECORDINGS: OrderedDict[tuple, _Recording] = OrderedDict()
_recorded_bytes = 0


def _program_info(program: isa.Program) -> _Program:
    info = _PROGRAMS.get(id(program))
    if info is not None and info.ref() is program:
        return info
    info = _Program(program)
    pid = id(program)

    def forget(_ref, pid=pid, info=info):
        if _PROGRAMS.get(pid) is info:
            del _PROGRAMS[pid]
        for key in info.keys:
            _drop((pid, key))

    try:
        info.ref = weakref.ref(program, forget)
    except TypeError:                   # not weakly referable: run it, keep nothing about it
        info.ref = None
        return info
    _PROGRAMS[pid] = info
    return info


def _drop(key: tuple) -> None:
    global _recorded_bytes
    rec = _RECORDINGS.pop(key, None)
    if rec is not None:
        _recorded_bytes -= rec.nbytes


def _keep(pid: int, info: _Program, key, recording: _Recording) -> None:
    global _recorded_bytes
    _RECORDINGS[(pid, key)] = recording
    info.keys.add(key)
    _recorded_bytes += recording.nbytes
    while _recorded_bytes > REPLAY_BYTES and _RECORDINGS:
        (old_pid, old_key), old = _RECORDINGS.popitem(last=False)
        _recorded_bytes -= old.nbytes
        owner = _PROGRAMS.get(old_pid)
        if owner is not None:
            owner.keys.discard(old_key)


def recordings(program: isa.Program) -> int:
    """How many replay recordings of ``program`` are held now (one per grid and scalars)."""
    info = _PROGRAMS.get(id(program))
    if info is None or info.ref is None or info.ref() is not program:
        return 0
    return sum((id(program), key) in _RECORDINGS for key in info.keys)


def clear_recordings() -> None:
    """Forget every replay recording (the next launch of each kernel records again)."""
    global _recorded_bytes
    _RECORDINGS.clear()
    _recorded_bytes = 0
    for info in _PROGRAMS.values():
        info.keys.clear()
        info.skip.clear()
        info.seen.clear()


def _launch_key(info: _Program, grid: tuple, chunk: int, args: dict):
    """What a recording is valid for: the grid (plain ints), the chunking, and every scalar
    argument as the executor sees it (shape and exact bits); None when there is nothing safe
    to key on (the launch then runs, and fails if it must, the general way)."""
    if info.ref is None or any(type(g) is not int for g in grid):
        return None
    if not info.scalars:
        return grid, chunk
    try:
        key = [grid, chunk]
        for name, dt in info.scalars:
            value = np.array([args[name]], dtype=isa.np_dtype(dt))
            key.append((value.shape, value.tobytes()))
        return tuple(key)
    except Exception:
        return None


def _replay(program: isa.Program, recording: _Recording, grid: tuple[int, int, int], args: dict,
            space: AddressSpace, ptr_dtype: dict) -> Counters:
    replay = _Replay(program, space, args, grid, ptr_dtype)
    for tape in recording.chunks:
        regs = replay.regs = {}
        for statics, operation in tape:
            if statics:
                regs.update(statics)
            operation(regs, args, space, replay)
    if replay.run is not None and replay.run.pending:
        replay.run.flush_reductions()
    return recording.counted(args, replay.live)


def execute(program: isa.Program, grid: tuple[int, int, int], args: dict,
            space: AddressSpace) -> Counters:
    """Run ``program`` over ``grid`` in ``space`` with ``args`` (parameter name -> value).

    Arithmetic is IEEE without traps, as on a device: ``inf - inf``, ``0 * nan`` in a matrix
    product, a float overflow give NaN or inf in the tile and raise no host warning."""
    with np.errstate(all="ignore"):
        return _execute(program, grid, args, space)


def _execute(program: isa.Program, grid: tuple[int, int, int], args: dict,
             space: AddressSpace) -> Counters:
    info = _program_info(program)
    missing = [name for name in info.names if name not in args]
    if missing:
        raise ExecutionError(f"kernel {program.name!r}: missing argument(s) {', '.join(missing)}")
    gx, gy, gz = grid
    grid = (gx, gy, gz)
    if info.tile is None:
        info.tile = isa.max_tile_elements(program)
    chunk = max(1, _CHUNK_ELEMENTS // info.tile)
    key = _launch_key(info, grid, chunk, args) if REPLAY_BYTES > 0 else None
    pid = id(program)
    if key is not None:
        recording = _RECORDINGS.get((pid, key))
        if recording is not None:
            _RECORDINGS.move_to_end((pid, key))
            return _replay(program, recording, grid, args, space, info.ptr_dtype)
    total = gx * gy * gz
    counters = Counters(instances=total)
    # a key's first launch runs plainly (many kernels run once); its second one records
    recorder = None
    if key is not None and key not in info.skip:
        if key in info.seen:
            recorder = _Recorder(REPLAY_BYTES // 8)   # one recording: at most an eighth of all
        else:
            if len(info.seen) >= 256:
                info.seen.clear()
            info.seen.add(key)
    runner = _Run(program, space, args, counters, info.ptr_dtype, recorder)
    for start in range(0, total, chunk):
        ids = np.arange(start, min(total, start + chunk), dtype=np.int64)
        runner.regs = {}
        if recorder is not None:
            recorder.start_chunk()
        runner.run(program.body, ids, grid)
        if recorder is not None:
            recorder.end_chunk(len(ids))
    runner.flush_reductions()
    if recorder is not None:
        if recorder.ok:
            _keep(pid, info, key, _Recording(recorder, counters, args))
        elif len(info.skip) < 64:
            info.skip.add(key)
    return counters
