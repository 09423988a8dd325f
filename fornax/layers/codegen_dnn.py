"""Kernel generators for the DNN-like library routines (:mod:`fornax.layers.dnn`).

Every kernel here is specialised for one problem geometry (sizes baked in as
constants), like the runtime-compiled engines of real DNN libraries, and
accumulates in float32 whatever its storage dtype:

* **implicit GEMM convolution** (:func:`conv2d_kernel`): forward, backward
  data and backward weights as one tiled GEMM each, the operand tiles
  gathered straight from the NCHW tensors by computed offsets (padding,
  stride and dilation are masks), groups on grid axis 2;
* **flash attention** (:func:`attention_fwd_kernel`,
  :func:`attention_bwd_kernel`): one kernel per pass.  The forward loops over
  K/V tiles keeping the running row max and sum in registers (online
  softmax) and saves the log-sum-exp; the backward gives each program
  instance one K/V tile, loops over the query tiles recomputing the
  probabilities from the log-sum-exp, keeps dK and dV in registers and adds
  dQ into memory with the ISA's deterministic ``store_reduce``;
* **row kernels** (:func:`norm_fwd_kernel`, :func:`norm_bwd_kernel`,
  :func:`softmax_kernel`): one program instance per row, the row in one tile;
  the weight gradients of the norms are column sums over rows, added with
  ``store_reduce``;
* **pooling** (:func:`pool2d_fwd_kernel`, :func:`pool2d_bwd_kernel`): one lane
  per output (forward) or input (backward) element, a loop over the window;
* :func:`fill_kernel`: sets a buffer to a constant (the zeroing that must
  precede a ``store_reduce``).

Every kernel carries a cost estimate (``meta["estimate"]``) so a shape-only
device prices it without running it.  The estimate holds what the executor
counts, exactly: instances, matrix and vector FLOPs per dtype (index arithmetic
included; these follow from tile shapes and trip counts alone, see
:func:`~fornax.layers.kernel_estimate.static_counters`), and bytes read and written and
each buffer's footprint, which depend on the masks and so are counted here from
the geometry (padding, stride and dilation taps of convolution and pooling,
ragged edge tiles, the ``store_reduce`` flush that reads and writes each
destination once).  Masks only ever switch memory lanes off, never
arithmetic: a causal or padded tile is computed in full, as the executor
does, so no figure is approximate.  Kernels generic over one grid axis (the
batch*heads of attention, the rows of the row kernels) give their counts for
one slice plus the growth per further slice (``per_slice``); the fill kernel,
generic over its length, gives its work per element and per instance.  The
traffic bookkeeping and the estimate builders are in :mod:`fornax.layers.dnn_traffic`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, overload

from ..sim import isa
from .dnn_traffic import Traffic, attach, attach_sliced, counts, pull, span4, window
from .kernel_builder import POINTWISE_REGISTERS, Grid, KernelBuilder, next_pow2

NEG_BIG = -1.0e30          # "minus infinity" of masked scores; exp(NEG_BIG - m) is exactly 0

#: a problem's geometry as :mod:`fornax.layers.dnn` describes it: sizes (ints) and per-axis
#: (stride, padding, dilation, kernel) pairs, keyed by name; the ``*_geometry`` functions add
#: the derived sizes
Geometry = dict[str, Any]


def _acc(dt: str) -> str:
    """The accumulation dtype for storage dtype ``dt``."""
    return "float64" if dt == "float64" else "float32"


def _loop(kb: KernelBuilder, var: str, start: int, stop: int, step: int, start_at: int) -> None:
    """Close the instructions emitted since ``start_at`` into a loop (constants hoisted)."""
    body = tuple(kb.body[start_at:])
    del kb.body[start_at:]
    kb.body.extend(i for i in body if isinstance(i, isa.Const))
    kb.emit(isa.Loop(var, start, stop, step, tuple(i for i in body if not isinstance(i, isa.Const))))


def _split(kb: KernelBuilder, flat: str, dims: tuple[int, ...]) -> list[str]:
    """Coordinates of a row-major flat index over ``dims``."""
    out, stride = [], math.prod(dims)
    for i, d in enumerate(dims):
        stride //= d
        q = kb.binary("floordiv", flat, kb.const(stride, "int64")) if stride > 1 else flat
        out.append(kb.binary("mod", q, kb.const(d, "int64")) if i > 0 else q)
    return out


@overload
def _and(kb: KernelBuilder, first: str, /, *masks: str | None) -> str: ...


@overload
def _and(kb: KernelBuilder, *masks: str | None) -> str | None: ...


def _and(kb: KernelBuilder, *masks: str | None) -> str | None:
    """The conjunction of the masks given (None ones skipped); None when none is."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else kb.binary("and", out, m)
    return out


def _lt(kb: KernelBuilder, reg: str, n: int) -> str:
    """``reg < n``."""
    return kb.binary("lt", reg, kb.const(n, "int64"))


def _in_range(kb: KernelBuilder, reg: str, n: int) -> str:
    """``0 <= reg < n``."""
    return kb.binary("and", kb.binary("ge", reg, kb.const(0, "int64")), _lt(kb, reg, n))


def _lin(kb: KernelBuilder, terms: list[tuple[str | None, int]], base: str | None = None) -> str:
    """``base + sum(reg * k)`` in int64 (terms with a None register are skipped)."""
    out = base
    for reg, k in terms:
        if reg is not None:
            out = kb.iadd(out, kb.imul(reg, k))
    return out if out is not None else kb.const(0, "int64")


def _meta(group_size: int, kind: str, shared: int, acc_words: int, **extra: object) -> dict[str, object]:
    """Launch metadata: group size, kind, shared memory and per-lane registers (accumulator
    words spread over the group plus addressing)."""
    return dict(group_size=group_size, kind=kind, shared_memory=int(shared),
                registers=-(-acc_words // group_size) + POINTWISE_REGISTERS, **extra)


# ---- convolution -------------------------------------------------------------------------------
def conv_geometry(p: Mapping[str, Any]) -> Geometry:
    """Sizes of a 2-D convolution: ``p`` has n, c, h, w, k, r, s, stride, padding, dilation, groups."""
    (sh, sw), (ph, pw), (dh, dw) = p["stride"], p["padding"], p["dilation"]
    out_h = (p["h"] + 2 * ph - dh * (p["r"] - 1) - 1) // sh + 1
    out_w = (p["w"] + 2 * pw - dw * (p["s"] - 1) - 1) // sw + 1
    return dict(p, p_out=out_h, q_out=out_w, cg=p["c"] // p["groups"], kg=p["k"] // p["groups"])


def conv_gemm_shape(pass_: str, g: Mapping[str, Any]) -> tuple[int, int, int]:
    """(M, N, K) of the implicit GEMM each pass computes, per group."""
    rs, pq = g["r"] * g["s"], g["p_out"] * g["q_out"]
    if pass_ == "fwd":
        return g["n"] * pq, g["kg"], g["cg"] * rs
    if pass_ == "bwd_data":
        return g["n"] * g["h"] * g["w"], g["cg"], g["kg"] * rs
    return g["kg"], g["cg"] * rs, g["n"] * pq                           # bwd_weights


def conv2d_kernel(name: str, pass_: str, dtype: str, g: Mapping[str, Any], tile: tuple[int, int, int],
                  group_size: int) -> tuple[isa.Program, Grid]:
    """Implicit-GEMM convolution pass ``fwd`` (x, w -> y), ``bwd_data`` (dy, w -> dx) or
    ``bwd_weights`` (x, dy -> dw); returns the program and its grid."""
    M, N, K = conv_gemm_shape(pass_, g)
    bm, bn, bk = (min(t, next_pow2(v)) for t, v in zip(tile, (M, N, K)))
    kb = KernelBuilder(name)
    acc_dt = _acc(dtype)
    H, W, C, Kc, R, S = g["h"], g["w"], g["c"], g["k"], g["r"], g["s"]
    P, Q, Cg, Kg = g["p_out"], g["q_out"], g["cg"], g["kg"]
    (sh, sw), (ph, pw), (dh, dw) = g["stride"], g["padding"], g["dilation"]
    names = {"fwd": ("x", "w", "y"), "bwd_data": ("dy", "w", "dx"), "bwd_weights": ("x", "dy", "dw")}
    pa, pb, pc = (kb.param(n, "ptr", dtype) for n in names[pass_])
    if pass_ == "bwd_weights":
        pa, pb = pb, pa                         # the GEMM's A is dy, its B the gathered x
    pid_n, pid_m, grp = kb.pid(0), kb.pid(1), kb.pid(2)
    rm = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(pid_m, bm), kb.arange(bm)), (bm, 1)))
    rn = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(pid_n, bn), kb.arange(bn)), (1, bn)))
    rk_row = kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (1, bk)))
    rk_col = kb.emit(isa.Reshape(kb.reg(), kb.arange(bk), (bk, 1)))
    mask_m, mask_n = _lt(kb, rm, M), _lt(kb, rn, N)
    xs = (C * H * W, H * W, W)                  # strides of x / dx (n, c, h)
    ys = (Kc * P * Q, P * Q, Q)                 # strides of y / dy (n, k, p)
    c0 = kb.imul(grp, Cg)                       # first channel of this group
    k0 = kb.imul(grp, Kg)                       # first output channel of this group

    def x_at(n: str, c: str, oh: str, ow: str, r: str, s: str) -> tuple[str, str]:
        """Offset and validity of x[n, c0 + c, oh*sh - ph + r*dh, ow*sw - pw + s*dw]."""
        hh = kb.binary("sub", _lin(kb, [(oh, sh), (r, dh)]), kb.const(ph, "int64"))
        ww = kb.binary("sub", _lin(kb, [(ow, sw), (s, dw)]), kb.const(pw, "int64"))
        ok = kb.binary("and", _in_range(kb, hh, H), _in_range(kb, ww, W))
        return _lin(kb, [(n, xs[0]), (kb.iadd(c0, c), xs[1]), (hh, xs[2]), (ww, 1)]), ok

    # rows (outside the loop)
    if pass_ == "fwd":
        n_, oh, ow = _split(kb, rm, (g["n"], P, Q))
    elif pass_ == "bwd_data":
        n_, ih, iw = _split(kb, rm, (g["n"], H, W))
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, acc_dt), (bm, bn)))
    start = len(kb.body)
    kvar = "%k"
    ka = kb.binary("add", rk_row, kvar)         # reduction index along A's columns [1, bk]
    kbv = kb.binary("add", rk_col, kvar)        # reduction index along B's rows [bk, 1]
    if pass_ == "fwd":
        c, r, s = _split(kb, ka, (Cg, R, S))
        a_off, ok = x_at(n_, c, oh, ow, r, s)
        a_mask = _and(kb, mask_m, _lt(kb, ka, K), ok)
        b_off = _lin(kb, [(kb.iadd(k0, rn), Cg * R * S), (kbv, 1)])
        b_mask = _and(kb, _lt(kb, kbv, K), mask_n)
    elif pass_ == "bwd_data":
        k, r, s = _split(kb, ka, (Kg, R, S))
        th = kb.binary("sub", kb.iadd(ih, kb.const(ph, "int64")), kb.imul(r, dh))
        tw = kb.binary("sub", kb.iadd(iw, kb.const(pw, "int64")), kb.imul(s, dw))
        ok = None
        coords = []
        for t, st, lim in ((th, sh, P), (tw, sw, Q)):
            o = kb.binary("floordiv", t, kb.const(st, "int64")) if st > 1 else t
            hit = _in_range(kb, o, lim)
            if st > 1:
                hit = kb.binary("and", hit, kb.binary("eq", kb.binary("mod", t, kb.const(st, "int64")),
                                                      kb.const(0, "int64")))
            ok = _and(kb, ok, kb.binary("and", hit, kb.binary("ge", t, kb.const(0, "int64"))))
            coords.append(o)
        a_off = _lin(kb, [(n_, ys[0]), (kb.iadd(k0, k), ys[1]), (coords[0], ys[2]), (coords[1], 1)])
        a_mask = _and(kb, mask_m, _lt(kb, ka, K), ok)
        kk, rs = _split(kb, kbv, (Kg, R * S))
        b_off = _lin(kb, [(kb.iadd(k0, kk), Cg * R * S), (rn, R * S), (rs, 1)])
        b_mask = _and(kb, _lt(kb, kbv, K), mask_n)
    else:
        n_, oh, ow = _split(kb, ka, (g["n"], P, Q))
        a_off = _lin(kb, [(n_, ys[0]), (kb.iadd(k0, rm), ys[1]), (oh, ys[2]), (ow, 1)])
        a_mask = _and(kb, mask_m, _lt(kb, ka, K))
        nb, ohb, owb = _split(kb, kbv, (g["n"], P, Q))
        c, r, s = _split(kb, rn, (Cg, R, S))
        b_off, ok = x_at(nb, c, ohb, owb, r, s)
        b_mask = _and(kb, _lt(kb, kbv, K), mask_n, ok)
    ta = kb.emit(isa.Load(kb.reg(), pa, a_off, a_mask))
    tb = kb.emit(isa.Load(kb.reg(), pb, b_off, b_mask))
    kb.emit(isa.Dot(acc, ta, tb, acc, acc_dt))
    _loop(kb, kvar, 0, K, bk, start)
    out = kb.emit(isa.Convert(kb.reg(), acc, dtype))
    if pass_ == "fwd":
        c_off = _lin(kb, [(n_, ys[0]), (kb.iadd(k0, rn), ys[1]), (oh, ys[2]), (ow, 1)])
    elif pass_ == "bwd_data":
        c_off = _lin(kb, [(n_, xs[0]), (kb.iadd(c0, rn), xs[1]), (ih, xs[2]), (iw, 1)])
    else:
        c_off = _lin(kb, [(kb.iadd(k0, rm), Cg * R * S), (rn, 1)])
    kb.emit(isa.Store(pc, c_off, out, kb.binary("and", mask_m, mask_n)))
    item = isa.np_dtype(dtype).itemsize
    program = kb.program(**_meta(group_size, "conv2d", (bm * bk + bk * bn) * item, bm * bn,
                                 tile=[bm, bn, bk], conv_pass=pass_))
    grid: Grid = (math.ceil(N / bn), math.ceil(M / bm), g["groups"])
    return attach(program, grid, _conv_traffic(pass_, g, item, grid, M, N, K)), grid


def _conv_traffic(pass_: str, g: Mapping[str, Any], item: int, grid: Grid, M: int, N: int,
                  K: int) -> Traffic:
    """Loads and stores of a convolution pass.  Each (row, reduction) element of A is loaded
    once per column tile and each (reduction, column) element of B once per row tile, when its
    mask is on: always for the filter and dy (forward), and for x only where the padded,
    strided, dilated tap lands inside the image (a product over the two spatial axes)."""
    gx, gy, G = grid
    nb, C, H, W, Kc = g["n"], g["c"], g["h"], g["w"], g["k"]
    P, Q, Cg, Kg, R, S = g["p_out"], g["q_out"], g["cg"], g["kg"], g["r"], g["s"]
    (sh, sw), (ph, pw), (dh, dw) = g["stride"], g["padding"], g["dilation"]
    x_dims, y_dims = (nb, C, H, W), (nb, Kc, P, Q)
    x_all, y_all, w_all = nb * C * H * W * item, nb * Kc * P * Q * item, Kc * Cg * R * S * item
    t = Traffic()
    if pass_ in ("fwd", "bwd_weights"):
        vh, vw = window(P, R, sh, ph, dh, H), window(Q, S, sw, pw, dw, W)
        x_span = span4(x_dims, item, vh, vw)
        x_lanes = nb * Cg * vh[0] * vw[0] * G            # valid (row, k) pairs over all groups
    if pass_ == "fwd":
        t.load("x", gx * x_lanes, item, x_span)
        t.load("w", gy * G * K * N, item, [0, w_all])
        t.store("y", G * M * N, item, [0, y_all])
    elif pass_ == "bwd_data":
        uh, uw = pull(H, R, sh, ph, dh, P), pull(W, S, sw, pw, dw, Q)
        t.load("dy", gx * nb * Kg * uh[0] * uw[0] * G, item, span4(y_dims, item, uh, uw))
        t.load("w", gy * G * K * N, item, [0, w_all])
        t.store("dx", G * M * N, item, [0, x_all])
    else:
        t.load("dy", gx * G * M * K, item, [0, y_all])
        t.load("x", gy * x_lanes, item, x_span)
        t.store("dw", G * M * N, item, [0, w_all])
    return t


# ---- attention ---------------------------------------------------------------------------------
def attention_shared_bytes(bm: int, bn: int, d: int, itemsize: int, backward: bool = False) -> int:
    """Shared memory a flash kernel's tiles take: Q + K + V (forward) or K, V, Q, dO (backward)."""
    return ((bm + 2 * bn) * d if not backward else (2 * bm + 2 * bn) * d) * itemsize


def _tile_offsets(kb: KernelBuilder, base: str, rows: str, d: int, rows_first: bool) -> str:
    """Offsets of a [rows, d] (or transposed [d, rows]) tile of a row-major [*, d] matrix."""
    dcol = kb.emit(isa.Reshape(kb.reg(), kb.arange(d), (1, d) if rows_first else (d, 1)))
    return kb.binary("add", base, kb.binary("add", kb.imul(rows, d), dcol))


def attention_fwd_kernel(name: str, dtype: str, sq: int, sk: int, d: int, causal: bool, scale: float,
                         tile: tuple[int, int], group_size: int) -> tuple[isa.Program, tuple[int, int]]:
    """O = softmax(scale * Q K^T [+ causal mask]) V and LSE per row, for q, k, v of [BH, S, d].

    Grid: (query tiles, batch*heads, 1).  One loop over the K/V tiles keeps the running max
    ``m``, the running sum ``l`` and the output accumulator in registers."""
    bm, bn = min(tile[0], next_pow2(sq)), min(tile[1], next_pow2(sk))
    kb = KernelBuilder(name)
    f32 = "float32"
    pq, pk, pv, po = (kb.param(n, "ptr", dtype) for n in ("q", "k", "v", "o"))
    plse = kb.param("lse", "ptr", f32)
    qt, bh = kb.pid(0), kb.pid(1)
    rows_c = kb.iadd(kb.imul(qt, bm), kb.arange(bm))
    rows = kb.emit(isa.Reshape(kb.reg(), rows_c, (bm, 1)))
    row_ok = _lt(kb, rows, sq)
    q = kb.emit(isa.Load(kb.reg(), pq, _tile_offsets(kb, kb.imul(bh, sq * d), rows, d, True), row_ok))
    kbase, lbase = kb.imul(bh, sk * d), kb.imul(bh, sq)
    m = kb.emit(isa.Broadcast(kb.reg(), kb.const(NEG_BIG, f32), (bm, 1)))
    lsum = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bm, 1)))
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bm, d)))
    kvar = "%kv"
    start = len(kb.body)
    cols = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.arange(bn), kvar), (1, bn)))
    col_ok = _lt(kb, cols, sk)
    colv = kb.emit(isa.Reshape(kb.reg(), cols, (bn, 1)))
    kt = kb.emit(isa.Load(kb.reg(), pk, _tile_offsets(kb, kbase, cols, d, False),
                          kb.emit(isa.Reshape(kb.reg(), col_ok, (1, bn)))))
    s = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bm, bn)))
    s = kb.emit(isa.Dot(kb.reg(), q, kt, s, f32))
    s = kb.binary("mul", s, kb.const(float(scale), f32))
    ok = col_ok if not causal else kb.binary("and", col_ok, kb.binary("le", cols, rows))
    s = kb.emit(isa.Where(kb.reg(), ok, s, kb.const(NEG_BIG, f32)))
    m_new = kb.binary("max", m, kb.emit(isa.Reduce(kb.reg(), "max", s, -1)))
    p = kb.unary("exp", kb.binary("sub", s, m_new))
    alpha = kb.unary("exp", kb.binary("sub", m, m_new))
    kb.emit(isa.Binary(lsum, "add", kb.binary("mul", lsum, alpha), kb.emit(isa.Reduce(kb.reg(), "sum", p, -1))))
    vt = kb.emit(isa.Load(kb.reg(), pv, _tile_offsets(kb, kbase, colv, d, True), _lt(kb, colv, sk)))
    pv_ = kb.emit(isa.Convert(kb.reg(), p, dtype))
    kb.emit(isa.Dot(acc, pv_, vt, kb.binary("mul", acc, alpha), f32))
    kb.emit(isa.Unary(m, "neg", kb.unary("neg", m_new)))        # m = m_new (a register copy)
    _loop(kb, kvar, 0, sk, bn, start)
    o = kb.emit(isa.Convert(kb.reg(), kb.binary("div", acc, lsum), dtype))
    kb.emit(isa.Store(po, _tile_offsets(kb, kb.imul(bh, sq * d), rows, d, True), o, row_ok))
    lse = kb.binary("add", m, kb.unary("log", lsum))
    kb.emit(isa.Store(plse, kb.binary("add", lbase, rows), lse, row_ok))
    item = isa.np_dtype(dtype).itemsize
    program = kb.program(**_meta(group_size, "attention", attention_shared_bytes(bm, bn, d, item),
                                 bm * d + bm * bn, tile=[bm, bn], head_dim=d, causal=causal))
    gq = math.ceil(sq / bm)

    def traffic(bh: int) -> Traffic:
        """Q, O and LSE rows once; every instance walks all of K and V (a causal mask zeroes
        probabilities, it skips no tile)."""
        t, qs, ks = Traffic(), bh * sq * d, bh * sk * d
        t.load("q", qs, item, [0, qs * item])
        for p in ("k", "v"):
            t.load(p, gq * ks, item, [0, ks * item])
        t.store("o", qs, item, [0, qs * item])
        t.store("lse", bh * sq, 4, [0, bh * sq * 4])
        return t

    return attach_sliced(program, 1, lambda bh: (gq, bh, 1), traffic), (bm, bn)


def attention_bwd_kernel(name: str, dtype: str, sq: int, sk: int, d: int, causal: bool, scale: float,
                         tile: tuple[int, int], group_size: int) -> tuple[isa.Program, tuple[int, int]]:
    """dQ, dK, dV of flash attention from q, k, v, o, dO and the saved LSE.

    Grid: (K/V tiles, batch*heads, 1).  Each instance holds its K and V tile and the dK, dV
    accumulators; a loop over query tiles recomputes P^T = exp(scale * K Q^T - LSE) and
    adds dQ^T = scale * K^T dS^T into dq with ``store_reduce`` (dq must start zeroed).
    Everything is computed transposed ([keys, queries]) so every product is a plain Dot."""
    bm, bn = min(tile[0], next_pow2(sq)), min(tile[1], next_pow2(sk))
    kb = KernelBuilder(name)
    f32 = "float32"
    pq, pk, pv, po, pdo = (kb.param(n, "ptr", dtype) for n in ("q", "k", "v", "o", "do"))
    plse = kb.param("lse", "ptr", f32)
    pdq, pdk, pdv = (kb.param(n, "ptr", dtype) for n in ("dq", "dk", "dv"))
    kt_i, bh = kb.pid(0), kb.pid(1)
    keys = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(kt_i, bn), kb.arange(bn)), (bn, 1)))
    key_ok = _lt(kb, keys, sk)
    keys_row = kb.emit(isa.Reshape(kb.reg(), keys, (1, bn)))
    qbase, kbase, lbase = kb.imul(bh, sq * d), kb.imul(bh, sk * d), kb.imul(bh, sq)
    koff = _tile_offsets(kb, kbase, keys, d, True)
    k_t = kb.emit(isa.Load(kb.reg(), pk, koff, key_ok))                              # [bn, d]
    k_tt = kb.emit(isa.Load(kb.reg(), pk, _tile_offsets(kb, kbase, keys_row, d, False),
                            _lt(kb, keys_row, sk)))                                 # [d, bn]
    v_t = kb.emit(isa.Load(kb.reg(), pv, koff, key_ok))                              # [bn, d]
    dk = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bn, d)))
    dv = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bn, d)))
    sc = kb.const(float(scale), f32)
    qvar = "%qt"
    start = len(kb.body)
    qrow = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.arange(bm), qvar), (1, bm)))      # [1, bm]
    qcol = kb.emit(isa.Reshape(kb.reg(), qrow, (bm, 1)))                              # [bm, 1]
    q_ok_row, q_ok_col = _lt(kb, qrow, sq), _lt(kb, qcol, sq)
    q_tt = kb.emit(isa.Load(kb.reg(), pq, _tile_offsets(kb, qbase, qrow, d, False), q_ok_row))  # [d, bm]
    qoff = _tile_offsets(kb, qbase, qcol, d, True)
    q_t = kb.emit(isa.Load(kb.reg(), pq, qoff, q_ok_col))                            # [bm, d]
    do_t = kb.emit(isa.Load(kb.reg(), pdo, qoff, q_ok_col))                          # [bm, d]
    do_tt = kb.emit(isa.Load(kb.reg(), pdo, _tile_offsets(kb, qbase, qrow, d, False), q_ok_row))
    o_t = kb.emit(isa.Load(kb.reg(), po, qoff, q_ok_col))
    prod = kb.binary("mul", kb.emit(isa.Convert(kb.reg(), do_t, f32)), kb.emit(isa.Convert(kb.reg(), o_t, f32)))
    delta = kb.emit(isa.Reshape(kb.reg(), kb.emit(isa.Reduce(kb.reg(), "sum", prod, -1)), (1, bm)))
    lse = kb.emit(isa.Load(kb.reg(), plse, kb.binary("add", lbase, qrow), q_ok_row))  # [1, bm]
    st = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bn, bm)))
    st = kb.emit(isa.Dot(kb.reg(), k_t, q_tt, st, f32))                              # S^T [bn, bm]
    ok = kb.binary("and", key_ok, q_ok_row)
    if causal:
        ok = kb.binary("and", ok, kb.binary("le", keys, qrow))
    pt = kb.unary("exp", kb.binary("sub", kb.binary("mul", st, sc), lse))
    pt = kb.emit(isa.Where(kb.reg(), ok, pt, kb.const(0.0, f32)))
    kb.emit(isa.Dot(dv, kb.emit(isa.Convert(kb.reg(), pt, dtype)), do_t, dv, f32))   # dV += P^T dO
    dpt = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bn, bm)))
    dpt = kb.emit(isa.Dot(kb.reg(), v_t, do_tt, dpt, f32))                           # dP^T = V dO^T
    dst = kb.binary("mul", pt, kb.binary("sub", dpt, delta))                         # dS^T
    dst_c = kb.emit(isa.Convert(kb.reg(), dst, dtype))
    kb.emit(isa.Dot(dk, dst_c, q_t, dk, f32))                                        # dK += dS^T Q
    dqt = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (d, bm)))
    dqt = kb.emit(isa.Dot(kb.reg(), k_tt, dst_c, dqt, f32))                          # dQ^T = K^T dS^T
    dqt = kb.binary("mul", dqt, sc)
    kb.emit(isa.StoreReduce(pdq, _tile_offsets(kb, qbase, qrow, d, False), dqt, "sum", q_ok_row))
    _loop(kb, qvar, 0, sq, bm, start)
    kb.emit(isa.Store(pdk, koff, kb.emit(isa.Convert(kb.reg(), kb.binary("mul", dk, sc), dtype)), key_ok))
    kb.emit(isa.Store(pdv, koff, kb.emit(isa.Convert(kb.reg(), dv, dtype)), key_ok))
    item = isa.np_dtype(dtype).itemsize
    program = kb.program(**_meta(group_size, "attention_bwd",
                                 attention_shared_bytes(bm, bn, d, item, backward=True),
                                 2 * bn * d + 2 * bm * bn, tile=[bm, bn], head_dim=d, causal=causal))
    gk = math.ceil(sk / bn)

    def traffic(bh: int) -> Traffic:
        """K (twice: both layouts) and V once; every instance walks all query rows, loading Q
        and dO twice (both layouts), O and LSE once, and adds its dQ share (``store_reduce``)."""
        t, qs, ks = Traffic(), bh * sq * d, bh * sk * d
        t.load("k", 2 * ks, item, [0, ks * item])
        t.load("v", ks, item, [0, ks * item])
        for p, times in (("q", 2), ("do", 2), ("o", 1)):
            t.load(p, times * gk * qs, item, [0, qs * item])
        t.load("lse", gk * bh * sq, 4, [0, bh * sq * 4])
        t.store_reduce("dq", gk * qs, qs, item, dtype, [0, qs * item])
        for p in ("dk", "dv"):
            t.store(p, ks, item, [0, ks * item])
        return t

    return attach_sliced(program, 1, lambda bh: (gk, bh, 1), traffic), (bm, bn)


# ---- row kernels: norms and softmax ------------------------------------------------------------
def _row(kb: KernelBuilder, cols: int) -> tuple[str, str, str | None, int]:
    """Row index, [1, width] column index and mask of a one-row-per-instance kernel."""
    width = next_pow2(cols)
    row = kb.pid(0)
    col = kb.emit(isa.Reshape(kb.reg(), kb.arange(width), (1, width)))
    mask = _lt(kb, col, cols) if width != cols else None
    return row, col, mask, width


def _load_f32(kb: KernelBuilder, ptr: str, off: str, mask: str | None) -> str:
    """Load from ``ptr`` at ``off`` (under ``mask``) and convert to float32."""
    return kb.emit(isa.Convert(kb.reg(), kb.emit(isa.Load(kb.reg(), ptr, off, mask)), "float32"))


def _masked(kb: KernelBuilder, x: str, mask: str | None) -> str:
    """``x`` with the lanes outside ``mask`` set to 0."""
    return x if mask is None else kb.emit(isa.Where(kb.reg(), mask, x, kb.const(0.0, "float32")))


def norm_fwd_kernel(name: str, kind: str, dtype: str, cols: int, eps: float,
                    group_size: int) -> isa.Program:
    """Layer norm (``kind="layer"``: x, gamma, beta -> y, mean, rstd) or RMS norm
    (``"rms"``: x, gamma -> y, rstd) over the last axis; statistics in float32."""
    kb = KernelBuilder(name)
    f32 = "float32"
    px, pg = kb.param("x", "ptr", dtype), kb.param("gamma", "ptr", dtype)
    pb = kb.param("beta", "ptr", dtype) if kind == "layer" else None
    py = kb.param("y", "ptr", dtype)
    pmean = kb.param("mean", "ptr", f32) if kind == "layer" else None
    prstd = kb.param("rstd", "ptr", f32)
    row, col, mask, width = _row(kb, cols)
    off = kb.binary("add", kb.imul(row, cols), col)
    x = _load_f32(kb, px, off, mask)
    inv_n = kb.const(1.0 / cols, f32)
    if kind == "layer":
        mean = kb.binary("mul", kb.emit(isa.Reduce(kb.reg(), "sum", x, -1)), inv_n)
        xc = _masked(kb, kb.binary("sub", x, mean), mask)
    else:
        xc = x
    var = kb.binary("mul", kb.emit(isa.Reduce(kb.reg(), "sum", kb.binary("mul", xc, xc), -1)), inv_n)
    rstd = kb.unary("rsqrt", kb.binary("add", var, kb.const(float(eps), f32)))
    y = kb.binary("mul", kb.binary("mul", xc, rstd), _load_f32(kb, pg, col, mask))
    if pb is not None:                          # layer norm
        y = kb.binary("add", y, _load_f32(kb, pb, col, mask))
    kb.emit(isa.Store(py, off, kb.emit(isa.Convert(kb.reg(), y, dtype)), mask))
    if pmean is not None:                       # layer norm
        kb.emit(isa.Store(pmean, row, mean))
    kb.emit(isa.Store(prstd, row, rstd))
    program = kb.program(**_meta(group_size, f"{kind}_norm", 0, width, width=width))
    item = isa.np_dtype(dtype).itemsize

    def traffic(rows: int) -> Traffic:
        t, n = Traffic(), rows * cols
        t.load("x", n, item, [0, n * item])
        for p in ("gamma", "beta") if kind == "layer" else ("gamma",):
            t.load(p, n, item, [0, cols * item])          # every row reads the whole weight
        t.store("y", n, item, [0, n * item])
        for p in ("mean", "rstd") if kind == "layer" else ("rstd",):
            t.store(p, rows, 4, [0, rows * 4])
        return t

    return attach_sliced(program, 0, lambda rows: (rows, 1, 1), traffic)


def norm_bwd_kernel(name: str, kind: str, dtype: str, cols: int, group_size: int) -> isa.Program:
    """dx and the weight gradients (dgamma, and dbeta for layer norm) from dy, x, gamma and
    the saved statistics.  dgamma/dbeta are column sums over rows: ``store_reduce`` into
    buffers that start zeroed."""
    kb = KernelBuilder(name)
    f32 = "float32"
    pdy, px, pg = (kb.param(n, "ptr", dtype) for n in ("dy", "x", "gamma"))
    pmean = kb.param("mean", "ptr", f32) if kind == "layer" else None
    prstd = kb.param("rstd", "ptr", f32)
    pdx, pdg = kb.param("dx", "ptr", dtype), kb.param("dgamma", "ptr", dtype)
    pdb = kb.param("dbeta", "ptr", dtype) if kind == "layer" else None
    row, col, mask, width = _row(kb, cols)
    off = kb.binary("add", kb.imul(row, cols), col)
    dy, x = _load_f32(kb, pdy, off, mask), _load_f32(kb, px, off, mask)
    gamma = _load_f32(kb, pg, col, mask)
    rstd = kb.emit(isa.Load(kb.reg(), prstd, row))
    xc = kb.binary("sub", x, kb.emit(isa.Load(kb.reg(), pmean, row))) if pmean is not None else x
    xhat = _masked(kb, kb.binary("mul", xc, rstd), mask)
    g = _masked(kb, kb.binary("mul", dy, gamma), mask)
    inv_n = kb.const(1.0 / cols, f32)
    c2 = kb.binary("mul", kb.emit(isa.Reduce(kb.reg(), "sum", kb.binary("mul", g, xhat), -1)), inv_n)
    inner = kb.binary("sub", g, kb.binary("mul", xhat, c2))
    if kind == "layer":
        c1 = kb.binary("mul", kb.emit(isa.Reduce(kb.reg(), "sum", g, -1)), inv_n)
        inner = kb.binary("sub", inner, c1)
    dx = kb.binary("mul", inner, rstd)
    kb.emit(isa.Store(pdx, off, kb.emit(isa.Convert(kb.reg(), dx, dtype)), mask))
    kb.emit(isa.StoreReduce(pdg, col, kb.binary("mul", dy, xhat), "sum", mask))
    if pdb is not None:                         # layer norm
        kb.emit(isa.StoreReduce(pdb, col, dy, "sum", mask))
    program = kb.program(**_meta(group_size, f"{kind}_norm_bwd", 0, 3 * width, width=width))
    item = isa.np_dtype(dtype).itemsize

    def traffic(rows: int) -> Traffic:
        t, n = Traffic(), rows * cols
        for p in ("dy", "x"):
            t.load(p, n, item, [0, n * item])
        t.load("gamma", n, item, [0, cols * item])
        for p in ("mean", "rstd") if kind == "layer" else ("rstd",):
            t.load(p, rows, 4, [0, rows * 4])
        t.store("dx", n, item, [0, n * item])
        for p in ("dgamma", "dbeta") if kind == "layer" else ("dgamma",):
            t.store_reduce(p, n, cols, item, dtype, [0, cols * item])   # one flush of cols
        return t

    return attach_sliced(program, 0, lambda rows: (rows, 1, 1), traffic)


def softmax_kernel(name: str, dtype: str, cols: int, backward: bool, log: bool,
                   group_size: int) -> isa.Program:
    """Softmax (or log-softmax) over the last axis: forward x -> y; backward y, dy -> dx."""
    kb = KernelBuilder(name)
    f32 = "float32"
    names = ("y", "dy", "dx") if backward else ("x", "y")
    ptrs = [kb.param(n, "ptr", dtype) for n in names]
    row, col, mask, width = _row(kb, cols)
    off = kb.binary("add", kb.imul(row, cols), col)
    if not backward:
        x = _load_f32(kb, ptrs[0], off, mask)
        if mask is not None:
            x = kb.emit(isa.Where(kb.reg(), mask, x, kb.const(NEG_BIG, f32)))
        z = kb.binary("sub", x, kb.emit(isa.Reduce(kb.reg(), "max", x, -1)))
        e = kb.unary("exp", z)
        total = kb.emit(isa.Reduce(kb.reg(), "sum", e, -1))
        y = kb.binary("sub", z, kb.unary("log", total)) if log else kb.binary("div", e, total)
        kb.emit(isa.Store(ptrs[1], off, kb.emit(isa.Convert(kb.reg(), y, dtype)), mask))
    else:
        y, dy = _load_f32(kb, ptrs[0], off, mask), _load_f32(kb, ptrs[1], off, mask)
        if log:        # dx = dy - exp(y) * sum(dy)
            dx = kb.binary("sub", dy, kb.binary("mul", kb.unary("exp", y),
                                                kb.emit(isa.Reduce(kb.reg(), "sum", dy, -1))))
        else:          # dx = y * (dy - sum(dy * y))
            dot = kb.emit(isa.Reduce(kb.reg(), "sum", kb.binary("mul", dy, y), -1))
            dx = kb.binary("mul", y, kb.binary("sub", dy, dot))
        kb.emit(isa.Store(ptrs[2], off, kb.emit(isa.Convert(kb.reg(), dx, dtype)), mask))
    program = kb.program(**_meta(group_size, "softmax_bwd" if backward else "softmax", 0, 2 * width,
                                 width=width))
    item = isa.np_dtype(dtype).itemsize

    def traffic(rows: int) -> Traffic:
        t, n = Traffic(), rows * cols
        for p in names[:-1]:
            t.load(p, n, item, [0, n * item])
        t.store(names[-1], n, item, [0, n * item])
        return t

    return attach_sliced(program, 0, lambda rows: (rows, 1, 1), traffic)


# ---- pooling -----------------------------------------------------------------------------------
def pool_geometry(p: Mapping[str, Any]) -> Geometry:
    """Sizes of a 2-D pooling: ``p`` has n, c, h, w, kernel, stride, padding; adds r, s and the
    output extent p_out x q_out."""
    (r, s), (sh, sw), (ph, pw) = p["kernel"], p["stride"], p["padding"]
    return dict(p, r=r, s=s, p_out=(p["h"] + 2 * ph - r) // sh + 1, q_out=(p["w"] + 2 * pw - s) // sw + 1)


def pool2d_fwd_kernel(name: str, mode: str, dtype: str, g: Mapping[str, Any], block: int,
                      group_size: int) -> tuple[isa.Program, Grid]:
    """Max (x -> y, argmax index h*W+w per output) or average (x -> y, padding counted) 2-D
    pooling over NCHW; one lane per output element, a loop over the window."""
    kb = KernelBuilder(name)
    f32 = "float32"
    px, py = kb.param("x", "ptr", dtype), kb.param("y", "ptr", dtype)
    pidx = kb.param("indices", "ptr", "int64") if mode == "max" else None
    H, W, R, S, P, Q = g["h"], g["w"], g["r"], g["s"], g["p_out"], g["q_out"]
    (sh, sw), (ph, pw) = g["stride"], g["padding"]
    total = g["n"] * g["c"] * P * Q
    flat = kb.iadd(kb.imul(kb.pid(0), block), kb.arange(block))
    mask = _lt(kb, flat, total)
    nc, oh, ow = _split(kb, flat, (g["n"] * g["c"], P, Q))
    base = kb.imul(nc, H * W)
    h0 = kb.binary("sub", kb.imul(oh, sh), kb.const(ph, "int64"))
    w0 = kb.binary("sub", kb.imul(ow, sw), kb.const(pw, "int64"))
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(NEG_BIG if mode == "max" else 0.0, f32), (block,)))
    best = kb.emit(isa.Broadcast(kb.reg(), kb.const(0, "int64"), (block,))) if mode == "max" else None
    var = "%win"
    start = len(kb.body)
    r, s = _split(kb, var, (R, S))
    hh, ww = kb.binary("add", h0, r), kb.binary("add", w0, s)
    ok = _and(kb, mask, _in_range(kb, hh, H), _in_range(kb, ww, W))
    pos = kb.binary("add", kb.imul(hh, W), ww)
    v = _load_f32(kb, px, kb.binary("add", base, pos), ok)
    if best is not None:                                            # max pooling
        better = kb.binary("and", ok, kb.binary("gt", v, acc))      # first maximum wins, like torch
        kb.emit(isa.Where(best, better, pos, best))
        kb.emit(isa.Where(acc, better, v, acc))
    else:
        kb.emit(isa.Binary(acc, "add", acc, v))                     # padding lanes loaded as 0
    _loop(kb, var, 0, R * S, 1, start)
    out = acc if mode == "max" else kb.binary("mul", acc, kb.const(1.0 / (R * S), f32))
    kb.emit(isa.Store(py, flat, kb.emit(isa.Convert(kb.reg(), out, dtype)), mask))
    if pidx is not None and best is not None:                       # max pooling
        kb.emit(isa.Store(pidx, flat, best, mask))
    grid: Grid = (math.ceil(total / block), 1, 1)
    program = kb.program(**_meta(group_size, "pool2d", 0, 2 * block, mode=mode))
    item, nc = isa.np_dtype(dtype).itemsize, g["n"] * g["c"]
    vh, vw = window(P, R, sh, ph, 1, H), window(Q, S, sw, pw, 1, W)
    t = Traffic()
    t.load("x", nc * vh[0] * vw[0], item, span4((nc, 1, H, W), item, vh, vw))
    t.store("y", total, item, [0, total * item])
    if mode == "max":
        t.store("indices", total, 8, [0, total * 8])
    return attach(program, grid, t), grid


def pool2d_bwd_kernel(name: str, mode: str, dtype: str, g: Mapping[str, Any], block: int,
                      group_size: int) -> tuple[isa.Program, Grid]:
    """dx of 2-D pooling in pull form: each input element loops over the window positions
    that could cover it and takes dy/(R*S) (average) or dy where the saved argmax names it
    (max).  Deterministic, no atomics."""
    kb = KernelBuilder(name)
    f32 = "float32"
    pdy = kb.param("dy", "ptr", dtype)
    pidx = kb.param("indices", "ptr", "int64") if mode == "max" else None
    pdx = kb.param("dx", "ptr", dtype)
    H, W, R, S, P, Q = g["h"], g["w"], g["r"], g["s"], g["p_out"], g["q_out"]
    (sh, sw), (ph, pw) = g["stride"], g["padding"]
    total = g["n"] * g["c"] * H * W
    flat = kb.iadd(kb.imul(kb.pid(0), block), kb.arange(block))
    mask = _lt(kb, flat, total)
    nc, ih, iw = _split(kb, flat, (g["n"] * g["c"], H, W))
    me = kb.binary("add", kb.imul(ih, W), iw)
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (block,)))
    var = "%win"
    start = len(kb.body)
    r, s = _split(kb, var, (R, S))
    ok = mask
    coords = []
    for i, st, pad, k, lim in ((ih, sh, ph, r, P), (iw, sw, pw, s, Q)):
        t = kb.binary("sub", kb.binary("add", i, kb.const(pad, "int64")), k)
        o = kb.binary("floordiv", t, kb.const(st, "int64")) if st > 1 else t
        hit = kb.binary("and", kb.binary("ge", t, kb.const(0, "int64")), _lt(kb, o, lim))
        if st > 1:
            hit = kb.binary("and", hit, kb.binary("eq", kb.binary("mod", t, kb.const(st, "int64")),
                                                  kb.const(0, "int64")))
        ok = kb.binary("and", ok, hit)
        coords.append(o)
    out_off = _lin(kb, [(nc, P * Q), (coords[0], Q), (coords[1], 1)])
    dy = _load_f32(kb, pdy, out_off, ok)
    if pidx is not None:                                            # max pooling
        taken = kb.binary("eq", kb.emit(isa.Load(kb.reg(), pidx, out_off, ok)), me)
        dy = kb.emit(isa.Where(kb.reg(), kb.binary("and", ok, taken), dy, kb.const(0.0, f32)))
    else:
        dy = kb.binary("mul", dy, kb.const(1.0 / (R * S), f32))
    kb.emit(isa.Binary(acc, "add", acc, dy))
    _loop(kb, var, 0, R * S, 1, start)
    kb.emit(isa.Store(pdx, flat, kb.emit(isa.Convert(kb.reg(), acc, dtype)), mask))
    grid: Grid = (math.ceil(total / block), 1, 1)
    program = kb.program(**_meta(group_size, "pool2d_bwd", 0, 2 * block, mode=mode))
    item, nc = isa.np_dtype(dtype).itemsize, g["n"] * g["c"]
    uh, uw = pull(H, R, sh, ph, 1, P), pull(W, S, sw, pw, 1, Q)
    lanes = nc * uh[0] * uw[0]
    traffic = Traffic()
    traffic.load("dy", lanes, item, span4((nc, 1, P, Q), item, uh, uw))
    if mode == "max":
        traffic.load("indices", lanes, 8, span4((nc, 1, P, Q), 8, uh, uw))
    traffic.store("dx", total, item, [0, total * item])
    return attach(program, grid, traffic), grid


def fill_kernel(name: str, dtype: str, value: float, block: int, group_size: int) -> isa.Program:
    """out[i] = value for i < n (``n`` a scalar argument)."""
    kb = KernelBuilder(name)
    po = kb.param("out", "ptr", dtype)
    kb.param("n", "scalar", "int64")
    flat = kb.iadd(kb.imul(kb.pid(0), block), kb.arange(block))
    mask = kb.binary("lt", flat, kb.emit(isa.ScalarArg(kb.reg(), "n")))
    kb.emit(isa.Store(po, flat, kb.const(value, dtype), mask))
    program = kb.program(**_meta(group_size, "fill", 0, block))
    # generic over its length: one stored element per output, index arithmetic per instance
    # (no footprint: with every byte written once, the traffic is the footprint)
    per_instance = counts(program, (1, 1, 1), Traffic())["vector_flops"]
    program.meta["estimate"] = {
        "kind": "outputs", "m": "n", "n": 1,
        "per_output": {"bytes_written": isa.np_dtype(dtype).itemsize,
                       "vector_flops_per_instance": per_instance}}
    return program
