"""A zoo of JAX programs on every vendor family, each against jax.jit on CPU, with no host
fallback: an MLP, an attention block, a small CNN, a training loop with plain-jax SGD,
functions with cond/while/scan and custom_vjp, and bfloat16 versions within bf16 tolerance."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import fornax.frameworks.jax as fj
from helpers import FAMILIES

VENDORS = FAMILIES


@functools.lru_cache(maxsize=None)
def client(vendor):
    return fj.Client.for_vendor(vendor)


def init(seed, *shapes, scale=0.3):
    rs = np.random.RandomState(seed)
    return [(rs.randn(*s) * scale).astype(np.float32) for s in shapes]


def check(vendor, fn, *args, rtol=2e-5, atol=2e-6):
    c = client(vendor)
    got = fj.jit(fn, stack=c)(*args)
    want = jax.jit(fn)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=atol)
    fbs = c.report()["fallbacks"]
    assert not fbs, fbs
    return got


# ---- the programs ---------------------------------------------------------------------------------------
def mlp(params, x):
    (w1, b1), (w2, b2) = params
    return jax.nn.relu(x @ w1 + b1) @ w2 + b2


def layer_norm(x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


def attention_block(params, x, heads=2):
    wqkv, wo, w1, w2 = params
    t, d = x.shape[-2:]
    q, k, v = jnp.split(layer_norm(x) @ wqkv, 3, axis=-1)
    split = lambda z: z.reshape(*z.shape[:-1], heads, d // heads).swapaxes(-2, -3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    s = jnp.einsum("...qd,...kd->...qk", q, k) / np.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    a = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1) @ v
    h = x + a.swapaxes(-2, -3).reshape(x.shape) @ wo
    return h + jax.nn.gelu(layer_norm(h) @ w1, approximate=False) @ w2


def cnn(params, x):
    w1, w2, wd = params
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    h = h[:, ::2, ::2, :]                   # a strided subsample
    h = jax.nn.relu(lax.conv_general_dilated(h, w2, (2, 2), "SAME", dimension_numbers=dn))
    return h.mean(axis=(1, 2)) @ wd


def xent(logits, labels):
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()


def sgd_train(params, x, y, steps=4, lr=0.1):
    def loss(p):
        return xent(mlp(p, x), y)

    def step(p, _):
        val, g = jax.value_and_grad(loss)(p)
        return jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), val
    return lax.scan(step, params, None, length=steps)


@jax.custom_vjp
def scaled_tanh(x):
    return jnp.tanh(x) * 2.0


scaled_tanh.defvjp(lambda x: (scaled_tanh(x), x), lambda x, g: (g * 2.0 * (1 - jnp.tanh(x) ** 2),))


def control(x, n):
    y = lax.cond(x.sum() > 0, lambda v: scaled_tanh(v), lambda v: -v, x)
    i, y = lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 0.9 + 0.1), (0, y))
    cum, ys = lax.scan(lambda c, v: (c + v, c * v), jnp.zeros((), x.dtype), y)
    return i, cum, ys


def differentiable_control(x):
    """cond, a fori_loop with static bounds (a scan under grad), scan and custom_vjp."""
    y = lax.cond(x.sum() > 0, lambda v: scaled_tanh(v), lambda v: -v, x)
    y = lax.fori_loop(0, 3, lambda i, v: v * 0.9 + 0.1 * jnp.sin(v), y)
    cum, ys = lax.scan(lambda c, v: (c + v, c * v), jnp.zeros((), x.dtype), y)
    return cum + ys.sum()


# ---- the tests ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", VENDORS)
def test_mlp_forward_and_grad(vendor):
    w1, b1, w2, b2 = init(0, (16, 32), (32,), (32, 8), (8,))
    params = ((w1, b1), (w2, b2))
    x = init(1, (4, 16), scale=1.0)[0]
    check(vendor, mlp, params, x)
    check(vendor, jax.grad(lambda p, x: (mlp(p, x) ** 2).mean()), params, x, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("vendor", VENDORS)
def test_attention_block_forward_and_grad(vendor):
    d, t, ff = 16, 8, 32
    params = init(2, (d, 3 * d), (d, d), (d, ff), (ff, d))
    x = init(3, (2, t, d), scale=1.0)[0]
    check(vendor, attention_block, params, x, rtol=1e-4, atol=1e-5)
    check(vendor, jax.grad(lambda p, x: attention_block(p, x).sum()), params, x, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("vendor", VENDORS)
def test_small_cnn_forward_and_grad(vendor):
    params = init(4, (3, 3, 2, 4), (3, 3, 4, 4), (4, 3))
    x = init(5, (2, 8, 8, 2), scale=1.0)[0]
    check(vendor, cnn, params, x, rtol=1e-4, atol=1e-5)
    check(vendor, jax.grad(lambda p, x: (cnn(p, x) ** 2).sum()), params, x, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("vendor", VENDORS)
def test_training_loop_plain_sgd(vendor):
    w1, b1, w2, b2 = init(6, (8, 16), (16,), (16, 4), (4,))
    x = init(7, (6, 8), scale=1.0)[0]
    y = np.array([0, 1, 2, 3, 1, 0], np.int32)
    params, losses = check(vendor, sgd_train, ((w1, b1), (w2, b2)), x, y, rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("vendor", VENDORS)
def test_cond_while_scan_custom_vjp(vendor):
    x = init(8, (5,), scale=1.0)[0]
    check(vendor, control, x, 3)
    check(vendor, control, -np.abs(x), 2)
    check(vendor, jax.grad(differentiable_control), np.abs(x), rtol=1e-5, atol=1e-6)
    check(vendor, jax.grad(differentiable_control), -np.abs(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vendor", VENDORS)
def test_bfloat16_matches_xla_within_bf16_tolerance(vendor):
    w1, b1, w2, b2 = init(9, (16, 32), (32,), (32, 8), (8,))
    bf = lambda a: a.astype(jnp.bfloat16)   # noqa: E731
    params = ((bf(w1), bf(b1)), (bf(w2), bf(b2)))
    x = bf(init(10, (4, 16), scale=1.0)[0])
    got = check(vendor, mlp, params, x, rtol=2 ** -7, atol=2 ** -7)
    assert got.dtype == jnp.bfloat16
    d = 16
    aparams = [bf(p) for p in init(11, (d, 3 * d), (d, d), (d, 32), (32, d))]
    xa = bf(init(12, (8, d), scale=1.0)[0])
    check(vendor, attention_block, aparams, xa, rtol=2 ** -6, atol=2 ** -6)
