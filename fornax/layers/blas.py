"""The BLAS-like GEMM a library ships, as tile-ISA programs (cuBLASLt-shaped).

One call computes, for every batch ``b``::

    D[b] = act(alpha * scale * op(A[b]) @ op(B[b]) + beta * C[b] + bias)

written over ``C`` (``D`` and ``C`` share a buffer, as in cuBLAS), where

* ``op`` is the identity or a transpose: a transposed operand is stored
  transposed (A as ``k x m``, B as ``n x k``, row-major) and read through
  transposed offsets, so nothing is copied;
* ``A``, ``B`` and ``C`` of batch ``b`` start ``b * stride`` elements into
  their buffers (strided-batched; a B stride of 0 shares one B);
* the matrix unit accumulates in float32 (float64 for float64 inputs); the
  epilogue runs in the accumulator's dtype and rounds once to the output dtype;
* ``scale`` is ``a_scale * b_scale``, the per-tensor scales of fp8 inputs;
* ``tf32`` rounds float32 tiles to TF32 (``tf32`` ISA function) before the
  multiply, which puts the product on the TF32 matrix path;
* ``act`` is ``relu``, ``gelu`` (the tanh approximation, as cuBLASLt's GELU
  epilogue) or ``silu``; ``bias`` is a length-``n`` vector in the output dtype.

A **split-K** algorithm cuts K into ``split`` slices: the main kernel writes
float32 partial sums of every slice to a workspace, and a second kernel adds
the slices in the order an ``order`` buffer gives and applies the epilogue.
The library writes ``0..split-1`` there in deterministic mode and a
per-call permutation in fast mode (see ``fornax.layers.library``).

Every kernel here is shape-generic (sizes and strides are scalar parameters)
and carries a cost estimate per launch shape, so a shape-only device prices it
and an autotuner can predict it without running it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..sim import fastpath, isa
from .codegen import POINTWISE_REGISTERS, KernelBuilder, _gelu
from .kernel_builder import defined as _reg

ACTIVATIONS = ("none", "relu", "gelu", "silu")
FP8 = ("float8_e4m3fn", "float8_e5m2")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
            "float8_e5m2": 1}
#: workspace rows are aligned like a real allocator's (the order buffer sits in front)
WORKSPACE_ALIGN = 256
#: a launch grid (x, y, z) in work-groups
Grid = tuple[int, int, int]


@dataclass(frozen=True)
class GemmVariant:
    """Everything a kernel is specialised on (sizes, strides and scalars are launch arguments)."""

    dtype: str                       # A and B
    out: str                         # C / D
    tile: tuple[int, int, int]       # effective (bm, bn, bk)
    trans_a: bool = False
    trans_b: bool = False
    beta: bool = False               # reads C
    bias: bool = False
    act: str = "none"
    tf32: bool = False
    split: int = 1
    b_batched: bool = True

    @property
    def acc(self) -> str:
        return "float64" if self.dtype == "float64" else "float32"

    @property
    def scaled(self) -> bool:
        return self.dtype in FP8

    def tag(self) -> str:
        bm, bn, bk = self.tile
        parts = [self.dtype, self.out, f"{bm}x{bn}x{bk}",
                 ("t" if self.trans_a else "n") + ("t" if self.trans_b else "n")]
        parts += [p for p, on in (("beta", self.beta), ("bias", self.bias), ("tf32", self.tf32),
                                  ("bb", self.b_batched)) if on]
        if self.act != "none":
            parts.append(self.act)
        if self.split > 1:
            parts.append(f"splitk{self.split}")
        return "_".join(parts)


def workspace_bytes(split: int, batch: int, m: int, n: int, acc: str = "float32") -> int:
    """Workspace a split-K GEMM needs: the order buffer, then the accumulator-dtype partials
    of every slice (float32; float64 for float64 inputs)."""
    if split <= 1:
        return 0
    return _order_bytes(split) + split * batch * m * n * ITEMSIZE[acc]


def _order_bytes(split: int) -> int:
    return -(-split * 8 // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def order_bytes(split: int) -> int:
    """Bytes in front of the partials (the int64 slice order, aligned)."""
    return _order_bytes(split)


def tile_indices(kb: KernelBuilder, tile: tuple[int, int, int], pid_m: str, pid_n: str, m_r: str,
                 n_r: str) -> tuple[str, str, str, str]:
    """Row and column indices of the ``bm x bn`` output tile of program ``(pid_n, pid_m)``, and
    their in-bounds masks against the sizes ``m_r`` and ``n_r`` (every tiled GEMM kernel)."""
    bm, bn, _ = tile
    rm = _reg(kb.emit(isa.Reshape(kb.reg(), _reg(kb.iadd(kb.imul(pid_m, bm), kb.arange(bm))),
                                  (bm, 1))))
    rn = _reg(kb.emit(isa.Reshape(kb.reg(), _reg(kb.iadd(kb.imul(pid_n, bn), kb.arange(bn))),
                                  (1, bn))))
    return rm, rn, kb.binary("lt", rm, m_r), kb.binary("lt", rn, n_r)


class _Gen:
    """Emits one kernel's common pieces: sizes, tile indices, the epilogue."""

    def __init__(self, name: str, v: GemmVariant):
        self.kb = KernelBuilder(name)
        self.v = v

    def scalar(self, name: str, dtype: str) -> str:
        return self.kb.scalar(name, dtype)

    def tiles(self, pid_m: str, pid_n: str, m_r: str, n_r: str) -> tuple[str, str, str, str]:
        return tile_indices(self.kb, self.v.tile, pid_m, pid_n, m_r, n_r)

    def epilogue(self, acc: str, pc: str, pbias: str | None, c_base: str | None, rm: str, rn: str,
                 n_r: str, mask_n: str, out_mask: str, alpha: str, beta: str | None,
                 scale: str | None) -> int:
        """Scale, alpha, beta * C, bias, activation, round, store; returns the ops per output."""
        kb, v, dt = self.kb, self.v, self.v.acc
        start = len(kb.body)
        x = acc
        if scale is not None:
            x = kb.binary("mul", x, scale)
        x = kb.binary("mul", x, alpha)
        c_off = _reg(kb.iadd(c_base, kb.binary("add", kb.binary("mul", rm, n_r), rn)))
        if beta is not None:
            old = _reg(kb.emit(isa.Load(kb.reg(), pc, c_off, out_mask)))
            x = kb.binary("add", x, kb.binary("mul", _reg(kb.emit(isa.Convert(kb.reg(), old, dt))), beta))
        if pbias is not None:
            bias = _reg(kb.emit(isa.Load(kb.reg(), pbias, rn, mask_n)))
            x = kb.binary("add", x, _reg(kb.emit(isa.Convert(kb.reg(), bias, dt))))
        if v.act == "relu":
            x = kb.unary("relu", x)
        elif v.act == "gelu":
            x = _gelu(kb, x, dt, "tanh")
        elif v.act == "silu":
            x = kb.binary("mul", x, kb.unary("sigmoid", x))
        kb.emit(isa.Store(pc, c_off, _reg(kb.emit(isa.Convert(kb.reg(), x, v.out))), out_mask))
        return sum(isinstance(i, (isa.Unary, isa.Binary)) for i in kb.body[start:])

    def meta(self, group_size: int, smem: int) -> dict[str, object]:
        bm, bn, bk = self.v.tile
        acc_words = 2 if self.v.acc == "float64" else 1
        return dict(group_size=group_size, kind="gemm", tile=[bm, bn, bk], shared_memory=smem,
                    registers=-(-bm * bn * acc_words // group_size) + POINTWISE_REGISTERS)


def _fast(kind: str, v: GemmVariant) -> dict[str, object]:
    """What the simulator's fast path (:mod:`fornax.sim.fastpath`) needs to run the kernel
    as whole-operand numpy calls instead of its tape."""
    return fastpath.describe(kind, acc=v.acc, tile=list(v.tile), split=v.split, trans_a=v.trans_a,
                             trans_b=v.trans_b, beta=v.beta, bias=v.bias, act=v.act, tf32=v.tf32,
                             scaled=v.scaled)


def gemm_program(name: str, v: GemmVariant, group_size: int) -> isa.Program:
    """The main kernel: grid ``(ceil(n/bn), ceil(m/bm), batch * split)``.

    Parameters: ``a``, ``b``, [``bias``], ``c`` (the output, or the float32
    partials of a split-K algorithm), then the scalars ``m n k sa sb sc``,
    ``alpha`` [``beta``] [``scale``] and, for split-K, ``ks`` (K per slice).
    """
    g = _Gen(name, v)
    kb = g.kb
    bm, bn, bk = v.tile
    split = v.split > 1
    pa, pb = kb.param("a", "ptr", v.dtype), kb.param("b", "ptr", v.dtype)
    pbias = kb.param("bias", "ptr", v.out) if v.bias and not split else None
    pc = kb.param("c", "ptr", v.acc if split else v.out)
    m_r, n_r, k_r = g.scalar("m", "int64"), g.scalar("n", "int64"), g.scalar("k", "int64")
    sa, sb, sc = g.scalar("sa", "int64"), g.scalar("sb", "int64"), g.scalar("sc", "int64")
    alpha = beta = scale = None
    if not split:
        alpha = g.scalar("alpha", v.acc)
        beta = g.scalar("beta", v.acc) if v.beta else None
        scale = g.scalar("scale", v.acc) if v.scaled else None
    pid_n, pid_m, pid_z = kb.pid(0), kb.pid(1), kb.pid(2)
    if split:
        ks = g.scalar("ks", "int64")
        s_const = kb.const(v.split, "int64")
        batch_id = kb.binary("floordiv", pid_z, s_const)
        k0 = kb.binary("mul", kb.binary("mod", pid_z, s_const), ks)
        kend = kb.binary("min", k_r, kb.binary("add", k0, ks))
        stop = ks
    else:
        batch_id, k0, kend, stop = pid_z, None, k_r, k_r
    rm, rn, mask_m, mask_n = g.tiles(pid_m, pid_n, m_r, n_r)
    rk_row = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (1, bk))))
    rk_col = _reg(kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (bk, 1))))
    a_base = kb.binary("mul", batch_id, sa)
    b_base = kb.binary("mul", batch_id, sb)
    acc = _reg(kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, v.acc), (bm, bn))))
    loop_start = len(kb.body)
    kvar = "%k"
    kk = _reg(kb.iadd(kvar, k0))
    ka = kb.binary("add", rk_row, kk)            # (1, bk): K index of A's columns
    kbv = kb.binary("add", rk_col, kk)           # (bk, 1): K index of B's rows
    if v.trans_a:                                # A stored k x m
        a_off = kb.binary("add", kb.binary("mul", ka, m_r), rm)
    else:
        a_off = kb.binary("add", kb.binary("mul", rm, k_r), ka)
    if v.trans_b:                                # B stored n x k
        b_off = kb.binary("add", kb.binary("mul", rn, k_r), kbv)
    else:
        b_off = kb.binary("add", kb.binary("mul", kbv, n_r), rn)
    a_mask = kb.binary("and", mask_m, kb.binary("lt", ka, kend))
    b_mask = kb.binary("and", kb.binary("lt", kbv, kend), mask_n)
    ta = _reg(kb.emit(isa.Load(kb.reg(), pa, kb.binary("add", a_base, a_off), a_mask)))
    tb = _reg(kb.emit(isa.Load(kb.reg(), pb, kb.binary("add", b_base, b_off), b_mask)))
    if v.tf32:
        ta, tb = kb.unary("tf32", ta), kb.unary("tf32", tb)
    kb.emit(isa.Dot(acc, ta, tb, acc, v.acc))
    body = tuple(kb.body[loop_start:])
    del kb.body[loop_start:]
    kb.body.extend(i for i in body if isinstance(i, isa.Const))      # hoist loop constants
    kb.emit(isa.Loop(kvar, 0, stop, bk, tuple(i for i in body if not isinstance(i, isa.Const))))
    out_mask = kb.binary("and", mask_m, mask_n)
    out_item = ITEMSIZE[v.out]
    if split:
        # partials of slice s of batch b at ((b * split + s) * m*n): pid_z is b * split + s
        base = kb.binary("mul", pid_z, kb.binary("mul", m_r, n_r))
        off = kb.binary("add", base, kb.binary("add", kb.binary("mul", rm, n_r), rn))
        kb.emit(isa.Store(pc, off, acc, out_mask))
        per: dict[str, object] = {"bytes_written": ITEMSIZE[v.acc]}
    else:
        ops = g.epilogue(acc, pc, pbias, kb.binary("mul", batch_id, sc), rm, rn, n_r, mask_n,
                         out_mask, _reg(alpha), beta, scale)
        per = {"vector_flops": {v.acc: ops}, "bytes_written": out_item,
               "bytes_read": (out_item if v.beta else 0) + (out_item / bm if v.bias else 0)}
    program = kb.program(**g.meta(group_size, (bm * bk + bk * bn) * ITEMSIZE[v.dtype]))
    program.meta["fast"] = _fast("gemm", v)
    program.meta["estimate"] = {
        "kind": "gemm", "m": "m", "n": "n", "k": "ks" if split else "k", "batch": "grid",
        "dtype": "tfloat32" if v.tf32 else v.dtype, "tile": [bm, bn, bk],
        "b_batched": v.b_batched, "per_output": per}
    return program


def reduce_program(name: str, v: GemmVariant, group_size: int) -> isa.Program:
    """The split-K reduction: grid ``(ceil(n/bn), ceil(m/bm), batch)``.

    Adds the ``split`` partials of each output in the order the
    ``order`` buffer lists the slices, then runs the epilogue.  Parameters:
    ``ws`` (partials), ``order`` (int64 slice indices), [``bias``], ``c``, then
    ``m n sc alpha`` [``beta``] [``scale``].
    """
    g = _Gen(name, v)
    kb = g.kb
    bm, bn, _ = v.tile
    pws, porder = kb.param("ws", "ptr", v.acc), kb.param("order", "ptr", "int64")
    pbias = kb.param("bias", "ptr", v.out) if v.bias else None
    pc = kb.param("c", "ptr", v.out)
    m_r, n_r, sc = g.scalar("m", "int64"), g.scalar("n", "int64"), g.scalar("sc", "int64")
    alpha = g.scalar("alpha", v.acc)
    beta = g.scalar("beta", v.acc) if v.beta else None
    scale = g.scalar("scale", v.acc) if v.scaled else None
    pid_n, pid_m, pid_b = kb.pid(0), kb.pid(1), kb.pid(2)
    rm, rn, mask_m, mask_n = g.tiles(pid_m, pid_n, m_r, n_r)
    out_mask = kb.binary("and", mask_m, mask_n)
    mn = kb.binary("mul", m_r, n_r)
    within = kb.binary("add", kb.binary("mul", rm, n_r), rn)
    first = kb.binary("mul", pid_b, kb.const(v.split, "int64"))
    acc = _reg(kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, v.acc), (bm, bn))))
    loop_start = len(kb.body)
    slot = _reg(kb.emit(isa.Load(kb.reg(), porder, "%s", None)))            # which slice comes next
    off = kb.binary("add", kb.binary("mul", kb.binary("add", first, slot), mn), within)
    part = _reg(kb.emit(isa.Load(kb.reg(), pws, off, out_mask)))
    kb.emit(isa.Binary(acc, "add", acc, part))
    body = tuple(kb.body[loop_start:])
    del kb.body[loop_start:]
    kb.emit(isa.Loop("%s", 0, v.split, 1, body))
    ops = g.epilogue(acc, pc, pbias, kb.binary("mul", pid_b, sc), rm, rn, n_r, mask_n, out_mask,
                     alpha, beta, scale)
    out_item = ITEMSIZE[v.out]
    program = kb.program(group_size=group_size, kind="pointwise", registers=POINTWISE_REGISTERS,
                         shared_memory=0)
    program.meta["fast"] = _fast("gemm_reduce", v)
    program.meta["estimate"] = {
        "kind": "outputs", "m": "m", "n": "n",
        "per_output": {"vector_flops": {v.acc: v.split + ops},
                       "bytes_read": ITEMSIZE[v.acc] * v.split + (out_item if v.beta else 0),
                       "bytes_written": out_item, "bytes_read_per_instance": 8 * v.split}}
    return program


def grids(v: GemmVariant, m: int, n: int, batch: int) -> tuple[Grid, Grid | None]:
    """Launch grids of the main kernel and (split-K) the reduction."""
    bm, bn, _ = v.tile
    gx, gy = math.ceil(n / bn), math.ceil(m / bm)
    if v.split > 1:
        return (gx, gy, batch * v.split), (gx, gy, batch)
    return (gx, gy, batch), None
