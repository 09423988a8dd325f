"""Lowering rules for jax's indexing primitives: ``gather``, the ``scatter`` family,
``dynamic_slice`` and ``dynamic_update_slice``.

XLA's gather and scatter are general: a batch of start indices, read at run time, each
selects a window of the operand.  They lower here by *flat indices*: for every element of
the result (gather) or of the updates (scatter) the graph computes, as an int64 tensor,
the row-major position of the operand element it reads or writes, and one graph
``gather`` / ``scatter`` on the flattened operand does the data movement.  The position is
the start (from the index operand, clamped or checked per the mode) plus the element's
offset inside its window (an ``iota`` per window dim), each times the operand's stride.

Semantics are XLA CPU's, as ``jax.jit`` computes them:

* a start index is clamped to ``[0, dim - window]`` (modes ``CLIP`` and
  ``PROMISE_IN_BOUNDS``), so a window never leaves the operand;
* ``FILL_OR_DROP`` gather returns ``fill_value`` for a whole window whose start is out of
  bounds (jax's default fill: NaN for floats, the minimum of a signed, the maximum of an
  unsigned integer, True for bool), checking the start as an int32 as jax does;
* scatter with ``FILL_OR_DROP`` or ``PROMISE_IN_BOUNDS`` drops a whole update window whose
  start is out of bounds (what XLA's scatter does natively); ``CLIP`` clamps it;
* repeated targets combine in row-major order of the updates: ``scatter-add`` sums them,
  ``scatter`` (set) keeps the last one, as XLA CPU does (XLA leaves that order
  unspecified; this is the order its CPU backend applies them in).

Key arrays (``key<fry>[...]``) are carried with a trailing data dim; their gathers,
scatters and slices take that dim whole.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.lax import GatherScatterMode

from ...layers.graph import DType, Value
from .lowering import (LowerCtx, NotLowerable, carried, device_shape, is_key, key_shape,
                       lower_jaxpr, lowering)

I64 = DType.INT64

#: limits of a scatter whose combiner is not add/set (mul, min, max, a custom one) when
#: its targets can repeat: it compares its n update elements pairwise (n x n, at most
#: PAIRWISE_LIMIT elements), and mul / custom combiners then run one round per update
#: window (at most CHAIN_LIMIT windows); see :func:`_combine_scatter`
PAIRWISE_LIMIT = 2048
CHAIN_LIMIT = 64


# ---- index arithmetic ----------------------------------------------------------------------------
def _reshape(ctx: LowerCtx, v: Value, shape) -> Value:
    shape = tuple(int(d) for d in shape)
    return v if tuple(v.shape) == shape else ctx.op("reshape", v, shape=shape)


def _operands(ctx: LowerCtx, eqn, vals) -> list[Value]:
    """The operands in their avals' device shapes (a 0-d literal may arrive as a one-element
    array)."""
    return [_reshape(ctx, v, device_shape(var.aval)) for v, var in zip(vals, eqn.invars)]


def _strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _axis_iota(ctx: LowerCtx, rank: int, axis: int, size: int) -> Value:
    """int64 ``0..size-1`` along ``axis`` of a rank-``rank`` tensor that is 1 elsewhere (it
    broadcasts against any shape with ``size`` at ``axis``)."""
    shape = tuple(size if d == axis else 1 for d in range(rank))
    return ctx.op("iota", shape=shape, axis=axis, dtype=I64.value)


def _index_columns(ctx: LowerCtx, indices: Value) -> list[Value]:
    """The index vectors' components (the last dim of ``indices``), each an int64 tensor of
    the batch shape ``indices.shape[:-1]``."""
    idx = ctx.cast(indices, I64)
    batch = tuple(idx.shape[:-1])
    k = idx.shape[-1]
    cols = []
    for j in range(k):
        col = idx if k == 1 else ctx.op("slice", idx, start=(0,) * len(batch) + (j,),
                                         stop=batch + (j + 1,))
        cols.append(_reshape(ctx, col, batch))
    return cols


def _in_range(ctx: LowerCtx, v: Value, hi: int) -> Value:
    """``0 <= v <= hi`` (bool, shape of ``v``)."""
    return ctx.op("logical_and", ctx.op("ge", v, ctx.scalar(0, v.dtype)),
                  ctx.op("le", v, ctx.scalar(hi, v.dtype)))


def _as_int32(ctx: LowerCtx, v: Value) -> Value:
    """An int64 index as jax's ``convert_element_type`` to int32 sees it (wrapped mod 2**32)."""
    half = ctx.scalar(1 << 31, I64)
    w = ctx.op("bitwise_and", ctx.op("add", v, half), ctx.scalar((1 << 32) - 1, I64))
    return ctx.op("sub", w, half)


def _spread(ctx: LowerCtx, v: Value, rank: int, positions) -> Value:
    """Reshape a batch-shaped tensor to rank ``rank`` with its dims at ``positions`` (1 in
    the others), to broadcast against a result that interleaves batch and window dims."""
    shape = [1] * rank
    for p, n in zip(positions, v.shape):
        shape[p] = n
    return _reshape(ctx, v, shape)


def _flat_index(ctx: LowerCtx, op_shape, out_shape, batch_pos, starts: dict, window: dict) -> Value:
    """int64 tensor of ``out_shape``: the row-major operand position of every element.

    ``starts[d]``: a batch-shaped start of operand dim ``d`` (missing: 0); ``window[d]``:
    the result dim counting the offset inside the window along operand dim ``d``."""
    strides = _strides(op_shape)
    rank = len(out_shape)
    total = None
    for d, s in starts.items():
        term = ctx.op("mul", s, ctx.scalar(strides[d], I64)) if strides[d] != 1 else s
        total = term if total is None else ctx.op("add", total, term)
    total = ctx.scalar(0, I64) if total is None else _spread(ctx, total, rank, batch_pos)
    for d, axis in window.items():
        off = _axis_iota(ctx, rank, axis, out_shape[axis])
        if strides[d] != 1:
            off = ctx.op("mul", off, ctx.scalar(strides[d], I64))
        total = ctx.op("add", total, off)
    if tuple(total.shape) != tuple(out_shape):
        total = ctx.op("broadcast_to", total, shape=tuple(out_shape))
    return total


def _flatten(ctx: LowerCtx, v: Value) -> Value:
    return _reshape(ctx, v, (math.prod(v.shape),))


def _mode(ctx: LowerCtx, mode) -> GatherScatterMode:
    mode = GatherScatterMode.from_any(mode)
    if mode not in (GatherScatterMode.CLIP, GatherScatterMode.FILL_OR_DROP,
                    GatherScatterMode.PROMISE_IN_BOUNDS):
        raise ctx.fail(f"index mode {mode.name} has no XLA semantics to lower (jax expands it "
                       "before it reaches a gather or scatter)")
    return mode


def _key_data_dims(aval) -> tuple[int, ...]:
    return key_shape(aval.dtype) if is_key(aval.dtype) else ()


# ---- gather --------------------------------------------------------------------------------------
def default_fill(dtype):
    """jax's fill for an out-of-bounds ``FILL_OR_DROP`` gather of ``dtype``."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return True
    if jax.dtypes.issubdtype(dt, np.inexact):
        return float("nan")
    info = np.iinfo(dt)
    return int(info.min) if info.min < 0 else int(info.max)


@lowering("gather")
def gather(ctx, eqn, operand, indices):
    """XLA gather (any ``GatherDimensionNumbers``, index vector in the last dim of the
    indices, as jax always builds it)."""
    operand, indices = _operands(ctx, eqn, (operand, indices))
    p = eqn.params
    dn = p["dimension_numbers"]
    mode = _mode(ctx, p["mode"])
    op_aval, out_aval = eqn.invars[0].aval, eqn.outvars[0].aval
    kd = _key_data_dims(op_aval)
    if kd and mode is GatherScatterMode.FILL_OR_DROP:
        raise ctx.fail("a FILL_OR_DROP gather of a key array has no fill key; gather with "
                       "mode='clip' or 'promise_in_bounds'")
    out_shape = tuple(int(d) for d in out_aval.shape) + kd
    rank_out = len(out_shape)
    offset_dims = tuple(dn.offset_dims) + tuple(range(len(out_aval.shape), rank_out))
    slice_sizes = tuple(int(s) for s in p["slice_sizes"]) + kd
    op_shape = tuple(operand.shape)
    collapsed, start_map = tuple(dn.collapsed_slice_dims), tuple(dn.start_index_map)
    obatch, ibatch = tuple(dn.operand_batching_dims), tuple(dn.start_indices_batching_dims)
    batch_pos = [d for d in range(rank_out) if d not in offset_dims]
    batch_shape = tuple(indices.shape[:-1])

    cols = _index_columns(ctx, indices)
    mask = None
    if mode is GatherScatterMode.FILL_OR_DROP:
        for col, d in zip(cols, start_map):
            ok = _in_range(ctx, _as_int32(ctx, col), op_shape[d] - slice_sizes[d])
            mask = ok if mask is None else ctx.op("logical_and", mask, ok)
        cols = [_as_int32(ctx, c) for c in cols]

    # one indexed dim taken whole around full slices: a plain index_select
    window_src = [d for d in range(len(op_shape)) if d not in collapsed and d not in obatch]
    if (len(start_map) == 1 and collapsed == start_map and not obatch
            and all(slice_sizes[d] == op_shape[d] for d in window_src)
            and batch_pos == list(range(start_map[0], start_map[0] + len(batch_shape)))):
        a = start_map[0]
        out = ctx.op("index_select", operand, _flatten(ctx, cols[0]), axis=a)
    else:
        starts = {}
        for col, d in zip(cols, start_map):
            hi = op_shape[d] - slice_sizes[d]
            starts[d] = ctx.op("clamp", col, ctx.scalar(0, I64), ctx.scalar(hi, I64))
        for od, idim in zip(obatch, ibatch):
            starts[od] = ctx.op("iota", shape=batch_shape, axis=int(idim), dtype=I64.value)
        window = dict(zip(window_src, offset_dims))
        flat = _flat_index(ctx, op_shape, out_shape, batch_pos, starts, window)
        out = ctx.op("gather", _flatten(ctx, operand), _flatten(ctx, flat), axis=0)
    out = _reshape(ctx, out, out_shape)
    if mask is not None:
        fill = p.get("fill_value")
        fill = default_fill(out_aval.dtype) if fill is None else fill
        fill = bool(fill) if out.dtype is DType.BOOL else (
            float(fill) if out.dtype.is_float else int(fill))
        out = ctx.op("where", _spread(ctx, mask, rank_out, batch_pos), out,
                     ctx.scalar(fill, out.dtype))
    return out


# ---- scatter -------------------------------------------------------------------------------------
def _scatter_targets(ctx, eqn, operand, indices, updates):
    """The flat operand position of every update element (int64, shape of the updates,
    flattened); a dropped element (out-of-bounds window) gets position ``operand.size``,
    which the graph ``scatter`` skips."""
    p = eqn.params
    dn = p["dimension_numbers"]
    mode = _mode(ctx, p["mode"])
    kd = _key_data_dims(eqn.invars[0].aval)
    op_shape, upd_shape = tuple(operand.shape), tuple(updates.shape)
    window_dims = tuple(dn.update_window_dims) + tuple(
        range(len(upd_shape) - len(kd), len(upd_shape)))
    inserted, sdod = tuple(dn.inserted_window_dims), tuple(dn.scatter_dims_to_operand_dims)
    obatch, ibatch = tuple(dn.operand_batching_dims), tuple(dn.scatter_indices_batching_dims)
    window_src = [d for d in range(len(op_shape)) if d not in inserted and d not in obatch]
    wsize = {d: 1 for d in range(len(op_shape))}
    for d, u in zip(window_src, window_dims):
        wsize[d] = upd_shape[u]
    batch_pos = [d for d in range(len(upd_shape)) if d not in window_dims]
    batch_shape = tuple(indices.shape[:-1])

    keep = None
    starts = {}
    for col, d in zip(_index_columns(ctx, indices), sdod):
        hi = op_shape[d] - wsize[d]
        if mode is GatherScatterMode.CLIP:
            col = ctx.op("clamp", col, ctx.scalar(0, I64), ctx.scalar(hi, I64))
        else:
            ok = _in_range(ctx, col, hi)
            keep = ok if keep is None else ctx.op("logical_and", keep, ok)
        starts[d] = col
    for od, idim in zip(obatch, ibatch):
        starts[od] = ctx.op("iota", shape=batch_shape, axis=int(idim), dtype=I64.value)
    flat = _flat_index(ctx, op_shape, upd_shape, batch_pos, starts, dict(zip(window_src, window_dims)))
    if keep is not None:
        flat = ctx.op("where", _spread(ctx, keep, len(upd_shape), batch_pos), flat,
                      ctx.scalar(math.prod(op_shape), I64))
    return _flatten(ctx, flat)


def _is_set(update_jaxpr) -> bool:
    """Whether a scatter's combiner is ``lambda x, y: y`` (None means exactly that)."""
    if update_jaxpr is None:
        return True
    return not update_jaxpr.eqns and list(update_jaxpr.outvars) == [update_jaxpr.invars[1]]


@lowering("scatter", "scatter-add", "scatter_add", "scatter-sub", "scatter-mul", "scatter-min",
          "scatter-max")
def scatter(ctx, eqn, operand, indices, updates):
    """XLA scatter into a flattened operand: add/sub and set are one graph ``scatter``;
    mul, min, max and custom combiners (``scatter_apply``) combine repeated targets first
    (see :func:`_combine_scatter`)."""
    operand, indices, updates = _operands(ctx, eqn, (operand, indices, updates))
    name = eqn.primitive.name
    dtype = eqn.outvars[0].aval.dtype
    shape = tuple(operand.shape)
    target = _scatter_targets(ctx, eqn, operand, indices, updates)
    x, upd = _flatten(ctx, operand), _flatten(ctx, updates)
    if name == "scatter" and _is_set(eqn.params.get("update_jaxpr")):
        out = ctx.op("scatter", x, target, upd, axis=0, mode="set")
    elif name in ("scatter-add", "scatter_add", "scatter-sub"):
        if name == "scatter-sub":
            upd = ctx.op("neg", upd)
        out = ctx.wrap(ctx.op("scatter", x, target, upd, axis=0, mode="add"), dtype)
    else:
        out = _combine_scatter(ctx, eqn, x, target, upd, math.prod(indices.shape[:-1]))
    return _reshape(ctx, out, shape)


def _combine_scatter(ctx, eqn, x: Value, target: Value, upd: Value, windows: int) -> Value:
    """Scatter with a combiner the graph ``scatter`` lacks (mul, min, max, custom).

    min/max: every update element takes the extreme of all updates with its target (an
    n x n comparison), combines it with the operand, and a ``scatter`` set writes it (all
    elements of one target hold the same value).  mul and custom combiners apply the
    updates of a target one after another in row-major order, exactly as XLA CPU does:
    an element's *rank* is the number of earlier updates with its target (n x n), and
    round ``k`` gathers, combines and sets the rank-``k`` elements, whose targets are
    distinct.  One window never hits a target twice, so ``windows`` (the number of update
    windows) rounds suffice.  With ``unique_indices`` a single round does."""
    name = eqn.primitive.name
    dtype = eqn.outvars[0].aval.dtype
    n = upd.shape[0]
    unique = bool(eqn.params.get("unique_indices"))
    is_bool = x.dtype is DType.BOOL and name != "scatter"      # and/or as min/max/mul on 0/1
    if is_bool:
        x, upd = ctx.cast(x, DType.INT32), ctx.cast(upd, DType.INT32)
    combine = _combiner(ctx, eqn, name, dtype, n)
    if not unique and n > PAIRWISE_LIMIT:
        raise ctx.fail(f"{name} with {n} update elements whose targets may repeat needs an "
                       f"{n} x {n} comparison (at most {PAIRWISE_LIMIT} elements); pass "
                       "unique_indices=True if the targets are distinct")
    if unique:
        out = ctx.op("scatter", x, target, combine(ctx.op("gather", x, target, axis=0), upd),
                     axis=0, mode="set")
    elif name in ("scatter-min", "scatter-max"):
        same = ctx.op("eq", _reshape(ctx, target, (n, 1)), _reshape(ctx, target, (1, n)))
        ident = _identity(name, x.dtype, dtype)
        cand = ctx.op("where", same, _reshape(ctx, upd, (1, n)), ctx.scalar(ident, x.dtype))
        red = "reduce_max" if name == "scatter-max" else "reduce_min"
        val = combine(ctx.op("gather", x, target, axis=0), ctx.op(red, cand, axis=1, keepdims=False))
        out = ctx.op("scatter", x, target, val, axis=0, mode="set")
    else:
        if windows > CHAIN_LIMIT:
            raise ctx.fail(f"{name} with {windows} update windows whose targets may repeat is "
                           f"applied in up to {windows} sequential rounds (at most {CHAIN_LIMIT}); "
                           "pass unique_indices=True if the targets are distinct")
        same = ctx.op("eq", _reshape(ctx, target, (n, 1)), _reshape(ctx, target, (1, n)))
        earlier = ctx.op("lt", ctx.op("iota", shape=(1, n), axis=1, dtype=I64.value),
                         ctx.op("iota", shape=(n, 1), axis=0, dtype=I64.value))
        rank = ctx.op("reduce_sum", ctx.cast(ctx.op("logical_and", same, earlier), I64), axis=1,
                      keepdims=False)
        drop = ctx.scalar(x.shape[0], I64)
        out = x
        for k in range(windows):
            tk = ctx.op("where", ctx.op("eq", rank, ctx.scalar(k, I64)), target, drop)
            val = combine(ctx.op("gather", out, target, axis=0), upd)
            out = ctx.op("scatter", out, tk, val, axis=0, mode="set")
    return ctx.op("gt", out, ctx.scalar(0, DType.INT32)) if is_bool else out


def _identity(name: str, dev: DType, jax_dtype):
    """The neutral element of max/min over values of ``jax_dtype`` held as ``dev``."""
    big = name == "scatter-min"
    if dev.is_float:
        return float("inf") if big else float("-inf")
    c = carried(jax_dtype)
    if c is not None and c.carried:
        return c.hi if big else c.lo
    info = np.iinfo(dev.numpy)
    return int(info.max) if big else int(info.min)


def _combiner(ctx, eqn, name, dtype, n):
    """``f(x, u)`` on n-element graph values for the scatter's combiner."""
    if name == "scatter-mul":
        return lambda a, b: ctx.wrap(ctx.op("mul", a, b), dtype)
    if name == "scatter-max":
        return lambda a, b: ctx.op("maximum", a, b)
    if name == "scatter-min":
        return lambda a, b: ctx.op("minimum", a, b)
    if eqn.params.get("update_jaxpr") is None:       # unreachable for "scatter": set is handled
        raise ctx.fail(f"{name} has no combiner")
    from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
    fn = jaxpr_as_fun(ClosedJaxpr(eqn.params["update_jaxpr"], list(eqn.params["update_consts"])))
    spec = jax.ShapeDtypeStruct((n,), dtype)
    closed = jax.make_jaxpr(jax.vmap(lambda a, b: fn(a, b)[0]))(spec, spec)

    def apply(a, b):
        try:
            (out,) = lower_jaxpr(ctx, closed.jaxpr, list(closed.consts), [a, b])
        except NotLowerable as e:
            raise ctx.fail(f"the scatter's combiner has no device lowering ({e})") from None
        finally:
            ctx.where = name
        return out
    return apply


# ---- dynamic slices ------------------------------------------------------------------------------
def _clamped_start(ctx: LowerCtx, start: Value, hi: int) -> Value:
    """A 0-d start (a literal may arrive as a one-element array) clamped to ``[0, hi]``."""
    start = _reshape(ctx, ctx.cast(start, I64), ())
    return ctx.op("clamp", start, ctx.scalar(0, I64), ctx.scalar(hi, I64))


@lowering("dynamic_slice")
def dynamic_slice(ctx, eqn, operand, *starts):
    """``operand[s0:s0+n0, ...]`` with run-time starts clamped to ``[0, dim - n]``: one
    ``index_select`` of ``iota + start`` per dim the slice does not take whole."""
    (operand,) = _operands(ctx, eqn, (operand,))
    kd = _key_data_dims(eqn.invars[0].aval)
    sizes = tuple(int(s) for s in eqn.params["slice_sizes"]) + kd
    out = operand
    for d, (start, size) in enumerate(zip(starts, sizes)):
        dim = operand.shape[d]
        if size == dim:
            continue                                   # the clamped start is 0
        s = _clamped_start(ctx, start, dim - size)
        idx = ctx.op("add", ctx.op("iota", shape=(size,), axis=0, dtype=I64.value), s)
        out = ctx.op("index_select", out, idx, axis=d)
    return out


@lowering("dynamic_update_slice")
def dynamic_update_slice(ctx, eqn, operand, update, *starts):
    """``operand`` with ``update`` written at run-time starts clamped to
    ``[0, dim - update dim]``: a ``scatter`` set at the update's flat positions."""
    operand, update = _operands(ctx, eqn, (operand, update))
    op_shape, upd_shape = tuple(operand.shape), tuple(update.shape)
    rank = len(upd_shape)
    if rank == 0:
        return update
    st = {d: _clamped_start(ctx, s, op_shape[d] - upd_shape[d]) for d, s in enumerate(starts)
          if op_shape[d] != upd_shape[d]}
    flat = _flat_index(ctx, op_shape, upd_shape, [], st, {d: d for d in range(rank)})
    out = ctx.op("scatter", _flatten(ctx, operand), _flatten(ctx, flat), _flatten(ctx, update),
                 axis=0, mode="set")
    return _reshape(ctx, out, op_shape)
