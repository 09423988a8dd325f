"""The GEMM fast path (fornax.sim.fastpath) against the interpreter, bit for bit.

The library's tiled GEMM kernels (and the split-K reduction) launch four times on fresh
data through a replay cache with the fast path on and through the plain interpreter: the
first launch runs plainly, the second records, the third and fourth take the fast path.
Every output byte, every counter and every touched range must agree, over random shapes,
dtypes, layouts, tiles, epilogues and split-K orders."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_paths import Buffers as Space    # each array 64 bytes into a mapping of its own

from fornax.layers import blas
from fornax.sim import fastpath, isa
from fornax.sim.execute import execute
from fornax.sim.faults import PageFault
from fornax.sim.replay import ReplayCache

LAUNCHES = 4
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float64": np.float64}


def _counts(c):
    return (c.instances, dict(c.matrix_flops), dict(c.vector_flops), c.bytes_read, c.bytes_written,
            c.instructions, dict(c.read_ranges), dict(c.write_ranges))


def _launches(v: blas.GemmVariant, m: int, n: int, k: int, batch: int, seed: int, replays,
              alpha: float = 0.75):
    """Four launches of the main kernel (and the reduction of a split-K variant) on fresh
    data; per launch, the output bytes and the counters."""
    main = blas.gemm_program("g", v, 64)
    red = blas.reduce_program("r", v, 64) if v.split > 1 else None
    g_main, g_red = blas.grids(v, m, n, batch)
    dt, out = DTYPES[v.dtype], DTYPES[v.out]
    results = []
    for t in range(LAUNCHES):
        rng = np.random.default_rng(seed * 10 + t)
        sp = Space()
        a = rng.standard_normal((batch, k, m) if v.trans_a else (batch, m, k)).astype(dt)
        b = rng.standard_normal((batch if v.b_batched else 1, n, k) if v.trans_b
                                else (batch if v.b_batched else 1, k, n)).astype(dt)
        c0 = rng.standard_normal((batch, m, n)).astype(out)
        args = {"a": sp.put(a), "b": sp.put(b), "m": m, "n": n, "k": k,
                "sa": m * k, "sb": k * n if v.b_batched else 0, "sc": m * n, "alpha": alpha}
        if v.beta:
            args["beta"] = -0.5
        if v.bias:
            args["bias"] = sp.put(rng.standard_normal(n).astype(out))
        c = sp.put(c0)
        record = []
        if v.split > 1:
            ks = math.ceil(k / v.split)
            order = rng.permutation(v.split).astype(np.int64)
            ws = sp.put(np.zeros(v.split * batch * m * n, DTYPES[v.acc]))
            o = sp.put(order)
            main_args = {k_: args[k_] for k_ in ("a", "b", "m", "n", "k", "sa", "sb", "sc")}
            record.append(_counts(execute(main, g_main, {**main_args, "c": ws, "ks": ks}, sp.space, replays)))
            red_args = {"ws": ws, "order": o, "c": c, "m": m, "n": n, "sc": m * n, "alpha": alpha,
                        **({"beta": args["beta"]} if v.beta else {}),
                        **({"bias": args["bias"]} if v.bias else {})}
            record.append(_counts(execute(red, g_red, red_args, sp.space, replays)))
            record.append(sp.get(ws, v.split * batch * m * n, DTYPES[v.acc]).tobytes())
        else:
            record.append(_counts(execute(main, g_main, {**args, "c": c}, sp.space, replays)))
        record.append(sp.get(c, batch * m * n, out).tobytes())
        results.append(record)
    return results, (main, red)


variants = st.builds(
    lambda dtype, out, tile, ta, tb, beta, bias, act, split, bb, tf32: blas.GemmVariant(
        dtype, out if dtype != "float64" else "float64", tile, ta, tb, beta, bias, act,
        tf32 and dtype == "float32", split, bb),
    st.sampled_from(sorted(DTYPES)), st.sampled_from(["float32", "float16", "bfloat16"]),
    st.sampled_from([(16, 16, 16), (32, 32, 16), (16, 32, 8), (64, 16, 32)]),
    st.booleans(), st.booleans(), st.booleans(), st.booleans(),
    st.sampled_from(["none", "relu", "silu"]), st.sampled_from([1, 1, 2, 4]), st.booleans(),
    st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v=variants, m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 90),
       batch=st.integers(1, 3), seed=st.integers(0, 1000))
def test_fast_path_matches_the_interpreter_bit_for_bit(v, m, n, k, batch, seed):
    replays = ReplayCache()
    fast, (main, red) = _launches(v, m, n, k, batch, seed, replays)
    plain, _ = _launches(v, m, n, k, batch, seed, None)
    assert fast == plain
    assert replays.fast_launches == (LAUNCHES - 2) * (2 if v.split > 1 else 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v=variants, rows=st.integers(1, 3), cols=st.integers(1, 3), steps=st.integers(1, 4),
       batch=st.integers(1, 2), seed=st.integers(0, 1000), alpha=st.sampled_from([1.0, 0.75, -1.0]))
def test_whole_tile_operands_are_multiplied_in_place_bit_for_bit(v, rows, cols, steps, batch, seed,
                                                                 alpha):
    """Shapes of whole tiles and K steps need no padded copies: the operands (transposed or
    not, each split-K slice a view of its K range) are multiplied where they are stored, and an
    alpha of one multiplies nothing; every byte and counter is still the interpreter's."""
    bm, bn, bk = v.tile
    m, n, k = rows * bm, cols * bn, steps * bk
    fastpath._DIRECT.clear()
    replays = ReplayCache()
    fast, _ = _launches(v, m, n, k, batch, seed, replays, alpha)
    assert fast == _launches(v, m, n, k, batch, seed, None, alpha)[0]
    assert replays.fast_launches == (LAUNCHES - 2) * (2 if v.split > 1 else 1)
    ks = math.ceil(k / v.split)
    assert bool(fastpath._DIRECT) == (ks * v.split == k and ks % bk == 0 and not v.tf32)


class _NeverDirect(dict):
    def get(self, key, default=None):
        return False


@pytest.mark.parametrize("split, ta, tb", [(1, True, False), (4, False, True), (2, True, True)])
def test_a_layout_whose_slabs_disagree_takes_padded_tiles(monkeypatch, split, ta, tb):
    """Where the in-place operands' slabs were found to disagree with the tile products, the
    launch copies them into padded tiles instead: still the interpreter's bytes."""
    monkeypatch.setattr(fastpath, "_DIRECT", _NeverDirect())
    v = blas.GemmVariant("float32", "float32", (16, 16, 16), ta, tb, split=split)
    replays = ReplayCache()
    fast, _ = _launches(v, 32, 48, 64 * split, 2, 7, replays, 1.0)
    assert fast == _launches(v, 32, 48, 64 * split, 2, 7, None, 1.0)[0]
    assert replays.fast_launches == (LAUNCHES - 2) * (2 if split > 1 else 1)


def test_a_gelu_epilogue_and_a_switched_off_cache_replay_the_tape():
    v = blas.GemmVariant("float32", "float32", (16, 16, 16), act="gelu")
    replays = ReplayCache()
    got, _ = _launches(v, 20, 24, 40, 1, 3, replays)
    assert replays.fast_launches == 0 and got == _launches(v, 20, 24, 40, 1, 3, None)[0]
    off = ReplayCache(fast=False)
    v = blas.GemmVariant("float32", "float32", (16, 16, 16))
    got, _ = _launches(v, 20, 24, 40, 1, 3, off)
    assert off.fast_launches == 0 and got == _launches(v, 20, 24, 40, 1, 3, None)[0]


def test_an_operand_past_its_mapping_faults_as_the_interpreter_does():
    """With a recording held, a launch whose A runs off its allocation declines the fast
    path: the tape faults as the interpreter does, at the same address."""
    v = blas.GemmVariant("float32", "float32", (16, 16, 16))
    main = blas.gemm_program("g", v, 64)
    grid, _ = blas.grids(v, 16, 16, 1)
    replays = ReplayCache()
    errors = []
    for t in range(LAUNCHES + 1):
        for cache in (replays, None):
            sp = Space()
            rows = 16 if t < 3 else 8                  # the last two launches: 8 of 16 rows stored
            args = {"a": sp.put(np.ones((rows, 16), np.float32)), "b": sp.put(np.ones((16, 16), np.float32)),
                    "c": sp.put(np.zeros((16, 16), np.float32)), "m": 16, "n": 16, "k": 16,
                    "sa": 0, "sb": 0, "sc": 0, "alpha": 1.0}
            try:
                execute(main, grid, args, sp.space, cache)
            except PageFault as exc:
                errors.append((cache is None, exc.address))
    assert replays.fast_launches == 1                  # the third launch, before A shrank
    assert len(errors) == 4 and errors[0][1] == errors[1][1] and errors[2][1] == errors[3][1]


def test_describe_refuses_an_unknown_kind_or_a_missing_field():
    with pytest.raises(ValueError, match="no fast path"):
        fastpath.describe("conv", acc="float32")
    with pytest.raises(ValueError, match="needs 'tile'"):
        fastpath.describe("gemm", acc="float32")
    meta = blas.gemm_program("g", blas.GemmVariant("float32", "float32", (16, 16, 16)), 64).meta
    assert meta["fast"]["kind"] == "gemm" and isa.np_dtype(meta["fast"]["acc"]) == np.float32


def test_an_output_overlapping_an_operand_replays_the_tape():
    """C written over A: the tape keeps the interpreter's chunk order, so the fast path
    declines and both agree."""
    v = blas.GemmVariant("float32", "float32", (16, 16, 16))
    main = blas.gemm_program("g", v, 64)
    grid, _ = blas.grids(v, 20, 20, 1)

    def run(cache):
        outs = []
        for t in range(LAUNCHES):
            sp = Space()
            rng = np.random.default_rng(t)
            a = sp.put(rng.standard_normal((20, 20)).astype(np.float32))
            args = {"a": a, "b": sp.put(rng.standard_normal((20, 20)).astype(np.float32)), "c": a,
                    "m": 20, "n": 20, "k": 20, "sa": 0, "sb": 0, "sc": 0, "alpha": 1.0}
            execute(main, grid, args, sp.space, cache)
            outs.append(sp.get(a, 400, np.float32).tobytes())
        return outs
    replays = ReplayCache()
    assert run(replays) == run(None) and replays.fast_launches == 0


def _pads(gz, gy, gx, steps, tile, seed):
    bm, bn, bk = tile
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((gz, gy * bm, steps * bk)).astype(np.float32),
            rng.standard_normal((gz, steps * bk, gx * bn)).astype(np.float32))


def test_a_k_slab_product_is_taken_only_where_it_gave_the_tile_products_bits(monkeypatch):
    """The first launch of a layout checks whether its slab gives the tile products' bits; the
    slab is used only if it does (every result is the tiles' bits)."""
    monkeypatch.setattr(fastpath, "_SLABS", {})
    tile, counts = (16, 32, 8), (3, 2, 5)
    a, b = _pads(2, *counts, tile, 0)
    ref = fastpath._tile_products(a, b, counts, tile, np.dtype(np.float32))
    first = fastpath._products(a, b, counts, tile, np.dtype(np.float32))
    (verdict,) = fastpath._SLABS.values()
    assert first.tobytes() == ref.tobytes() and isinstance(verdict, bool)
    a2, b2 = _pads(2, *counts, tile, 1)                  # the same shape, other data
    again = fastpath._products(a2, b2, counts, tile, np.dtype(np.float32))
    assert again.tobytes() == fastpath._tile_products(a2, b2, counts, tile, np.dtype(np.float32)).tobytes()


def test_a_slab_that_disagrees_is_never_used_for_that_shape(monkeypatch):
    monkeypatch.setattr(fastpath, "_SLABS", {})
    real = fastpath._tile_products

    def one_ulp_off(*args):                             # a BLAS that sums a slab another way
        return np.nextafter(real(*args), np.float32(np.inf))
    monkeypatch.setattr(fastpath, "_tile_products", one_ulp_off)
    tile, counts = (16, 16, 16), (2, 2, 3)
    for seed in (0, 1):
        a, b = _pads(1, *counts, tile, seed)
        got = fastpath._products(a, b, counts, tile, np.dtype(np.float32))
        assert got.tobytes() == one_ulp_off(a, b, counts, tile, np.dtype(np.float32)).tobytes()
    assert list(fastpath._SLABS.values()) == [False]


def test_where_no_slab_agrees_whole_tile_operands_are_not_padded(monkeypatch):
    """A host whose BLAS sums every slab another way than the tiles (a processor whose small
    products take another kernel): padded copies cannot help, so once both layouts are found
    to disagree, whole-tile operands are multiplied as stored -- still the interpreter's bits."""
    monkeypatch.setattr(fastpath, "_SLABS", {})
    monkeypatch.setattr(fastpath, "_DIRECT", {})
    monkeypatch.setattr(fastpath, "_slab_agrees", lambda *a: False)
    padded = []
    real = fastpath._padded

    def counting(*args):
        padded.append(1)
        return real(*args)
    monkeypatch.setattr(fastpath, "_padded", counting)
    v = blas.GemmVariant("float32", "float32", (16, 16, 16), True, False)
    replays = ReplayCache()
    fast, _ = _launches(v, 32, 48, 64, 2, 7, replays, 1.0)
    assert fast == _launches(v, 32, 48, 64, 2, 7, None, 1.0)[0]
    # launch 3 (the first fast one) tries in place and finds its slab wrong, launch 4 pads
    # and finds the padded slab wrong too; every later launch multiplies in place
    assert len(padded) == 1 and list(fastpath._DIRECT.values()) == [True]
    more, _ = _launches(v, 32, 48, 64, 2, 8, replays, 1.0)
    assert more == _launches(v, 32, 48, 64, 2, 8, None, 1.0)[0] and len(padded) == 1


def test_the_slab_verdict_does_not_rest_on_data_that_sums_exactly(monkeypatch):
    """Operands whose products sum exactly (small integers here; bfloat16 values often) agree
    in any summation order, so they cannot tell a layout whose slab sums another way: the
    verdict is taken on random operands of full precision laid out as the launch's."""
    monkeypatch.setattr(fastpath, "_SLABS", {})

    def wide_sums(a, b, counts, tile, acc_dt):           # a BLAS that sums a slab another way
        acc = np.zeros((a.shape[0], counts[0] * tile[0], counts[1] * tile[1]), dtype=acc_dt)
        for s in range(counts[2]):
            sl = slice(s * tile[2], (s + 1) * tile[2])
            acc = (acc + np.matmul(a[:, :, sl].astype(np.float64), b[:, sl, :].astype(np.float64))).astype(acc_dt)
        return acc
    monkeypatch.setattr(fastpath, "_slab_products", wide_sums)
    tile, counts = (16, 16, 16), (2, 2, 3)
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 4, (1, 32, 48)).astype(np.float32)
    b = rng.integers(-3, 4, (1, 48, 32)).astype(np.float32)
    assert wide_sums(a, b, counts, tile, np.dtype(np.float32)).tobytes() == \
        fastpath._tile_products(a, b, counts, tile, np.dtype(np.float32)).tobytes()   # exact data agrees
    got = fastpath._products(a, b, counts, tile, np.dtype(np.float32))
    assert list(fastpath._SLABS.values()) == [False]
    a2, b2 = _pads(1, *counts, tile, 5)                  # the same layout, data that does not sum exactly
    again = fastpath._products(a2, b2, counts, tile, np.dtype(np.float32))
    assert got.tobytes() == fastpath._tile_products(a, b, counts, tile, np.dtype(np.float32)).tobytes()
    assert again.tobytes() == fastpath._tile_products(a2, b2, counts, tile, np.dtype(np.float32)).tobytes()


def test_a_gemm_whose_tape_is_too_large_to_keep_still_takes_the_fast_path():
    """A recording larger than an eighth of the cache keeps only the launch's counts: the
    fast path needs no tape; where it declines (a GELU epilogue) the launch is interpreted."""
    v = blas.GemmVariant("float32", "float32", (16, 16, 16))
    small = ReplayCache(limit=64 << 10)               # a recording may hold 8 KiB
    got, _ = _launches(v, 48, 40, 64, 2, 5, small)
    assert got == _launches(v, 48, 40, 64, 2, 5, None)[0]
    assert small.fast_launches == LAUNCHES - 2 and small.replayed == 0 and small.recorded == 1
    assert len(small) == 1 and small.nbytes == 0       # counts only: no tape held
    g = blas.GemmVariant("float32", "float32", (16, 16, 16), act="gelu")
    small = ReplayCache(limit=64 << 10)
    got, _ = _launches(g, 48, 40, 64, 2, 5, small)
    assert got == _launches(g, 48, 40, 64, 2, 5, None)[0]
    assert small.fast_launches == 0 and small.interpreted == LAUNCHES - 1


def test_the_fast_path_multiplies_on_one_blas_thread_and_gives_the_setting_back(monkeypatch):
    """numpy's BLAS runs on one thread inside a fast path's products (a small product split
    over threads can stall a shared host for a whole time slice) and on the caller's setting
    outside; the launches give the interpreter's bits with the caller on two threads."""
    from threadpoolctl import ThreadpoolController, threadpool_limits

    def blas_threads():
        return ThreadpoolController().select(user_api="blas").info()[0]["num_threads"]
    seen = []
    original = fastpath._products

    def spy(*args):
        seen.append(blas_threads())
        return original(*args)
    monkeypatch.setattr(fastpath, "_products", spy)
    v = blas.GemmVariant("float32", "float32", (32, 32, 16), trans_b=True)
    with threadpool_limits(limits=2, user_api="blas"):
        replays = ReplayCache()
        fast, _ = _launches(v, 96, 80, 64, 1, 5, replays)
        after = blas_threads()
    plain, _ = _launches(v, 96, 80, 64, 1, 5, None)
    assert replays.fast_launches == LAUNCHES - 2 and seen and set(seen) == {1}
    assert after == 2
    assert fast == plain
