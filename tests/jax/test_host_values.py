"""Values with no fornax device dtype (complex, uint64) stay on the host between the
host-fallback equations that make and use them, each fallback named in the report; a
function transformed by ``jax.pmap`` runs through ``fornax.frameworks.jax.jit`` too."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fornax.frameworks.jax as fj

X = jnp.arange(8.0, dtype=jnp.float32)
CASES = {
    "complex intermediate": (lambda v: jnp.abs(jnp.fft.fft(v)), (X,)),
    "complex argument": (lambda z: jnp.real(z * 2) + 1, (jnp.arange(4.0) + 1j,)),
    "complex result": (lambda v: jnp.fft.fft(v) * 2, (X,)),
    "scan carrying a complex value": (
        lambda v: jax.lax.scan(lambda c, t: (c * (1 + 1j) + t, c.real), jnp.complex64(0), v)[1], (X,)),
    "gradient through an fft": (jax.grad(lambda v: jnp.sum(jnp.abs(jnp.fft.fft(v)) ** 2)), (X,)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_complex_values_run_as_named_host_fallbacks(case):
    fn, args = CASES[case]
    stack = fj.Client.for_vendor("rocm-like")
    got, want = fj.jit(fn, stack=stack)(*args), jax.jit(fn)(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    fallbacks = stack.report()["fallbacks"]
    assert fallbacks and all("complex" in f["reason"] or "no fornax lowering" in f["reason"]
                             for f in fallbacks), fallbacks


def test_a_pmapped_function_runs_under_fornax_jit():
    f = jax.pmap(lambda v: jnp.sin(v) * 2)
    x = jnp.ones((1, 4))
    stack = fj.Client.for_vendor("xpu-like")
    np.testing.assert_allclose(np.asarray(fj.jit(f, stack=stack)(x)), np.asarray(f(x)), rtol=1e-6)
    assert [f["primitive"] for f in stack.report()["fallbacks"]] == ["shard_map"]
