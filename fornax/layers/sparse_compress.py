"""The 2:4 prune, check and compress kernels a library ships, as tile-ISA programs.

Each works on a row-major ``m x k`` matrix (``k`` a multiple of 4) in tiles of ``bm`` rows by
32 columns: eight groups of four, the columns one metadata word covers.  Inside a group every
element is ranked against the other three (a 4 x 4 comparison), which is how each kernel
decides what to keep without a sort:

* **prune** keeps an element when fewer than two of its group beat it by magnitude (a larger
  ``|x|``, or an equal one earlier in the group): the two largest of every four;
* **check** counts the groups that hold more than two nonzeros into an int64 counter
  (``d_valid`` of the real call is that count being nonzero);
* **compress** keeps the two slots a 2:4 group is stored in (its nonzeros first, then its
  earliest zeros, in K order), scatters their values to ``[m, k/2]`` and sums their 2-bit
  positions, shifted into place, into one int32 metadata word per tile row
  (:mod:`fornax.sim.sparsity` has the format and its host-side reference).

Sizes are scalar parameters, so one program serves every shape of its dtype; each carries
a per-element estimate for a shape-only device.
"""

from __future__ import annotations

from ..sim import isa
from .blas import ITEMSIZE, Grid
from .codegen import POINTWISE_REGISTERS, KernelBuilder
from .kernel_builder import defined as _reg

#: matrix columns one program instance covers: one metadata word's
COLUMNS = isa.SPARSE_K_PER_WORD
#: groups of four in those columns
GROUPS = COLUMNS // 4
#: vector operations per element each kernel's comparisons and selections cost (estimates)
OPS_PER_ELEMENT = {"prune": 24, "check": 4, "compress": 40}


def grid(m: int, k: int, rows: int) -> Grid:
    """``(ceil(k/32), ceil(m/rows), 1)``."""
    return -(-k // COLUMNS), -(-m // rows), 1


class _Tile:
    """The pieces every kernel shares: the tile's rows, columns, mask and values."""

    def __init__(self, name: str, dtype: str, rows: int):
        self.kb = kb = KernelBuilder(name)
        self.rows = rows
        self.pa = kb.param("a", "ptr", dtype)

    def scalars(self, *names: str) -> list[str]:
        return [self.kb.scalar(n) for n in names]

    def shaped(self, src: str, shape: tuple[int, ...]) -> str:
        return _reg(self.kb.emit(isa.Reshape(self.kb.reg(), src, shape)))

    def load(self, m_r: str, k_r: str) -> None:
        kb, bm = self.kb, self.rows
        r = kb.iadd(kb.imul(kb.pid(1), bm), kb.arange(bm))
        self.row = self.shaped(_reg(r), (bm, 1, 1))
        self.pos = self.shaped(kb.arange(4), (1, 1, 4))                   # position in the group
        group = self.shaped(kb.arange(GROUPS), (1, GROUPS, 1))
        self.group = group
        col = kb.binary("add", kb.binary("add", kb.imul(kb.pid(0), COLUMNS),
                                         kb.binary("mul", group, kb.const(4, "int64"))), self.pos)
        self.row_ok = kb.binary("lt", self.row, m_r)
        self.mask = kb.binary("and", self.row_ok, kb.binary("lt", col, k_r))
        self.off = kb.binary("add", kb.binary("mul", self.row, k_r), col)
        self.x = _reg(kb.emit(isa.Load(kb.reg(), self.pa, self.off, self.mask)))
        # the 4 x 4 comparison axes: element i (axis 2) against element j (axis 3)
        self.pi = self.shaped(self.pos, (1, 1, 4, 1))
        self.pj = self.shaped(self.pos, (1, 1, 1, 4))

    def pair(self, v: str) -> tuple[str, str]:
        """``v`` (``[bm, 8, 4]``) as element i and as element j of each pair."""
        bm = self.rows
        return self.shaped(v, (bm, GROUPS, 4, 1)), self.shaped(v, (bm, GROUPS, 1, 4))

    def count(self, cond: str) -> str:
        """How many j of its group satisfy ``cond`` (``[bm, 8, 4, 4]``), per element i."""
        kb = self.kb
        n = _reg(kb.emit(isa.Reduce(kb.reg(), "sum", _reg(kb.emit(isa.Convert(kb.reg(), cond, "int32"))), -1)))
        return self.shaped(n, (self.rows, GROUPS, 4))

    def finish(self, kind: str, read: float, written: float) -> isa.Program:
        prog = self.kb.program(group_size=self.rows, kind="pointwise", registers=POINTWISE_REGISTERS,
                               shared_memory=0)
        prog.meta["estimate"] = {
            "kind": "outputs", "m": "m", "n": "k",
            "per_output": {"vector_flops": {"float32": OPS_PER_ELEMENT[kind]},
                           "bytes_read": read, "bytes_written": written}}
        return prog


def prune_program(name: str, dtype: str, rows: int) -> isa.Program:
    """Parameters ``a``, ``out`` (both ``dtype``), scalars ``m k``."""
    t = _Tile(name, dtype, rows)
    kb = t.kb
    pout = kb.param("out", "ptr", dtype)
    m_r, k_r = t.scalars("m", "k")
    t.load(m_r, k_r)
    mag = kb.unary("abs", _reg(kb.emit(isa.Convert(kb.reg(), t.x, "float32"))))
    mi, mj = t.pair(mag)
    beats = kb.binary("or", kb.binary("gt", mj, mi),
                      kb.binary("and", kb.binary("eq", mj, mi), kb.binary("lt", t.pj, t.pi)))
    keep = kb.binary("lt", t.count(beats), kb.const(2, "int32"))
    zero = kb.const(0.0, dtype)
    kb.emit(isa.Store(pout, t.off, _reg(kb.emit(isa.Where(kb.reg(), keep, t.x, zero))), t.mask))
    return t.finish("prune", ITEMSIZE[dtype], ITEMSIZE[dtype])


def check_program(name: str, dtype: str, rows: int) -> isa.Program:
    """Parameters ``a``, ``bad`` (one int64, summed into), scalars ``m k``."""
    t = _Tile(name, dtype, rows)
    kb = t.kb
    pbad = kb.param("bad", "ptr", "int64")
    m_r, k_r = t.scalars("m", "k")
    t.load(m_r, k_r)
    nz = _reg(kb.emit(isa.Convert(kb.reg(), kb.binary("ne", t.x, kb.const(0.0, dtype)), "int64")))
    per_group = _reg(kb.emit(isa.Reduce(kb.reg(), "sum", nz, -1)))            # [bm, 8, 1]
    over = _reg(kb.emit(isa.Convert(kb.reg(), kb.binary("gt", per_group, kb.const(2, "int64")), "int64")))
    zero = _reg(kb.emit(isa.Broadcast(kb.reg(), kb.const(0, "int64"), (rows, GROUPS, 1))))
    kb.emit(isa.StoreReduce(pbad, zero, over, "sum"))
    return t.finish("check", ITEMSIZE[dtype], 0)


def compress_program(name: str, dtype: str, rows: int) -> isa.Program:
    """Parameters ``a``, ``values`` (``dtype``), ``e`` (int32 metadata), scalars
    ``m k kh kw`` (``k/2`` values and ``ceil(k/32)`` words per row)."""
    t = _Tile(name, dtype, rows)
    kb = t.kb
    pv, pe = kb.param("values", "ptr", dtype), kb.param("e", "ptr", "int32")
    m_r, k_r, kh_r, kw_r = t.scalars("m", "k", "kh", "kw")
    t.load(m_r, k_r)
    nz = kb.binary("ne", t.x, kb.const(0.0, dtype))
    ni, nj = t.pair(nz)
    earlier = kb.binary("lt", t.pj, t.pi)
    # j is stored before i: a nonzero before a zero, else the earlier position
    first = kb.binary("or", kb.binary("and", nj, kb.unary("not", ni)),
                      kb.binary("and", kb.binary("eq", nj, ni), earlier))
    two = kb.const(2, "int32")
    sel = kb.binary("lt", t.count(first), two)
    _, sj = t.pair(sel)
    slot = t.count(kb.binary("and", sj, earlier))                 # 0 or 1: its place in K order
    kept = kb.binary("and", sel, t.mask)
    group32 = _reg(kb.emit(isa.Convert(kb.reg(), t.group, "int32")))
    index = kb.binary("add", kb.binary("mul", group32, two), slot)       # kept value in the word
    wide = _reg(kb.emit(isa.Convert(kb.reg(), index, "int64")))
    v_off = kb.binary("add", kb.binary("mul", t.row, kh_r),
                      kb.binary("add", kb.imul(kb.pid(0), isa.SPARSE_VALUES_PER_WORD), wide))
    kb.emit(isa.Store(pv, v_off, t.x, kept))
    pos32 = _reg(kb.emit(isa.Convert(kb.reg(), t.pos, "int32")))
    bits = kb.binary("shl", pos32, kb.binary("mul", index, two))
    bits = _reg(kb.emit(isa.Where(kb.reg(), kept, bits, kb.const(0, "int32"))))
    # the 16 kept values' fields are disjoint: their sum (in int64, wrapped back) is their OR
    bits64 = _reg(kb.emit(isa.Convert(kb.reg(), bits, "int64")))
    per_group = _reg(kb.emit(isa.Reduce(kb.reg(), "sum", bits64, -1)))            # [bm, 8, 1]
    word = _reg(kb.emit(isa.Reduce(kb.reg(), "sum", per_group, -2)))              # [bm, 1, 1]
    word32 = _reg(kb.emit(isa.Convert(kb.reg(), word, "int32")))
    e_off = kb.binary("add", kb.binary("mul", t.row, kw_r), kb.pid(0))
    kb.emit(isa.Store(pe, e_off, word32, t.row_ok))
    return t.finish("compress", ITEMSIZE[dtype], ITEMSIZE[dtype] / 2 + 4 / COLUMNS)
