"""Property tests: random shapes, dtypes and programs through fornax.frameworks.jax.jit, each
against jax.jit on CPU, with no host fallback."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fornax.frameworks.jax as fj

CLIENT = fj.Client.for_vendor("cuda-like")
DTYPES = {"float32": (np.float32, 2e-6), "bfloat16": (jnp.bfloat16, 2 ** -7), "int32": (np.int32, 0),
          "float16": (np.float16, 2 ** -10)}
BINARY = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum,
          "min": jnp.minimum, "where_gt": lambda a, b: jnp.where(a > b, a, b * 2)}
UNARY_FLOAT = {"exp": lambda x: jnp.exp(x / 4), "tanh": jnp.tanh, "logistic": jax.nn.sigmoid,
               "erf": jax.lax.erf, "sqrt_abs": lambda x: jnp.sqrt(jnp.abs(x))}
shapes = st.lists(st.integers(1, 5), min_size=0, max_size=3).map(tuple)


def _data(rs, shape, dtype):
    if np.dtype(dtype).kind == "i":
        return rs.randint(-50, 50, size=shape).astype(dtype)
    return np.asarray(rs.randn(*shape)).astype(dtype)


def _same(fn, *args, tol):
    got = fj.jit(fn, stack=CLIENT)(*args)
    want = jax.jit(fn)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol)
    assert not CLIENT.report()["fallbacks"], CLIENT.report()["fallbacks"]


@settings(max_examples=20, deadline=None, derandomize=True)
@given(shape=shapes, dtype=st.sampled_from(sorted(DTYPES)), op=st.sampled_from(sorted(BINARY)),
       broadcast=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_binary_ops_with_broadcasting(shape, dtype, op, broadcast, seed):
    dt, tol = DTYPES[dtype]
    rs = np.random.RandomState(seed)
    a = _data(rs, shape, dt)
    b = _data(rs, shape[-1:] if broadcast and shape else shape, dt)
    _same(BINARY[op], a, b, tol=tol)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(shape=shapes, dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
       op=st.sampled_from(sorted(UNARY_FLOAT)), seed=st.integers(0, 2 ** 16))
def test_unary_float_ops(shape, dtype, op, seed):
    dt, tol = DTYPES[dtype]
    x = _data(np.random.RandomState(seed), shape, dt)
    _same(UNARY_FLOAT[op], x, tol=max(tol, 2e-6) * 2)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple), data=st.data(),
       dtype=st.sampled_from(["float32", "int32", "bfloat16"]), seed=st.integers(0, 2 ** 16))
def test_reductions_and_layout(shape, data, dtype, seed):
    dt, tol = DTYPES[dtype]
    axis = data.draw(st.integers(0, len(shape) - 1))
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    x = _data(np.random.RandomState(seed), shape, dt)

    def f(v):
        t = jnp.transpose(v, perm)
        return (v.sum(axis=axis), v.max(axis=axis), jnp.argmax(v, axis=axis), t * 2,
                jnp.cumsum(v, axis=axis), v.reshape(-1)[::2])
    # sums of bfloat16 accumulate in float32 and round once: within a few bf16 ulps of XLA's
    _same(f, x, tol=tol * 8 if dtype == "bfloat16" else max(tol, 1e-5))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(m=st.integers(1, 6), k=st.integers(1, 8), n=st.integers(1, 6), batch=st.integers(0, 2),
       seed=st.integers(0, 2 ** 16))
def test_matmul_and_its_gradient(m, k, n, batch, seed):
    rs = np.random.RandomState(seed)
    lead = (2,) * batch
    a, b = rs.randn(*lead, m, k).astype(np.float32), rs.randn(*lead, k, n).astype(np.float32)
    _same(lambda x, y: x @ y, a, b, tol=1e-5)
    _same(jax.grad(lambda x, y: jnp.sum(jnp.tanh(x @ y)), argnums=(0, 1)), a, b, tol=1e-5)
