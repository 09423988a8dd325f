"""Library routines against float64 references over random shapes and dtypes (hypothesis).

Tolerances are the documented ones of ``fornax.contracts.library`` (per output dtype, plus the
worst-case error of a float32 accumulation over the reduction length).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fornax.contracts.base import Subject
from fornax.contracts.library import check_close, gemm_bound, random_operand
from fornax.stack import get_vendor
from helpers import FAMILIES

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _library(vendor: str):
    s = Subject(get_vendor(vendor))
    rt = s.runtime()
    return rt, s.vendor.library(rt)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return (request.param, *_library(request.param))


@SETTINGS
@given(m=st.integers(1, 80), n=st.integers(1, 80), k=st.integers(1, 300), batch=st.integers(1, 3),
       b_batched=st.booleans(), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       seed=st.integers(0, 2**31))
def test_gemm_matches_float64(family, m, n, k, batch, b_batched, dtype, seed):
    vendor, rt, lib = family
    rng = np.random.default_rng(seed)
    a = random_operand(rng, (batch, m, k), dtype)
    b = random_operand(rng, (batch if b_batched else 1, k, n), dtype)
    pa, pb, pc = rt.malloc(a.nbytes), rt.malloc(b.nbytes), rt.malloc(batch * m * n * a.itemsize)
    rt.memcpy_h2d(pa, a)
    rt.memcpy_h2d(pb, b)
    lib.gemm(pa, pb, pc, {"m": m, "n": n, "k": k, "batch": batch, "b_batched": b_batched, "dtype": dtype})
    out = np.empty((batch, m, n), a.dtype)
    rt.memcpy_d2h(out, pc)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    check_close(f"{vendor} {dtype} gemm {batch}x{m}x{n}x{k}", out, ref, gemm_bound(a64, b64, ref, k, dtype))
    for p in (pa, pb, pc):
        rt.free(p)


@pytest.mark.parametrize("vendor", FAMILIES)
def test_float16_gemm_is_closer_than_float16_accumulation_allows(vendor):
    """Independent of the bound's formula: with k=1024 the float32-accumulated result differs from
    the float64 reference by little more than one float16 rounding, while summing in float16 is
    several times worse."""
    rt, lib = _library(vendor)
    rng = np.random.default_rng(1)
    m, n, k = 16, 16, 1024
    a = rng.uniform(0, 1, (1, m, k)).astype(np.float16)
    b = rng.uniform(0, 1, (1, k, n)).astype(np.float16)
    pa, pb, pc = rt.malloc(a.nbytes), rt.malloc(b.nbytes), rt.malloc(m * n * 2)
    rt.memcpy_h2d(pa, a)
    rt.memcpy_h2d(pb, b)
    lib.gemm(pa, pb, pc, {"m": m, "n": n, "k": k, "dtype": "float16"})
    out = np.empty((1, m, n), np.float16)
    rt.memcpy_d2h(out, pc)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    rel = np.abs(out - ref) / ref
    assert rel.max() <= 2.0 ** -11 * 1.01                      # one float16 rounding of the result
    acc = np.zeros((1, m, n), np.float16)
    for i in range(k):
        acc = (acc + a[:, :, i:i + 1] * b[:, i:i + 1, :]).astype(np.float16)
    assert (np.abs(acc - ref) / ref).max() > 4 * 2.0 ** -11   # what a float16 accumulator gives
