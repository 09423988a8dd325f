"""The 2:4 structured-sparse GEMM kernel a library ships, as a tile-ISA program.

One launch computes::

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
from .blas import ITEMSIZE, Grid
from .codegen import POINTWISE_REGISTERS, KernelBuilder


@dataclass(frozen=True)
class SparseVariant:
    """What a sparse kernel is specialised on (sizes, strides and alpha are arguments)."""

    dtype: str                       # A's values and B
    out: str                         # C
    tile: tuple[int, int, int]       # (bm, bn, bk); bk a multiple of 32 (whole metadata words)
    bias: bool = False

    def tag(self) -> str:
        bm, bn, bk = self.tile
        return "_".join([self.dtype, self.out, f"{bm}x{bn}x{bk}", "sp24"] + (["bias"] if self.bias else []))


def grid(v: SparseVariant, m: int, n: int) -> Grid:
    """The launch grid ``(ceil(n/bn), ceil(m/bm), 1)``."""
    bm, bn, _ = v.tile
    return -(-n // bn), -(-m // bm), 1


def _reg(name: str | None) -> str:
    assert name is not None, "the instruction defines no register"
    return name


def program(name: str, v: SparseVariant, group_size: int) -> isa.Program:
    """The kernel.  Parameters: ``a`` (values), ``e`` (metadata), ``b``, [``bias``], ``c``,
    then the scalars ``m n k kh kw b_rs b_cs c_rs c_cs alpha`` (``kh = k/2`` values and
    ``kw`` metadata words per row of A)."""
    kb = KernelBuilder(name)
    bm, bn, bk = v.tile
    if bk % isa.SPARSE_K_PER_WORD:
        raise ValueError(f"a sparse tile's k depth must be a multiple of {isa.SPARSE_K_PER_WORD}, got {bk}")
    pa, pe = kb.param("a", "ptr", v.dtype), kb.param("e", "ptr", "int32")
    pb = kb.param("b", "ptr", v.dtype)
    pbias = kb.param("bias", "ptr", v.out) if v.bias else None
    pc = kb.param("c", "ptr", v.out)

    def scalar(n: str, dtype: str = "int64") -> str:
        kb.param(n, "scalar", dtype)
        return _reg(kb.emit(isa.ScalarArg(kb.reg(), n)))

    m_r, n_r, k_r, kh_r, kw_r = (scalar(s) for s in ("m", "n", "k", "kh", "kw"))
    b_rs, b_cs, c_rs, c_cs = (scalar(s) for s in ("b_rs", "b_cs", "c_rs", "c_cs"))
    alpha = scalar("alpha", "float32")
    pid_n, pid_m = kb.pid(0), kb.pid(1)
    rm = _reg(kb.emit(isa.Reshape(kb.reg(), _reg(kb.iadd(kb.imul(pid_m, bm), kb.arange(bm))), (bm, 1))))
    rn = _reg(kb.emit(isa.Reshape(kb.reg(), _reg(kb.iadd(kb.imul(pid_n, bn), kb.arange(bn))), (1, bn))))
    mask_m, mask_n = kb.binary("lt", rm, m_r), kb.binary("lt", rn, n_r)
    half, words = bk // 2, bk // isa.SPARSE_K_PER_WORD
    r_half = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(half), (1, half))))
    r_word = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(words), (1, words))))
    r_k = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (bk, 1))))
    acc = _reg(kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, "float32"), (bm, bn))))
    loop_start = len(kb.body)
    kvar = "%k"
    kh = kb.binary("add", r_half, kb.binary("floordiv", kvar, kb.const(2, "int64")))
    kw = kb.binary("add", r_word, kb.binary("floordiv", kvar, kb.const(isa.SPARSE_K_PER_WORD, "int64")))
    kk = kb.binary("add", r_k, kvar)
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
    kb.emit(isa.Loop(kvar, 0, k_r, bk, tuple(i for i in body if not isinstance(i, isa.Const))))
    start = len(kb.body)
    x = kb.binary("mul", acc, alpha)
    if pbias is not None:
        bias = _reg(kb.emit(isa.Load(kb.reg(), pbias, rm, mask_m)))
        x = kb.binary("add", x, _reg(kb.emit(isa.Convert(kb.reg(), bias, "float32"))))
    ops = sum(isinstance(i, isa.Binary) for i in kb.body[start:])
    c_off = kb.binary("add", kb.binary("mul", rm, c_rs), kb.binary("mul", rn, c_cs))
    kb.emit(isa.Store(pc, c_off, _reg(kb.emit(isa.Convert(kb.reg(), x, v.out))),
                      kb.binary("and", mask_m, mask_n)))
    isz, out_item = ITEMSIZE[v.dtype], ITEMSIZE[v.out]
    smem = bm * half * isz + bm * words * 4 + bk * bn * isz
    prog = kb.program(group_size=group_size, kind="gemm", tile=[bm, bn, bk], shared_memory=smem,
                      registers=-(-bm * bn // group_size) + POINTWISE_REGISTERS, sparsity=SPARSITY)
    prog.meta["estimate"] = {
        "kind": "gemm", "m": "m", "n": "n", "k": "k", "batch": "grid", "dtype": v.dtype,
        "tile": [bm, bn, bk], "b_batched": False, "sparse": True,
        "per_output": {"vector_flops": {"float32": ops}, "bytes_written": out_item,
                       "bytes_read": out_item / bn if v.bias else 0}}
    return prog
