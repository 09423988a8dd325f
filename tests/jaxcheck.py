"""Run a jax function's jaxpr, lowered straight into one fornax graph, on a composed stack
(the rule-level check of the JAX lowering table; the end-to-end path is
``fornax.frameworks.jax.jit``)."""

from __future__ import annotations

import functools

import jax
import ml_dtypes
import numpy as np

from fornax.frameworks.jax import lowering as L
from fornax.layers.graph import Graph
from fornax.stack import compose, make_config


@functools.lru_cache(maxsize=None)
def stack_for(vendor: str):
    return compose(make_config(vendor))


def run_lowered(fn, *args, vendor: str = "cuda-like"):
    """``fn(*args)`` lowered into one graph and run on ``vendor``'s stack; returns the flat
    list of results as numpy arrays (key arrays as key arrays)."""
    closed = jax.make_jaxpr(fn)(*args)
    flat = jax.tree_util.tree_leaves(args)
    g = Graph("jaxcheck")
    ctx = L.LowerCtx(g)
    feeds, ins = {}, []
    for i, (var, x) in enumerate(zip(closed.jaxpr.invars, flat)):
        v = g.input(f"in{i}", L.device_shape(var.aval), L.device_dtype(var.aval.dtype))
        feeds[v.name] = L.to_device_array(x, var.aval)
        ins.append(v)
    outs = L.lower_jaxpr(ctx, closed.jaxpr, list(closed.consts), ins)
    g.output(*outs)
    res = stack_for(vendor).run(g, feeds)
    return [L.from_device_array(a, var.aval) for a, var in zip(res.outputs, closed.jaxpr.outvars)]


def data(x):
    """Key arrays compare by their data; everything else as it is."""
    if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def check_exact(fn, *args, vendor: str = "cuda-like"):
    """``fn`` lowered and run equals ``jax.jit(fn)`` exactly: same dtypes and shapes, floats
    compared bit for bit, key arrays by their data."""
    want = [data(w) for w in jax.tree_util.tree_leaves(jax.jit(fn)(*args))]
    got = [data(g) for g in run_lowered(fn, *args, vendor=vendor)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f" or w.dtype == ml_dtypes.bfloat16:
            g, w = g.view(f"u{w.dtype.itemsize}"), w.view(f"u{w.dtype.itemsize}")
        np.testing.assert_array_equal(g, w)
