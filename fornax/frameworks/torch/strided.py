"""Graphs that move a strided view of a flat device buffer: gather it into logical order,
or cast and scatter it into another strided view.

A view that covers a dense block in some axis order is a reshape and a transpose; any
other view goes through an index table.  The eager kernels (:mod:`.eager`) compile
these graphs once per shape, strides and dtypes and launch them on device buffers.
"""

from __future__ import annotations

import numpy as np

from ...layers.graph import Graph
from . import tensors as T


def dense_permutation(shape, stride):
    """The axis order that makes ``stride`` contiguous, when the view covers a dense block."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    order = sorted(dims, key=lambda d: -stride[d])
    expect = 1
    for d in reversed(order):
        if stride[d] != expect:
            return None
        expect *= shape[d]
    return order


def _read_view(g: Graph, x, shape, stride, name: str):
    """The elements of the view ``shape``/``stride`` of the flat buffer ``x``, in logical
    order: a transpose of a permuted dense block, else an index table (constant ``name``)."""
    order = dense_permutation(shape, stride)
    if order is not None:
        y = g.op("reshape", x, shape=tuple(shape[d] for d in order))
        if order != sorted(order):
            y = g.op("transpose", y, perm=tuple(_full_perm(shape, order)))
    else:
        y = g.op("index_select", x, g.constant(strided_index(shape, stride).reshape(-1), name), axis=0)
    return g.op("reshape", y, shape=tuple(shape))


def gather_graph(shape, stride, dt) -> Graph:
    span = T.span_elements(shape, stride)
    g = Graph("strided_gather")
    g.output(_read_view(g, g.input("x", (span,), dt), shape, stride, "idx"))
    return g


def _full_perm(shape, order):
    """``order`` covers the non-1 axes; after reshaping to those sizes the transpose that
    puts them back in logical order."""
    rank = sorted(range(len(order)), key=lambda i: order[i])
    return rank


def strided_index(shape, stride) -> np.ndarray:
    idx = np.zeros(tuple(shape), dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, stride)):
        view = [1] * len(shape)
        view[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(view)
    return np.ascontiguousarray(idx)


def convert_graph(shape, src_stride, src_dt, dst_dt, dst_stride) -> Graph:
    """Read a strided source view, cast, and write it into a strided destination view."""
    g = Graph("strided_copy")
    x = g.input("src", (T.span_elements(shape, src_stride),), src_dt)
    if tuple(src_stride) == T.contiguous_strides(shape):
        y = g.op("reshape", x, shape=tuple(shape))
    else:
        y = _read_view(g, x, shape, src_stride, "si")
    if dst_dt != src_dt:
        y = g.op("cast", y, dtype=dst_dt)
    order = dense_permutation(shape, dst_stride)
    if tuple(dst_stride) != T.contiguous_strides(shape) and order is not None:
        # the destination is a permuted dense block: its storage, in address order, is the
        # values transposed into that order (every element of the span is written once)
        logical = sorted(order)
        y = g.op("reshape", y, shape=tuple(shape[d] for d in logical))
        if order != logical:
            y = g.op("transpose", y, perm=tuple(logical.index(d) for d in order))
        y = g.op("reshape", y, shape=(int(np.prod(shape)),))
    elif tuple(dst_stride) != T.contiguous_strides(shape):
        # pull form over the destination's span: every span element takes the value whose view
        # position lands on it, or keeps its old value (a view never writes one element twice)
        span = T.span_elements(shape, dst_stride)
        base = g.input("dst", (span,), dst_dt)
        flat = g.op("reshape", y, shape=(int(np.prod(shape)),))
        inv = np.full(span, -1, dtype=np.int64)
        inv[strided_index(shape, dst_stride).reshape(-1)] = np.arange(int(np.prod(shape)), dtype=np.int64)
        where_from = g.constant(inv, "inv")
        picked = g.op("index_select", flat, g.op("maximum", where_from, g.constant(np.int64(0), "zero")),
                      axis=0)
        hit = g.op("ge", where_from, g.constant(np.int64(0), "zero"))
        y = g.op("where", hit, picked, base)
    g.output(y)
    return g
