"""Lowering rules of jax's windowed primitives: pooling forward (``reduce_window_max`` /
``_min`` / ``_sum`` and the generic ``reduce_window``) and its derivatives
(``select_and_scatter_add``, the transpose behind max-pool gradients, and
``select_and_gather_add``, the tangent of a max-pool under forward mode).

Every rule builds its result from the graph IR's primitive ops, so a pooling layer and
its gradient run on the device like any other segment:

* the operand is padded (``lo``/``hi`` per dim, ``base_dilation - 1`` holes between
  elements: the ``pad`` rule's XLA semantics);
* each window *tap* (one offset inside the window) is one strided ``slice`` of the padded
  operand whose shape is the result's;
* the taps are combined in the window's row-major order, as XLA's CPU emitter walks a
  window; a float16/bfloat16 ``reduce_window_sum`` rounds after every add, as XLA CPU does
  (its combiner is an add in the narrow type).

XLA's reduce_window starts from the init value and combines only the window elements
that fall inside the (dilated) operand: padding and base-dilation holes are skipped.
``reduce_window_max`` / ``_min`` / ``_sum`` pad with their init value (the identity of
their combiner, so skipping and combining agree); the generic ``reduce_window`` (any
combiner, any init) and the two selections mask the taps that hit padding or holes with
a static validity mask, so they match XLA exactly.

``select_and_scatter_add(source, operand)``: for each window, the first element that no
later element beats under ``select_prim`` (``ge`` for max-pooling: ties keep the first,
XLA's ``if !select(selected, candidate): selected = candidate`` walk) receives the
window's ``source`` value; overlapping windows add up.  The selected element's flat
operand index is tracked per window and the sources are added with one ``scatter``
(``mode="add"``, row-major over the windows, XLA's order); a window of padding only
selects nothing (index -1: the scatter drops it).  float16/bfloat16 sources are added in float32 and
rounded once, so where overlapping windows select one element the sum may differ from XLA
CPU's (which rounds after each add) in the last bit.

Refused (``NotLowerable``; the equation runs on the host with the reason): windows of
more than :data:`MAX_TAPS` elements (one graph slice per tap), negative padding.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np

from ...layers.graph import DType, Value
from .. import builders as B
from .lowering import NotLowerable, device_dtype, lower_jaxpr, lowering
from .primitives import pad as _pad_rule
from .primitives.common import LOW_FLOATS, ints

#: the most window elements (taps) a rule unrolls into slices
MAX_TAPS = 4096


class _Window:
    """The static geometry of one windowed equation."""

    def __init__(self, ctx, eqn, operand_shape, out_shape):
        p = eqn.params
        n = len(operand_shape)
        self.shape = ints(operand_shape)
        self.out = ints(out_shape)
        self.dims = ints(p["window_dimensions"])
        self.strides = ints(p["window_strides"])
        self.padding = tuple((int(lo), int(hi)) for lo, hi in p["padding"])
        self.base = ints(p.get("base_dilation") or (1,) * n)
        self.dil = ints(p.get("window_dilation") or (1,) * n)
        if any(lo < 0 or hi < 0 for lo, hi in self.padding):
            raise ctx.fail(f"negative window padding {self.padding}")
        taps = math.prod(self.dims)
        if taps > MAX_TAPS:
            raise ctx.fail(f"a window of {taps} elements ({'x'.join(map(str, self.dims))}); fornax unrolls "
                           f"at most {MAX_TAPS} window elements into slices")

    def offsets(self):
        """Every tap's offset inside the window, in XLA's row-major walk."""
        return itertools.product(*(range(d) for d in self.dims))

    def padded(self, ctx, x: Value, fill: Value) -> Value:
        """``x`` padded and base-dilated with ``fill`` (a 0-d value of x's dtype)."""
        config = tuple((lo, hi, b - 1) for (lo, hi), b in zip(self.padding, self.base))
        if all(c == (0, 0, 0) for c in config):
            return x
        return _pad_rule(ctx, SimpleNamespace(params={"padding_config": config}), x, fill)

    def tap(self, ctx, xp: Value, offset) -> Value:
        """The strided slice of the padded operand that tap ``offset`` reads (the result's shape)."""
        start = tuple(w * d for w, d in zip(offset, self.dil))
        stop = tuple(s + (o - 1) * st + 1 for s, o, st in zip(start, self.out, self.strides))
        if start == (0,) * len(start) and stop == tuple(xp.shape) and set(self.strides) <= {1}:
            return xp
        return ctx.op("slice", xp, start=start, stop=stop, step=self.strides)

    def _positions(self, d: int, w: int) -> np.ndarray:
        """Tap ``w``'s positions along dim ``d`` in the operand's own (undilated) coordinates,
        as a fraction-free numerator: (padded position - lo) / base_dilation."""
        return np.arange(self.out[d]) * self.strides[d] + w * self.dil[d] - self.padding[d][0]

    def valid(self, ctx, offset) -> Value | None:
        """A bool mask (broadcasting to the result) of the windows in which tap ``offset`` hits an
        operand element rather than padding or a dilation hole; None when it always does."""
        mask = None
        for d, w in enumerate(offset):
            q = self._positions(d, w)
            ok = (q >= 0) & (q <= (self.shape[d] - 1) * self.base[d]) & (q % self.base[d] == 0)
            if ok.all():
                continue
            shape = [1] * len(self.out)
            shape[d] = self.out[d]
            m = ctx.const(ok.reshape(shape))
            mask = m if mask is None else ctx.op("logical_and", mask, m)
        return mask

    def flat_index(self, ctx, offset) -> Value:
        """The row-major flat operand index tap ``offset`` reads in each window (int64; only
        meaningful where :meth:`valid`)."""
        strides = np.cumprod((1,) + self.shape[:0:-1])[::-1]

        def term(d: int, w: int) -> Value:
            q = self._positions(d, w) // self.base[d]
            shape = [1] * len(self.out)
            shape[d] = self.out[d]
            return ctx.const((q * int(strides[d])).astype(np.int64).reshape(shape))
        idx = term(0, offset[0])
        for d in range(1, len(offset)):
            idx = ctx.op("add", idx, term(d, offset[d]))
        return B.broadcast(ctx, idx, self.out)


def _identity(dtype: DType, kind: str):
    """The init value of reduce_window_max / _min / _sum on the device dtype."""
    if kind == "sum":
        return 0
    if dtype.is_float:
        return -math.inf if kind == "max" else math.inf
    info = np.iinfo(dtype.numpy)
    return int(info.min) if kind == "max" else int(info.max)


def _monoid(kind: str):
    op = {"max": "maximum", "min": "minimum", "sum": "add"}[kind]

    def rule(ctx, eqn, x):
        jdt = eqn.outvars[0].aval.dtype
        out = device_dtype(jdt)
        win = _Window(ctx, eqn, x.shape, eqn.outvars[0].aval.shape)
        if out is DType.BOOL:
            if kind == "sum":
                raise ctx.fail("reduce_window_sum of bool")
            v = ctx.cast(x, DType.INT32)
        else:
            v = x
        xp = win.padded(ctx, v, ctx.scalar(_identity(v.dtype, kind), v.dtype))
        acc = None
        for offset in win.offsets():
            t = win.tap(ctx, xp, offset)
            if acc is None:
                acc = t
            elif kind == "sum" and out in LOW_FLOATS:  # XLA CPU rounds float16/bfloat16 after every add
                acc = ctx.cast(ctx.op("add", ctx.cast(acc, DType.FLOAT32), ctx.cast(t, DType.FLOAT32)), out)
            else:
                acc = ctx.op(op, acc, t)
        if out is DType.BOOL:
            return ctx.cast(acc, DType.BOOL)
        return ctx.cast(acc, out) if out.is_float else ctx.wrap(acc, jdt)
    rule.__doc__ = (f"reduce_window_{kind}: the {kind} of the window's taps (padding is the identity "
                    f"{kind!r} starts from).")
    return rule


for _kind in ("max", "min", "sum"):
    lowering(f"reduce_window_{_kind}")(_monoid(_kind))


@lowering("reduce_window")
def reduce_window(ctx, eqn, *operands):
    """The generic form: n operands and n init values, combined by the equation's scalar jaxpr
    (vectorised over the result with ``jax.vmap``, as the scatter combiner is); taps outside the
    operand are skipped by mask, as XLA skips them."""
    import jax
    from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
    n = len(operands) // 2
    xs, inits = operands[:n], operands[n:]
    out_aval = eqn.outvars[0].aval
    win = _Window(ctx, eqn, xs[0].shape, out_aval.shape)
    size = math.prod(win.out)
    fn = jaxpr_as_fun(ClosedJaxpr(eqn.params["jaxpr"], list(eqn.params["consts"])))
    specs = [jax.ShapeDtypeStruct((size,), v.aval.dtype) for v in eqn.invars[n:]] * 2
    closed = jax.make_jaxpr(jax.vmap(lambda *a: tuple(fn(*a))))(*specs)
    flat = (size,)

    def combine(acc, taps):
        name = ctx.where
        try:
            res = lower_jaxpr(ctx, closed.jaxpr, list(closed.consts),
                              [B.reshape(ctx, v, flat) for v in (*acc, *taps)])
        except NotLowerable as e:
            raise ctx.fail(f"the window's combiner has no device lowering ({e})") from None
        finally:
            ctx.where = name
        return [B.reshape(ctx, r, win.out) for r in res]

    padded = [win.padded(ctx, x, init) for x, init in zip(xs, inits)]
    acc = [B.broadcast(ctx, init, win.out) for init in inits]
    for offset in win.offsets():
        taps = [win.tap(ctx, xp, offset) for xp in padded]
        new = combine(acc, taps)
        mask = win.valid(ctx, offset)
        acc = new if mask is None else [ctx.op("where", mask, a1, a0) for a1, a0 in zip(new, acc)]
    return acc


def _keeps(ctx, select_prim: str, best: Value, v: Value) -> Value:
    """XLA's ``select(selected, candidate)``: true keeps the selected element."""
    if select_prim not in ("ge", "gt", "le", "lt"):
        raise ctx.fail(f"select_prim {select_prim!r} (fornax lowers ge, gt, le and lt)")
    return ctx.op(select_prim, best, v)


def _select_prim(eqn) -> str:
    p = eqn.params["select_prim"]
    return getattr(p, "name", str(p))


@lowering("select_and_scatter_add")
def select_and_scatter_add(ctx, eqn, source, operand):
    """Each window's ``source`` value added at the operand element the window selects (see the
    module docstring): the selected flat index per window, then one scatter-add."""
    jdt = eqn.outvars[0].aval.dtype
    out = device_dtype(jdt)
    if out is DType.BOOL:
        raise ctx.fail("select_and_scatter_add of bool")
    prim = _select_prim(eqn)
    win = _Window(ctx, eqn, operand.shape, source.shape)
    xp = win.padded(ctx, operand, ctx.scalar(0, operand.dtype))
    best = sel = has = None                      # has None: every window has selected an element
    for offset in win.offsets():
        v, idx, valid = win.tap(ctx, xp, offset), win.flat_index(ctx, offset), win.valid(ctx, offset)
        if best is None:
            best, has = v, valid
            sel = idx if valid is None else ctx.op("where", valid, idx, ctx.scalar(-1, DType.INT64))
            continue
        take = ctx.op("logical_not", _keeps(ctx, prim, best, v))
        if has is not None:
            take = ctx.op("logical_or", ctx.op("logical_not", has), take)
        if valid is not None:
            take = ctx.op("logical_and", valid, take)
        best, sel = ctx.op("where", take, v, best), ctx.op("where", take, idx, sel)
        if has is not None:
            has = None if valid is None else ctx.op("logical_or", has, valid)
    cdt = DType.FLOAT32 if out in LOW_FLOATS else out
    m = math.prod(win.out)
    zeros = B.full(ctx, (math.prod(win.shape),), 0, cdt)
    r = ctx.op("scatter", zeros, B.reshape(ctx, sel, (m,)), B.reshape(ctx, ctx.cast(source, cdt), (m,)),
               axis=0, mode="add")
    r = B.reshape(ctx, r, win.shape)
    return ctx.cast(r, out) if out.is_float else ctx.wrap(r, jdt)


@lowering("select_and_gather_add")
def select_and_gather_add(ctx, eqn, tangents, operand):
    """Per window, the tangent at the element the window selects (forward-mode max-pool):
    jax's reduction of (operand, tangent) pairs from (∓inf, 0), keeping the pair so far where
    ``select_prim(kept, candidate)`` holds; padding and holes are skipped."""
    prim = _select_prim(eqn)
    win = _Window(ctx, eqn, operand.shape, eqn.outvars[0].aval.shape)
    xp = win.padded(ctx, operand, ctx.scalar(0, operand.dtype))
    tp = win.padded(ctx, tangents, ctx.scalar(0, tangents.dtype))
    start = -math.inf if prim in ("ge", "gt") else math.inf
    if not operand.dtype.is_float:
        info = np.iinfo(operand.dtype.numpy)
        start = int(info.min) if prim in ("ge", "gt") else int(info.max)
    best = B.full(ctx, win.out, start, operand.dtype)
    tan = B.full(ctx, win.out, 0, tangents.dtype)
    for offset in win.offsets():
        v, t, valid = win.tap(ctx, xp, offset), win.tap(ctx, tp, offset), win.valid(ctx, offset)
        upd = ctx.op("logical_not", _keeps(ctx, prim, best, v))
        if valid is not None:
            upd = ctx.op("logical_and", valid, upd)
        best, tan = ctx.op("where", upd, v, best), ctx.op("where", upd, t, tan)
    return tan
