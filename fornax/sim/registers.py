"""The interpreter's register file, with index registers made only when they are read.

A pointwise kernel's flat index ``pid * block + arange(block)`` and a reduction's row
``arange(width)`` are the largest registers most kernels compute: 8 bytes per lane of
every instance of a chunk, one int64 index array as large as the data it addresses.
Yet their usual readers need only their shape: a load or a store at one ascending run
of elements, a bounds mask that is true (or false) in every lane, or true in a prefix of
the lanes (where a row or a chunk runs past the data).  So such a register is held
*unmade* (:class:`Unmade`): what it is the result of, and the range of its values.  An
instruction that reads its elements makes it, once, as the instruction that defines it
would have made it at once, so it has the same values, dtype and shape either way, and
what it was stays known; a load or store that can tell from that it is one run of
elements reads or writes the run as a slice (:mod:`.interpreter` checks the rest of the
access exactly as the general path would).  Only integer index arithmetic that cannot
wrap around is held unmade (its bounds are checked against the dtype's range).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .tiles import Index, Tile

#: an Arange of at least this many lanes is held unmade
LAZY_RANGE = 1 << 22
#: an integer add whose result has at least this many lanes, and at least
#: :data:`LAZY_RATIO` times as many as its operands together, is held unmade
LAZY_SUM = 1 << 16
LAZY_RATIO = 8
#: an index of at least this many elements is checked for being one ascending run
RUN_MIN = 1024


class Unmade:
    """A register not made yet: its shape, dtype and bounds of its values (``lo``, ``hi``:
    Python ints inside the dtype's range, exact for a run)."""

    __slots__ = ("shape", "dtype", "lo", "hi")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any], lo: int, hi: int):
        self.shape, self.dtype, self.lo, self.hi = shape, dtype, lo, hi

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def make(self) -> Tile:
        """The register's array, exactly as the instruction that defines it computes it."""
        raise NotImplementedError

    def run(self) -> int | None:
        """The first value when the register, in lane (row-major) order, is one ascending run
        of consecutive integers; else None."""
        raise NotImplementedError


class UnmadeRange(Unmade):
    """``Arange(n)``: ``np.arange(n, dtype=np.int64)[None, :]``."""

    __slots__ = ()

    def __init__(self, n: int):
        super().__init__((1, n), np.dtype(np.int64), 0, n - 1)

    def make(self) -> Tile:
        return arange(self.shape[1])

    def run(self) -> int | None:
        return 0


class UnmadeSum(Unmade):
    """``a + b`` of two aligned integer registers of one dtype (what a Binary ``add`` computes
    for them: numpy's add, in their dtype), whose broadcast is much larger than both."""

    __slots__ = ("a", "b", "_run")

    def __init__(self, a: Tile, b: Tile, shape: tuple[int, ...], lo: int, hi: int):
        super().__init__(shape, a.dtype, lo, hi)
        self.a, self.b = a, b
        self._run: tuple[int | None] | None = None

    @classmethod
    def of(cls, a: Tile, b: Tile) -> UnmadeSum | None:
        """``a + b`` held unmade (``a``, ``b`` aligned), or None when it is better made now:
        not integers of one dtype, not much larger than its operands, or able to wrap."""
        if a.dtype != b.dtype or a.dtype.kind not in "iu" or a.size == 0 or b.size == 0:
            return None
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            return None
        size = math.prod(shape)
        if size < LAZY_SUM or size < LAZY_RATIO * (a.size + b.size):
            return None
        # every lane is one a_i + b_j, so these bound the values; inside the dtype's range
        # numpy's add cannot wrap around, and the bounds are exact wherever a run is found
        lo, hi = int(a.min()) + int(b.min()), int(a.max()) + int(b.max())
        info = np.iinfo(a.dtype)
        if lo < info.min or hi > info.max:
            return None
        return cls(a, b, shape, lo, hi)

    def make(self) -> Tile:
        made: Tile = np.add(self.a, self.b)
        return made

    def run(self) -> int | None:
        if self._run is None:
            self._run = (self._find_run(),)
        return self._run[0]

    def _find_run(self) -> int | None:
        # a run in row-major order: each axis longer than 1 steps by the lanes after it, and
        # exactly one operand varies along it, as an arithmetic progression with that step
        shape = self.shape
        if any(n > 1 and self.a.shape[k] > 1 and self.b.shape[k] > 1 for k, n in enumerate(shape)):
            return None
        steps = [math.prod(shape[k + 1:]) for k in range(len(shape))]
        first = 0
        for x in (self.a, self.b):
            expect = np.full((1,) * len(shape), 0, dtype=np.int64)
            for k, (n, step) in enumerate(zip(x.shape, steps)):
                if n > 1:
                    expect = expect + (np.arange(n, dtype=np.int64) * step).reshape(
                        (1,) * k + (n,) + (1,) * (len(shape) - k - 1))
            base = int(x.reshape(-1)[0])
            if not np.array_equal(x.astype(np.int64, copy=False), expect + base):
                return None
            first += base
        return first


class UnmadePrefix(Unmade):
    """A mask true in its first ``count`` lanes (row-major) and false in the rest, with
    ``0 < count < size``: a bounds check ``x < c`` (or ``x <= c``) of a register ``x`` that is
    one ascending run (a reduction row's Arange, a pointwise chunk's index), where the row or
    the chunk runs past the end of the data.  Made as numpy's comparison makes it: a
    C-ordered bool array of ``shape``."""

    __slots__ = ("count",)

    def __init__(self, shape: tuple[int, ...], count: int):
        super().__init__(shape, np.dtype(np.bool_), 0, 1)
        self.count = count

    def make(self) -> Tile:
        mask = np.zeros(self.size, dtype=np.bool_)
        mask[: self.count] = True
        return mask.reshape(self.shape)

    def run(self) -> int | None:
        return None


class Registers(dict[str, Tile]):
    """A chunk's registers by name; an :class:`Unmade` one (in ``unmade``) is made, once,
    when an instruction reads it, and what it was stays known (``described``: the shape
    of every register held unmade, made since or not)."""

    __slots__ = ("unmade", "made")

    def __init__(self) -> None:
        super().__init__()
        self.unmade: dict[str, Unmade] = {}
        self.made: dict[str, Unmade] = {}       # unmade registers made since

    def __missing__(self, name: str) -> Tile:
        lazy = self.unmade.pop(name, None)
        if lazy is None:
            raise KeyError(name)
        value = lazy.make()
        dict.__setitem__(self, name, value)
        self.made[name] = lazy
        return value

    def __setitem__(self, name: str, value: Tile) -> None:
        if self.unmade or self.made:
            self.unmade.pop(name, None)
            self.made.pop(name, None)
        dict.__setitem__(self, name, value)

    def hold(self, name: str, value: Unmade) -> None:
        """``name`` := ``value``, made when read."""
        dict.pop(self, name, None)
        self.made.pop(name, None)
        self.unmade[name] = value

    def described(self, name: str) -> Unmade | None:
        """What register ``name`` is, when it was held unmade (made since or not)."""
        return self.unmade.get(name) or self.made.get(name)


def arange(n: int) -> Index:
    """The register an Arange of ``n`` lanes holds."""
    return np.arange(n, dtype=np.int64)[None, :]


def shaped(shape: tuple[int, ...]) -> Tile:
    """A stand-in array of ``shape`` (no memory) for working out how registers align."""
    return np.broadcast_to(np.zeros((), dtype=np.int8), shape)


def all_true(mask: Tile) -> bool:
    """``bool(mask.all())``, at once for a mask broadcast from one value (every stride 0)."""
    if mask.size and not any(mask.strides):
        return bool(mask.flat[0])
    return bool(mask.all())


def distinct_lanes(index: Index) -> Index:
    """``index`` with each broadcast (stride-0) axis cut to length 1: its distinct lanes, a view."""
    if index.size <= 1 or 0 not in index.strides:
        return index
    return index[tuple(slice(0, 1) if st == 0 else slice(None) for st in index.strides)]


def run_start(index: Index) -> int | None:
    """``index``'s first element when ``index`` (in lane order) is one ascending run of
    consecutive integers (and long enough to be worth a slice), else None."""
    if index.size < RUN_MIN or not index.flags.c_contiguous:
        return None
    flat = index.reshape(-1)
    first = int(flat[0])
    # strictly ascending integers spanning size - 1: every step is exactly 1
    if int(flat[-1]) - first != flat.size - 1 or not bool((flat[1:] > flat[:-1]).all()):
        return None
    return first
