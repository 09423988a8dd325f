"""The JAX ecosystem through fornax.frameworks.jax.jit: equinox models (a CNN with
max-pooling, an attention block, a GRU over lax.scan) and optax optimisers with schedules
(adamw + warm-up cosine, sgd + momentum + piecewise/exponential), on every vendor family,
against jax.jit on the CPU, with no host fallback; and the windowed primitives behind
pooling (reduce_window_*, select_and_scatter_add, select_and_gather_add) lowered to the
device, bit for bit where XLA's CPU result is exact."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import fornax.frameworks.jax as fj
from fornax.frameworks.jax import windows
from fornax.layers.errors import ConfigError
from fornax.scenarios import jax_zoo

VENDORS = jax_zoo.FAMILIES


@functools.cache
def _result(name: str, vendor: str) -> jax_zoo.ZooResult:
    return jax_zoo.run_program(name, vendor)


# ---- the zoo -------------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("name", list(jax_zoo.ZOO))
def test_zoo_program_matches_jax_jit_without_host_fallbacks(name, vendor):
    r = _result(name, vendor)
    assert r.error == ""
    assert r.fallbacks == []
    ref, _ = jax_zoo._reference(name, 0)
    assert set(r.errors) == set(ref)
    for out, e in r.errors.items():
        assert e["normwise"] <= r.tolerance, (out, e)
        assert e["leaves"] == len(jax.tree_util.tree_leaves(ref[out]))
    assert r.ok
    assert r.counts["executions"] >= 1 and r.counts["host_fallback_runs"] == 0


@pytest.mark.parametrize("vendor", VENDORS)
def test_max_pooling_and_its_gradient_run_on_the_device(vendor):
    r = _result("cnn", vendor)
    assert {"reduce_window_max", "select_and_scatter_add", "conv_general_dilated"} <= set(r.device_primitives)
    assert not [f for f in r.fallbacks if f["primitive"] in ("reduce_window_max", "select_and_scatter_add")]
    assert r.routes == {"native": r.routes["native"]}          # no fallback, no control route


def test_scan_rnn_is_driven_from_the_host_around_device_segments():
    r = _result("gru-scan", "cuda-like")
    assert r.routes.get("control", 0) >= 2                     # the forward scan and the gradient's
    assert r.counts["host_loop_iterations"] >= 3 * 10          # forward, and forward + reverse in the grad
    assert "logistic" in r.device_primitives and "tanh" in r.device_primitives


def test_training_programs_train():
    for name in ("adamw-cosine", "sgd-momentum-schedule"):
        ref, _ = jax_zoo._reference(name, 0)
        losses = np.asarray(ref["losses"])
        assert losses[-1] < 0.95 * losses[0], (name, losses)
    # warm-up from 0: the first adamw step changes nothing (lr 0), so the second loss repeats the first
    ref, _ = jax_zoo._reference("adamw-cosine", 0)
    assert ref["losses"][0] == ref["losses"][1]


def test_result_json_and_errors():
    r = _result("cnn", "rocm-like")
    js = json.loads(json.dumps(r.to_json()))
    assert js["program"] == "cnn" and js["vendor"] == "rocm-like" and js["ok"] is True
    assert set(js["errors"]) == {"logits", "loss", "grads"} and js["fallbacks"] == []
    assert r.worst[0] in js["errors"]
    with pytest.raises(ConfigError, match="unknown jax zoo program 'vgg'; available: cnn"):
        jax_zoo.run_program("vgg")
    with pytest.raises(ConfigError, match="unknown vendor family 'tpu-like'"):
        jax_zoo.run_program("cnn", "tpu-like")


def test_a_failing_output_is_not_ok():
    r = jax_zoo.ZooResult("cnn", "cuda-like", 1e-4, errors={"loss": {"max_abs": 1.0, "normwise": 0.5, "leaves": 1}})
    assert not r.ok and r.worst == ("loss", 0.5)
    r = jax_zoo.ZooResult("cnn", "cuda-like", 1e-4, errors={"loss": {"max_abs": 0, "normwise": 0, "leaves": 1}},
                          fallbacks=[{"primitive": "erfc", "count": 1, "reason": "x"}])
    assert not r.ok


# ---- the window rules ----------------------------------------------------------------------------
_X = np.random.default_rng(0).standard_normal((2, 9, 10, 3)).astype(np.float32)
_PAD = ((0, 0), (1, 1), (1, 1), (0, 0))


def _max_pool(x, pad=_PAD, window=(1, 3, 3, 1), strides=(1, 2, 2, 1), **kw):
    return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pad, **kw)


EXACT = {
    "max": _max_pool,
    "max-dilated": lambda x: _max_pool(x, ((0, 0), (2, 1), (1, 1), (0, 0)), window_dilation=(1, 2, 1, 1),
                                       base_dilation=(1, 1, 2, 1)),
    "min-same": lambda x: lax.reduce_window(x, jnp.inf, lax.min, (1, 2, 3, 1), (1, 2, 1, 1), "SAME"),
    "generic-mul": lambda x: lax.reduce_window(x, 1., lax.mul, (1, 2, 2, 1), (1, 2, 2, 1), "SAME"),
    "generic-pair": lambda x: lax.reduce_window((x, 2 * x), (0., -jnp.inf),
                                                lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])),
                                                (1, 2, 2, 1), (1, 1, 2, 1), "SAME"),
    "sum-int8": lambda x: lax.reduce_window((x * 50).astype(jnp.int8), jnp.int8(0), lax.add, (1, 3, 3, 1),
                                            (1, 1, 1, 1), "VALID"),
    "max-uint8": lambda x: lax.reduce_window((jnp.abs(x) * 50).astype(jnp.uint8), jnp.uint8(0), lax.max,
                                             (1, 3, 3, 1), (1, 1, 1, 1), "SAME"),
    "max-bool": lambda x: lax.reduce_window(x > 0, False, lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "VALID"),
    "sum-float16": lambda x: lax.reduce_window(x.astype(jnp.float16), jnp.float16(0), lax.add, (1, 3, 3, 1),
                                               (1, 1, 1, 1), "SAME"),
    # ties (rounded values): the first maximum of each window takes the whole gradient
    "grad-ties": jax.grad(lambda x: jnp.sum(_max_pool(jnp.round(x), window=(1, 3, 3, 1), strides=(1, 1, 1, 1)))),
    "grad-bfloat16": lambda x: jax.grad(lambda v: jnp.sum(_max_pool(v).astype(jnp.float32) * 3))(
        x.astype(jnp.bfloat16)),
    # windows lying wholly in the padding select nothing
    "grad-padding-only": jax.grad(lambda x: jnp.sum(_max_pool(x, ((0, 0), (3, 3), (2, 2), (0, 0)),
                                                              window=(1, 2, 2, 1), strides=(1, 3, 3, 1)))),
    "grad-min": jax.grad(lambda x: jnp.sum(lax.reduce_window(x, jnp.inf, lax.min, (1, 3, 2, 1), (1, 1, 1, 1),
                                                             "SAME") * 2)),
    "jvp-max": lambda x: jax.jvp(lambda v: _max_pool(v, ((0, 0), (2, 1), (1, 1), (0, 0)),
                                                     base_dilation=(1, 2, 1, 1)), (x,), (3 * x,))[1],
}


def _run_exact(fn, x):
    want = jax.jit(fn)(x)
    got = fj.jit(fn, stack="cuda-like")(x)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("case", list(EXACT))
def test_window_rule_is_bit_exact(case):
    before = fj.report("cuda-like")["fallbacks"]
    _run_exact(EXACT[case], jnp.asarray(_X))
    assert fj.report("cuda-like")["fallbacks"] == before


def test_max_pool_with_nan_matches_xla():
    x = _X[:, :7, :6, :1].copy()
    x[0, 2, 3, 0] = x[1, 0, 0, 0] = x[1, 4, 4, 0] = x[1, 4, 5, 0] = np.nan
    x = jnp.asarray(x)
    for fn in (_max_pool, jax.grad(lambda v: jnp.sum(_max_pool(v)))):
        want, got = jax.jit(fn)(x), fj.jit(fn, stack="xpu-like")(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))        # NaN where XLA has NaN


def test_bfloat16_max_pool_gradient_with_overlapping_windows_within_one_ulp():
    """Overlapping windows selecting one element: summed in float32 and rounded once (XLA CPU
    may round after each add), so within one bfloat16 ulp of the result."""
    fn = lambda x: jax.grad(lambda v: jnp.sum(jnp.sin(_max_pool(v, "SAME", strides=(1, 1, 1, 1)))
                                              .astype(jnp.float32) * 1.37))(x.astype(jnp.bfloat16))
    x = jnp.asarray(_X)
    want = np.asarray(jax.jit(fn)(x), np.float32)
    got = np.asarray(fj.jit(fn, stack="cuda-like")(x), np.float32)
    assert got.dtype == want.dtype and np.abs(want).max() > 1
    np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=0)


def test_overlapping_sum_pool_gradient():
    fn = jax.grad(lambda x: jnp.sum(jnp.sin(lax.reduce_window(x, 0., lax.add, (1, 3, 3, 1), (1, 2, 2, 1),
                                                              "SAME"))))
    x = jnp.asarray(_X)
    np.testing.assert_allclose(np.asarray(fj.jit(fn, stack="rocm-like")(x)), np.asarray(jax.jit(fn)(x)),
                               rtol=1e-6, atol=1e-6)
    prims = {r["primitive"]: r["route"] for r in fj.report("rocm-like")["primitives"]}
    assert prims["reduce_window_sum"] == "native" and prims["pad"] == "native"


def test_a_window_too_large_to_unroll_runs_on_the_host_with_the_reason():
    x = jnp.asarray(_X[0, :, :, 0])
    fn = lambda v: lax.reduce_window(v, 0., lax.add, (65, 65), (1, 1), "SAME")
    c = fj.Client.for_vendor("cuda-like")
    np.testing.assert_allclose(np.asarray(fj.jit(fn, stack=c)(x)), np.asarray(jax.jit(fn)(x)), rtol=1e-6)
    (fb,) = c.report()["fallbacks"]
    assert fb["primitive"] == "reduce_window_sum"
    assert f"a window of 4225 elements (65x65); fornax unrolls at most {windows.MAX_TAPS}" in fb["reason"]
