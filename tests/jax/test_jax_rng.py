"""PRNG and bitcast lowering rules, checked bit for bit against ``jax.jit`` on CPU: keys
from ``PRNGKey`` and ``key``, seeds, bits of every width, split, fold_in, the threefry2x32
primitive, both settings of ``jax_threefry_partitionable``, and the distributions built on
them.  (Named apart from tests/layers/test_rng.py: test modules need unique basenames.)"""

from __future__ import annotations

import jax
import jax.extend.random as jxr
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from fornax.frameworks.jax import NotLowerable
from jaxcheck import check_exact as check
from jaxcheck import run_lowered
from helpers import FAMILIES

KEY = jax.random.key(7)
OLD_KEY = jax.random.PRNGKey(42)






# ---- keys and bits -----------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", FAMILIES)
def test_bits_of_one_key_every_vendor(vendor):
    check(lambda k: jax.random.bits(k, (3, 4)), KEY, vendor=vendor)


@pytest.mark.parametrize("key", [KEY, OLD_KEY], ids=["key", "PRNGKey"])
def test_bits_widths_and_shapes(key):
    for dtype in (jnp.uint8, jnp.uint16, jnp.uint32):
        check(lambda k: jax.random.bits(k, (5,), dtype), key)
    check(lambda k: jax.random.bits(k, ()), key)


def test_bits_split_fold_in_of_key_batches():
    keys = jax.random.split(jax.random.key(3), (2, 2))
    check(jax.vmap(jax.vmap(lambda k: jax.random.bits(k, (3,)))), keys)
    check(jax.vmap(jax.vmap(lambda k: jax.random.split(k, (2, 3)))), keys)
    check(jax.vmap(jax.vmap(lambda k, d: jax.random.fold_in(k, d))), keys,
          np.array([[0, 1], [2**32 - 1, 77]], np.uint32))


def test_split_and_fold_in():
    check(lambda k: jax.random.split(k, 3), KEY)
    check(lambda k: jax.random.split(k), OLD_KEY)
    check(lambda k: jax.random.fold_in(k, 5), KEY)
    check(lambda k, d: jax.random.fold_in(k, d), KEY, np.uint32(4_000_000_000))


def test_seeds():
    """random_seed: a seed's high and low 32-bit words (negative seeds wrap)."""
    for s in (0, -5, 2**31 - 1):
        check(lambda s: jax.random.PRNGKey(s), np.int32(s))
    check(lambda s: jax.random.key(s), np.uint32(4_000_000_000))
    check(lambda s: jax.random.key(s), np.int8(-3))
    check(lambda: jax.random.bits(jax.random.PRNGKey(0), (4,)))       # seed as a literal
    with jax.enable_x64(True):
        for s in (-5_000_000_000, 2**40 + 17):
            check(lambda s: jax.random.PRNGKey(s), np.int64(s))


def test_not_partitionable_layout():
    with jax.threefry_partitionable(False):
        check(lambda k: jax.random.bits(k, (3, 5)), KEY)              # odd count: padded
        check(lambda k: jax.random.bits(k, (5,), jnp.uint8), KEY)     # 4 values per word
        check(lambda k: jax.random.bits(k, (3,), jnp.uint16), KEY)
        check(lambda k: jax.random.split(k, 3), KEY)
        check(jax.vmap(lambda k: jax.random.split(k, 2)), jax.random.split(KEY, 3))


def test_threefry2x32_primitive_broadcasts():
    k1, k2 = np.uint32(0x13198A2E), np.uint32(0x03707344)
    x1 = np.array([0, 1, 0xFFFFFFFF, 0x243F6A88], np.uint32)
    x2 = np.array([0, 2, 0xFFFFFFFF, 0x85A308D3], np.uint32)
    check(lambda *a: jxr.threefry2x32_p.bind(*a), k1, k2, x1, x2)
    # the published Random123 known-answer vector for these inputs
    got = run_lowered(lambda *a: jxr.threefry2x32_p.bind(*a), k1, k2, x1[3:], x2[3:])
    assert [int(g[0]) for g in got] == [0xC4923A9C, 0x483DF7A0]


def test_other_prng_impls_are_refused():
    with pytest.raises(NotLowerable, match="RngBitGenerator"):
        run_lowered(lambda k: jax.random.bits(k, (2,)), jax.random.key(0, impl="rbg"))


# ---- bitcast_convert_type ----------------------------------------------------------------------
F32_BITS = np.array([0, 1, 0x3F800000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x80000000,
                     0x807FFFFF, 0x00400000, 0x7F7FFFFF, 0xC0490FDB, 0x00800000], np.uint32)


def test_bitcast_32_bit():
    """uint32/int32 -> float32 (normals, zeros, subnormals, inf, NaN) and back."""
    check(lambda x: lax.bitcast_convert_type(x, jnp.float32), F32_BITS)
    check(lambda x: lax.bitcast_convert_type(x, jnp.float32), F32_BITS.view(np.int32))
    vals = F32_BITS.view(np.float32)
    check(lambda x: lax.bitcast_convert_type(x, jnp.uint32), vals)
    check(lambda x: lax.bitcast_convert_type(x, jnp.int32), vals)
    check(lambda x: lax.bitcast_convert_type(x, jnp.uint32), np.array([-1, 5, -(2**31)], np.int32))


def test_bitcast_16_bit_and_width_changes():
    h = np.array([0, 0x3C00, 0x8001, 0x7C00, 0xFBFF, 0x7E00, 0x0400, 0x03FF], np.uint16)
    b = np.array([0, 0x3F80, 0x8001, 0x7F80, 0xFF7F, 0x7FC0, 0x0080, 0x007F], np.uint16)
    check(lambda x: lax.bitcast_convert_type(x, jnp.float16), h)
    check(lambda x: lax.bitcast_convert_type(x, jnp.bfloat16), b.view(np.int16))
    check(lambda x: lax.bitcast_convert_type(x, jnp.int16), h.view(np.float16))
    check(lambda x: lax.bitcast_convert_type(x, jnp.uint16), b.view(ml_dtypes.bfloat16))
    check(lambda x: lax.bitcast_convert_type(x, jnp.uint8),
          np.array([0x01020304, 0xFFFFFFFF, 0x80000000], np.uint32))
    check(lambda x: lax.bitcast_convert_type(x, jnp.float32), h.reshape(4, 2))
    check(lambda x: lax.bitcast_convert_type(x, jnp.int32), np.array([[1, 2, 3, 255]], np.uint8))


def test_bitcast_64_bit():
    x = np.array([0, -0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, 5e-324, -3e-310, 1.7e308,
                  2.2250738585072014e-308, 1 / 3], np.float64)
    with jax.enable_x64(True):
        check(lambda x: lax.bitcast_convert_type(x, jnp.int64), x)
        check(lambda x: lax.bitcast_convert_type(x, jnp.float64), x.view(np.int64))
        check(lambda x: lax.bitcast_convert_type(x, jnp.uint32), x)
        check(lambda x: lax.bitcast_convert_type(x, jnp.float64),
              np.array([[1, 2], [0xFFFFFFFF, 0x7FEFFFFF]], np.uint32))
        check(lambda x: lax.bitcast_convert_type(x, jnp.int8),
              np.array([-1, 2**62 + 3, -(2**63)], np.int64))


# ---- distributions (they also use elementwise rules lowered elsewhere) -------------------------
@pytest.mark.parametrize("key", [KEY, OLD_KEY], ids=["key", "PRNGKey"])
def test_distributions(key):
    check(lambda k: jax.random.uniform(k, (4, 3)), key)
    check(lambda k: jax.random.normal(k, (5,)), key)
    check(lambda k: jax.random.bernoulli(k, 0.3, (8,)), key)
    check(lambda k: jax.random.randint(k, (6,), -3, 9), key)


def test_dropout_and_key_plumbing():
    def dropout(k, x, keep_prob):
        k1, k2 = jax.random.split(jax.random.fold_in(k, 3))
        keep = jax.random.bernoulli(k1, keep_prob, x.shape)
        return jnp.where(keep, x / keep_prob, 0.0), jax.random.uniform(k2, (2,))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = np.float32(0.75)
    check(dropout, KEY, x, p)
    check(lambda x, p: dropout(jax.random.PRNGKey(0), x, p), x, p)


def test_categorical_and_permutation():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    check(lambda k, lg: jax.random.categorical(k, lg, shape=(6,)), KEY, logits)
    check(lambda k: jax.random.permutation(k, 8), KEY)
