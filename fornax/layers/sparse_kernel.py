"""The 2:4 structured-sparse GEMM kernel a library ships, as a tile-ISA program.

One launch (or, split-K, a launch of float32 partials per K slice and a reduction) computes::

    C = act_none(alpha * expand(A_values, A_metadata) @ B + bias)

where A is an ``m x k`` 2:4-sparse matrix in the compressed format of
:mod:`fornax.sim.sparsity` (values ``[m, k/2]`` then int32 metadata ``[m, ceil(k/32)]``),
B is ``k x n`` read through element strides (``b_rs`` between rows, ``b_cs`` between
columns: row-major, or a transposed ``n x k`` operand, without a copy) and C is written
through its own strides (row-major ``m x n``, or column-major, which stores ``C^T`` as
``F.linear`` wants it).  ``bias`` holds one element per row of A (an output feature).
Each k-step loads a ``[bm, bk/2]`` tile of kept values, the ``[bm, bk/32]`` metadata
words beside it and a dense ``[bk, bn]`` tile of B, and runs one
:class:`~fornax.sim.isa.SparseDot`: the matrix unit reads half of A and selects B's rows
by the metadata, so the product is the dense one of the pruned matrix.  The program's
``sparsity`` metadata makes the cost model price its matrix work at the chip's sparse
rate, and its estimate prices a shape-only launch the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sim import isa
from ..sim.cost import SPARSITY
from .blas import ITEMSIZE, Grid, tile_indices
from .codegen import POINTWISE_REGISTERS, KernelBuilder
from .kernel_builder import defined as _reg


@dataclass(frozen=True)
class SparseVariant:
    """What a sparse kernel is specialised on (sizes, strides and alpha are arguments)."""

    dtype: str                       # A's values and B
    out: str                         # C
    tile: tuple[int, int, int]       # (bm, bn, bk); bk a multiple of 32 (whole metadata words)
    bias: bool = False
    split: int = 1                   # split-K slices (float32 partials, then a reduction)

    def tag(self) -> str:
        bm, bn, bk = self.tile
        parts = [self.dtype, self.out, f"{bm}x{bn}x{bk}", "sp24"] + (["bias"] if self.bias else [])
        return "_".join(parts + ([f"splitk{self.split}"] if self.split > 1 else []))


def grids(v: SparseVariant, m: int, n: int) -> tuple[Grid, Grid | None]:
    """Launch grids of the main kernel ``(ceil(n/bn), ceil(m/bm), split)`` and, for split-K,
    of the reduction ``(ceil(n/bn), ceil(m/bm), 1)``."""
    bm, bn, _ = v.tile
    gx, gy = -(-n // bn), -(-m // bm)
    return (gx, gy, v.split), ((gx, gy, 1) if v.split > 1 else None)


def workspace_bytes(v: SparseVariant, m: int, n: int) -> int:
    """Bytes of float32 partials a split-K launch needs (0 in one pass)."""
    return v.split * m * n * 4 if v.split > 1 else 0


class _Gen:
    """The pieces both kernels share: scalars, the output tile's indices, the epilogue."""

    def __init__(self, name: str, v: SparseVariant):
        self.kb = KernelBuilder(name)
        self.v = v

    def scalar(self, n: str, dtype: str = "int64") -> str:
        return self.kb.scalar(n, dtype)

    def tile(self, m_r: str, n_r: str) -> tuple[str, str, str, str]:
        pid_n, pid_m = self.kb.pid(0), self.kb.pid(1)
        return tile_indices(self.kb, self.v.tile, pid_m, pid_n, m_r, n_r)

    def epilogue(self, acc: str, pc: str, pbias: str | None, rm: str, rn: str, mask_m: str,
                 mask_n: str) -> int:
        """``alpha * acc + bias`` rounded to the output dtype and stored through the strides
        ``c_rs c_cs``; returns the vector operations per output."""
        kb = self.kb
        c_rs, c_cs, alpha = self.scalar("c_rs"), self.scalar("c_cs"), self.scalar("alpha", "float32")
        start = len(kb.body)
        x = kb.binary("mul", acc, alpha)
        if pbias is not None:
            bias = _reg(kb.emit(isa.Load(kb.reg(), pbias, rm, mask_m)))
            x = kb.binary("add", x, _reg(kb.emit(isa.Convert(kb.reg(), bias, "float32"))))
        ops = sum(isinstance(i, isa.Binary) for i in kb.body[start:])
        c_off = kb.binary("add", kb.binary("mul", rm, c_rs), kb.binary("mul", rn, c_cs))
        kb.emit(isa.Store(pc, c_off, _reg(kb.emit(isa.Convert(kb.reg(), x, self.v.out))),
                          kb.binary("and", mask_m, mask_n)))
        return ops


def program(name: str, v: SparseVariant, group_size: int) -> isa.Program:
    """The main kernel.  Parameters: ``a`` (values), ``e`` (metadata), ``b``, [``bias``],
    ``c`` (the output, or the float32 partials of split-K), then the scalars ``m n k kh kw
    b_rs b_cs`` (``kh = k/2`` values and ``kw`` metadata words per row of A), ``ks`` (K per
    slice) for split-K, else ``c_rs c_cs alpha``."""
    g = _Gen(name, v)
    kb = g.kb
    bm, bn, bk = v.tile
    split = v.split > 1
    if bk % isa.SPARSE_K_PER_WORD:
        raise ValueError(f"a sparse tile's k depth must be a multiple of {isa.SPARSE_K_PER_WORD}, got {bk}")
    pa, pe = kb.param("a", "ptr", v.dtype), kb.param("e", "ptr", "int32")
    pb = kb.param("b", "ptr", v.dtype)
    pbias = kb.param("bias", "ptr", v.out) if v.bias and not split else None
    pc = kb.param("c", "ptr", "float32" if split else v.out)
    m_r, n_r, k_r, kh_r, kw_r = (g.scalar(s) for s in ("m", "n", "k", "kh", "kw"))
    b_rs, b_cs = g.scalar("b_rs"), g.scalar("b_cs")
    rm, rn, mask_m, mask_n = g.tile(m_r, n_r)
    if split:                       # slice pid_z covers K from pid_z * ks, whole metadata words
        ks = g.scalar("ks")
        k0: str | None = kb.binary("mul", kb.pid(2), ks)
        stop = ks
    else:
        k0, stop = None, k_r
    half, words = bk // 2, bk // isa.SPARSE_K_PER_WORD
    r_half = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(half), (1, half))))
    r_word = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(words), (1, words))))
    r_k = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (bk, 1))))
    acc = _reg(kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, "float32"), (bm, bn))))
    loop_start = len(kb.body)
    kvar = "%k"
    kabs = _reg(kb.iadd(kvar, k0))
    kh = kb.binary("add", r_half, kb.binary("floordiv", kabs, kb.const(2, "int64")))
    kw = kb.binary("add", r_word, kb.binary("floordiv", kabs, kb.const(isa.SPARSE_K_PER_WORD, "int64")))
    kk = kb.binary("add", r_k, kabs)
    a_off = kb.binary("add", kb.binary("mul", rm, kh_r), kh)
    e_off = kb.binary("add", kb.binary("mul", rm, kw_r), kw)
    b_off = kb.binary("add", kb.binary("mul", kk, b_rs), kb.binary("mul", rn, b_cs))
    ta = _reg(kb.emit(isa.Load(kb.reg(), pa, a_off, kb.binary("and", mask_m, kb.binary("lt", kh, kh_r)))))
    te = _reg(kb.emit(isa.Load(kb.reg(), pe, e_off, kb.binary("and", mask_m, kb.binary("lt", kw, kw_r)))))
    tb = _reg(kb.emit(isa.Load(kb.reg(), pb, b_off, kb.binary("and", kb.binary("lt", kk, k_r), mask_n))))
    kb.emit(isa.SparseDot(acc, ta, te, tb, acc, "float32"))
    body = tuple(kb.body[loop_start:])
    del kb.body[loop_start:]
    kb.body.extend(i for i in body if isinstance(i, isa.Const))      # hoist loop constants
    kb.emit(isa.Loop(kvar, 0, stop, bk, tuple(i for i in body if not isinstance(i, isa.Const))))
    isz, out_item = ITEMSIZE[v.dtype], ITEMSIZE[v.out]
    if split:                       # partials of slice s at s * m*n, row-major
        base = kb.binary("mul", kb.pid(2), kb.binary("mul", m_r, n_r))
        off = kb.binary("add", base, kb.binary("add", kb.binary("mul", rm, n_r), rn))
        kb.emit(isa.Store(pc, off, acc, kb.binary("and", mask_m, mask_n)))
        per: dict[str, object] = {"bytes_written": 4}
    else:
        ops = g.epilogue(acc, pc, pbias, rm, rn, mask_m, mask_n)
        per = {"vector_flops": {"float32": ops}, "bytes_written": out_item,
               "bytes_read": out_item / bn if v.bias else 0}
    smem = bm * half * isz + bm * words * 4 + bk * bn * isz
    prog = kb.program(group_size=group_size, kind="gemm", tile=[bm, bn, bk], shared_memory=smem,
                      registers=-(-bm * bn // group_size) + POINTWISE_REGISTERS, sparsity=SPARSITY)
    prog.meta["estimate"] = {
        "kind": "gemm", "m": "m", "n": "n", "k": "ks" if split else "k", "batch": "grid",
        "dtype": v.dtype, "tile": [bm, bn, bk], "b_batched": False, "sparse": True,
        "per_output": per}
    return prog


def reduce_program(name: str, v: SparseVariant, group_size: int) -> isa.Program:
    """The split-K reduction: adds the ``split`` float32 partials of each output in slice
    order (deterministic), then the epilogue.  Parameters ``ws``, [``bias``], ``c``, scalars
    ``m n c_rs c_cs alpha``."""
    g = _Gen(name, v)
    kb = g.kb
    pws = kb.param("ws", "ptr", "float32")
    pbias = kb.param("bias", "ptr", v.out) if v.bias else None
    pc = kb.param("c", "ptr", v.out)
    m_r, n_r = g.scalar("m"), g.scalar("n")
    rm, rn, mask_m, mask_n = g.tile(m_r, n_r)
    within = kb.binary("add", kb.binary("mul", rm, n_r), rn)
    mn = kb.binary("mul", m_r, n_r)
    mask = kb.binary("and", mask_m, mask_n)
    bm, bn, _ = v.tile
    acc = _reg(kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, "float32"), (bm, bn))))
    loop_start = len(kb.body)
    part = _reg(kb.emit(isa.Load(kb.reg(), pws, kb.binary("add", kb.binary("mul", "%s", mn), within), mask)))
    kb.emit(isa.Binary(acc, "add", acc, part))
    body = tuple(kb.body[loop_start:])
    del kb.body[loop_start:]
    kb.emit(isa.Loop("%s", 0, v.split, 1, body))
    ops = g.epilogue(acc, pc, pbias, rm, rn, mask_m, mask_n)
    out_item = ITEMSIZE[v.out]
    prog = kb.program(group_size=group_size, kind="pointwise", registers=POINTWISE_REGISTERS,
                      shared_memory=0)
    prog.meta["estimate"] = {
        "kind": "outputs", "m": "m", "n": "n",
        "per_output": {"vector_flops": {"float32": v.split + ops},
                       "bytes_read": 4 * v.split + (out_item / bn if v.bias else 0),
                       "bytes_written": out_item}}
    return prog
