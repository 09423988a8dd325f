"""Counter-based RNG (Threefry-2x32): known-answer vectors, JAX agreement, device bit-exactness,
determinism and distribution sanity on all three vendor stacks."""

import numpy as np
import pytest

from fornax.layers.errors import GraphError
from fornax.layers.graph import DType, Graph
from fornax.layers.nn_ops import threefry2x32
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = list(FAMILIES)

# Random123 known-answer vectors for threefry2x32_20 (key, counter, expected output words)
KAT = [((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
       ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
       ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]


@pytest.mark.parametrize("key,ctr,expect", KAT)
def test_threefry_known_answers(key, ctr, expect):
    x0, x1 = threefry2x32(key, np.array([ctr[0]]), np.array([ctr[1]]))
    assert (int(x0[0]), int(x1[0])) == expect


def test_random_bits_reference_matches_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_threefry_partitionable", True)
    g = Graph("bits")
    key = g.input("key", (2,), DType.INT64)
    g.output(g.op("random_bits", key, shape=(4, 33)))
    for seed in (0, 1234, 2**31 + 5):
        k = jax.random.PRNGKey(seed)
        expect = np.asarray(jax.random.bits(k, (4, 33), dtype=np.uint32)).astype(np.int64)
        (got,) = g.reference({"key": np.asarray(k).astype(np.int64)})
        np.testing.assert_array_equal(got, expect)


def _rng_graph(n=4096):
    g = Graph("rng")
    key = g.input("key", (2,), DType.INT64)
    g.output(g.op("random_bits", key, shape=(3, 50)),
             g.op("random_bits", key, shape=(3, 50), offset=7),
             g.op("random_uniform", key, shape=(n,), minval=-2.0, maxval=3.0),
             g.op("random_normal", key, shape=(n,)),
             g.op("random_normal", key, shape=(n,), dtype="float64", offset=n))
    return g


@pytest.mark.parametrize("vendor", VENDORS)
def test_device_rng_bit_exact_and_deterministic(vendor):
    g = _rng_graph()
    feeds = {"key": np.array([0x13198A2E, 0x03707344], dtype=np.int64)}
    stack = compose(make_config(vendor, spec="tiny"))
    first = stack.run(g, feeds)
    assert first.fallbacks == []
    bits, bits7, uni, nrm, nrm64 = first.outputs
    # bits: the xor of both Threefry words of counter i, computed here independently
    ctr = np.arange(150, dtype=np.int64)
    w0, w1 = threefry2x32(tuple(feeds["key"]), ctr >> 32, ctr & 0xFFFFFFFF)
    np.testing.assert_array_equal(bits, (w0 ^ w1).reshape(3, 50))
    assert bits.min() >= 0 and bits.max() < 2**32
    # a counter offset is the same stream, shifted
    np.testing.assert_array_equal(bits7.reshape(-1)[:143], bits.reshape(-1)[7:])
    ref = g.reference(feeds)
    np.testing.assert_allclose(uni, ref[2], rtol=0, atol=1e-6)
    np.testing.assert_allclose(nrm, ref[3], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nrm64, ref[4], rtol=1e-12, atol=1e-12)
    assert uni.dtype == np.float32 and nrm64.dtype == np.float64
    second = stack.run(g, feeds)
    for a, b in zip(first.outputs, second.outputs):
        np.testing.assert_array_equal(a, b)
    other = stack.run(g, {"key": np.array([1, 2], dtype=np.int64)})
    assert (other.outputs[0] != bits).mean() > 0.99


def test_distribution_sanity():
    n = 1 << 16
    g = Graph("dist")
    key = g.input("key", (2,), DType.INT64)
    g.output(g.op("random_uniform", key, shape=(n,)), g.op("random_normal", key, shape=(n,)),
             g.op("random_bits", key, shape=(n,)))
    u, z, bits = g.reference({"key": np.array([0, 42], dtype=np.int64)})
    assert 0.0 <= u.min() and u.max() < 1.0
    # 6 sigma bounds: mean of U(0,1) has sd sqrt(1/12/n); variance estimate sd ~ sqrt(1/180/n)
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 6 * np.sqrt(1 / 180 / n)
    assert abs(z.mean()) < 6 / np.sqrt(n)
    assert abs(z.var() - 1) < 6 * np.sqrt(2 / n)
    assert abs((np.abs(z) < 1).mean() - 0.682689) < 0.01
    # every bit position is fair
    frac = ((bits[:, None] >> np.arange(32)) & 1).mean(axis=0)
    assert np.all(np.abs(frac - 0.5) < 6 * 0.5 / np.sqrt(n))
    assert len(np.unique(bits)) > n - 5


@pytest.mark.parametrize("make,msg", [
    (lambda g: g.op("random_bits", g.input("k", (3,), DType.INT64), shape=(4,)), "key must be int64"),
    (lambda g: g.op("random_bits", g.input("k", (2,), DType.INT32), shape=(4,)), "key must be int64"),
    (lambda g: g.op("random_bits", g.input("k", (2,), DType.INT64), shape=(0, 4)), "positive ints"),
    (lambda g: g.op("random_bits", g.input("k", (2,), DType.INT64), shape=(4,), offset=-1), "offset"),
    (lambda g: g.op("random_uniform", g.input("k", (2,), DType.INT64), shape=(4,), dtype="float16"),
     "float32 or float64"),
    (lambda g: g.op("random_uniform", g.input("k", (2,), DType.INT64), shape=(4,), minval=1.0, maxval=1.0),
     "minval < maxval"),
])
def test_rng_verifier_messages(make, msg):
    with pytest.raises(GraphError, match=msg):
        make(Graph("bad"))
