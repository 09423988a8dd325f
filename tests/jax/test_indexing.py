"""gather / scatter / dynamic_slice lowering rules, checked bit for bit against ``jax.jit`` on
CPU (XLA's semantics: clamping, fill, dropped windows, repeated targets, batching dims)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fornax.frameworks.jax import NotLowerable
from fornax.frameworks.jax.indexing import CHAIN_LIMIT
from jaxcheck import check_exact as check
from jaxcheck import run_lowered
from helpers import FAMILIES

RNG = np.random.default_rng(0)
GD = lax.GatherDimensionNumbers
SD = lax.ScatterDimensionNumbers





def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- gather ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["clip", "fill", "promise_in_bounds"])
def test_gather_windows_clamped_or_filled(mode):
    """Windows of 2 rows x 3 cols at run-time starts, some out of bounds: clip/promise clamp
    the start to [0, dim - window], fill gives NaN for the whole window."""
    x = f32(5, 6)
    idx = np.array([[0, 0], [4, 5], [-3, 2], [2, 1], [1, 9]], np.int32)
    dn = GD(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1))
    check(lambda x, i: lax.gather(x, i, dn, (2, 3), mode=mode), x, idx)


def test_gather_fill_values_per_dtype():
    """jax's default fill: min of a signed int, max of an unsigned one, True for bool; an
    explicit fill_value wins."""
    idx = np.array([[1], [7], [-1]], np.int32)
    dn = GD(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    for x in (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.uint8),
              np.arange(4, dtype=np.int16), np.array([False, True, False, True])):
        check(lambda x, i: lax.gather(x, i, dn, (1,), mode="fill"), x, idx)
    check(lambda x, i: lax.gather(x, i, dn, (1,), mode="fill", fill_value=-7.5), f32(4), idx)


def test_gather_embedding_and_column_paths():
    """The index_select path (rows of an embedding, columns of a matrix) and the flat path
    (a window that is not whole) give jax's results, indices in any int dtype."""
    emb = f32(10, 4)
    ids = np.array([[3, 0, 9], [9, 12, 1]], np.int32)            # 12 clamps to 9
    dn = GD(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,))
    check(lambda e, i: lax.gather(e, i, dn, (1, 4), mode="clip"), emb, ids[..., None])
    check(lambda e, i: lax.gather(e, i, dn, (1, 4), mode="fill"), emb, ids[..., None])
    cols = GD(offset_dims=(0,), collapsed_slice_dims=(1,), start_index_map=(1,))
    check(lambda x, i: lax.gather(x, i, cols, (10, 1), mode="clip"), emb,
          np.array([[3], [0], [2]], np.uint32))
    part = GD(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    check(lambda e, i: lax.gather(e, i, part, (1, 2), mode="clip"), emb,
          np.array([[1], [5]], np.int8))


def test_gather_batching_dims_take_along_axis():
    """operand_batching_dims (what take_along_axis emits): row b reads x[b, idx[b, j]]."""
    x = f32(3, 5)
    idx = np.array([[4, 0], [1, 1], [2, 7]], np.int32)
    dn = GD(offset_dims=(), collapsed_slice_dims=(1,), start_index_map=(1,),
            operand_batching_dims=(0,), start_indices_batching_dims=(0,))
    check(lambda x, i: lax.gather(x, i, dn, (1, 1), mode="fill", fill_value=np.nan),
          x, idx[..., None])


def test_gather_multi_dim_point_and_batching_in_the_middle():
    x = f32(4, 3, 5)
    pts = np.array([[0, 2], [3, 1], [2, 0], [1, 4]], np.int32)
    dn = GD(offset_dims=(1,), collapsed_slice_dims=(0, 2), start_index_map=(0, 2))
    check(lambda x, i: lax.gather(x, i, dn, (1, 3, 1), mode="clip"), x, pts)
    # batch dim 1 of the operand paired with dim 0 of the indices
    x2 = f32(5, 3, 2)
    idx = np.array([[4], [0], [2]], np.int32)
    dn2 = GD(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,),
             operand_batching_dims=(1,), start_indices_batching_dims=(0,))
    check(lambda x, i: lax.gather(x, i, dn2, (1, 1, 2), mode="clip"), x2, idx)


def test_gather_of_key_array_takes_key_data_whole():
    keys = jax.random.split(jax.random.key(3), 4)
    dn = GD(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    fn = lambda k, i: jax.random.key_data(lax.gather(k, i, dn, (1,), mode="clip"))
    check(fn, keys, np.array([[2], [0], [5]], np.int32))


# ---- scatter -----------------------------------------------------------------------------------
ROWS = SD(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))


@pytest.mark.parametrize("mode", ["drop", "clip", "promise_in_bounds"])
def test_scatter_add_duplicates_accumulate_and_oob_windows(mode):
    """Repeated rows sum; a window with an out-of-bounds start is dropped (drop, promise) or
    clamped (clip)."""
    x = f32(4, 3)
    idx = np.array([[1], [1], [3], [-1], [5], [1]], np.int32)
    upd = f32(6, 3)
    check(lambda x, i, u: lax.scatter_add(x, i, u, ROWS, mode=mode), x, idx, upd)
    win = SD(update_window_dims=(1,), inserted_window_dims=(), scatter_dims_to_operand_dims=(0,))
    check(lambda x, i, u: lax.scatter_add(x, i, u, win, mode=mode), f32(6),
          np.array([[4], [-1], [1], [3]], np.int32), f32(4, 3))


def test_scatter_set_sub_and_int_wrap():
    """set: the last of repeated targets wins (XLA CPU's order); sub; a uint8 add wraps."""
    idx = np.array([[2], [0], [2]], np.int32)
    check(lambda x, i, u: lax.scatter(x, i, u, ROWS, mode="drop"), f32(3, 2), idx, f32(3, 2))
    check(lambda x, i, u: lax.scatter_sub(x, i, u, ROWS, mode="drop"), f32(3, 2), idx, f32(3, 2))
    x8 = np.array([[250, 1], [3, 4], [5, 6]], np.uint8)
    u8 = np.array([[10, 255], [1, 1], [200, 0]], np.uint8)
    check(lambda x, i, u: lax.scatter_add(x, i, u, ROWS, mode="drop"), x8, idx, u8)


@pytest.mark.parametrize("op", ["mul", "min", "max"])
def test_scatter_combiners_with_repeats(op):
    fn = {"mul": lax.scatter_mul, "min": lax.scatter_min, "max": lax.scatter_max}[op]
    idx = np.array([[1], [0], [1], [9], [1]], np.int32)
    check(lambda x, i, u: fn(x, i, u, ROWS, mode="drop"), f32(3, 2), idx, f32(5, 2))
    check(lambda x, i, u: fn(x, i, u, ROWS, mode="drop"),
          np.array([[3, -4], [100, 7], [0, 1]], np.int16), idx,
          np.array([[9, 9], [-300, 2], [300, -9], [1, 1], [200, 5]], np.int16))
    check(lambda x, i, u: fn(x, i, u, ROWS, mode="drop", unique_indices=True), f32(3, 2),
          np.array([[2], [0]], np.int32), f32(2, 2))


def test_scatter_mul_rounds_follow_update_order():
    """Overlapping windows (starts 0, 1, 1 of width 3) multiply one target up to three
    times; float products are rounded in XLA's sequential order."""
    win = SD(update_window_dims=(1,), inserted_window_dims=(), scatter_dims_to_operand_dims=(0,))
    check(lambda x, i, u: lax.scatter_mul(x, i, u, win, mode="drop"), f32(5),
          np.array([[0], [1], [1], [4]], np.int32), f32(4, 3))
    dn = SD(update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
    big = np.zeros((CHAIN_LIMIT + 1, 1), np.int32)
    with pytest.raises(NotLowerable, match="rounds"):
        run_lowered(lambda x, i, u: lax.scatter_mul(x, i, u, dn, mode="drop"), f32(4), big,
                    f32(CHAIN_LIMIT + 1))


def test_scatter_apply_custom_combiner():
    """scatter_apply: f applied once per (repeated) target, in order."""
    dn = SD(update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
    check(lambda x, i: lax.scatter_apply(x, i, lambda v: v * 3.0, dn, update_shape=(3,),
                                         mode="drop"),
          f32(4), np.array([[1], [1], [3]], np.int32))


def test_scatter_batching_dims_put_along_axis():
    x = f32(3, 4)
    idx = np.array([[[3], [0]], [[1], [1]], [[0], [2]]], np.int32)
    dn = SD(update_window_dims=(), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(1,),
            operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))
    check(lambda x, i, u: lax.scatter_add(x, i, u, dn, mode="drop"), x, idx, f32(3, 2))


# ---- dynamic slices ----------------------------------------------------------------------------
# the primitives bound directly: lax.dynamic_slice first wraps negative starts with jnp ops
def dslice(x, *starts, sizes):
    return lax.dynamic_slice_p.bind(x, *starts, slice_sizes=sizes)


def test_dynamic_slice_clamps_starts():
    x = f32(5, 6)
    for s0, s1 in ((1, 2), (4, 5), (-2, 0), (2**31 - 1, -(2**31))):
        check(lambda x, a, b: dslice(x, a, b, sizes=(2, 3)), x, np.int32(s0), np.int32(s1))
    check(lambda x, a, b: dslice(x, a, b, sizes=(1, 6)), x, np.int8(3), np.int8(-1))
    check(lambda x, a, b: dslice(x, a, b, sizes=(1, 2)), x, np.uint32(7), np.uint32(3))


def test_dynamic_update_slice_clamps_starts():
    x, u = f32(5, 6), f32(2, 3)
    for s0, s1 in ((1, 2), (4, 5), (-2, 0)):
        check(lambda x, u, a, b: lax.dynamic_update_slice_p.bind(x, u, a, b), x, u, np.int32(s0),
              np.int32(s1))


def test_dynamic_slices_of_key_arrays():
    k = jax.random.split(jax.random.key(1), 3)
    check(lambda k, a: jax.random.key_data(dslice(k, a, sizes=(2,))), k, np.int32(2))
    check(lambda k, j, a: jax.random.key_data(lax.dynamic_update_slice_p.bind(k, j, a)), k,
          jax.random.split(jax.random.key(2), 1), np.int32(1))


# ---- jnp-level programs and gradients (use rules owned elsewhere too) --------------------------
def test_jnp_indexing_programs():
    x = f32(5, 4)
    programs = [(lambda x, i: x[i], np.int32(-2)),
                (lambda x, i: x[:, i], np.array([0, -1, 2], np.int32)),
                (lambda x, i: x[i, i], np.array([0, 4, -5], np.int32)),
                (lambda x, i: jnp.take_along_axis(x, i, axis=1),
                 np.array([[0], [3], [-1], [2], [1]], np.int32)),
                (lambda e, i: e[i], np.array([[4, 0], [-1, 2]], np.int32))]
    for fn, i in programs:
        check(fn, x, i)


def test_jnp_updates():
    x = f32(5, 3)
    check(lambda x, i, v: x.at[i].set(v), x, np.int32(-1), f32(3))
    check(lambda x, i, v: x.at[i].add(v), x, np.array([1, 1, 4, 1], np.int32), f32(4, 3))
    check(lambda x, i: x.at[i].multiply(2.0), x, np.array([1, 1], np.int32))
    check(lambda x, i, v: x.at[i].max(v), x, np.array([0, 0, 2], np.int32), f32(3, 3))


def test_gradients_of_lookups():
    """The embedding gradient is a scatter-add; a dynamic_slice's is a dynamic_update_slice."""
    emb, w = f32(6, 3), f32(3)
    check(jax.grad(lambda e, i: jnp.sum(e[i] @ w)), emb, np.array([1, 4, 1, 1], np.int32))
    check(jax.grad(lambda x, i: jnp.sum(x[i] * x[i])), f32(5, 2), np.int32(3))
    check(jax.grad(lambda x, i: jnp.sum(jnp.take_along_axis(x, i, axis=1) ** 2)), f32(3, 4),
          np.array([[1, 1], [0, 3], [2, 2]], np.int32))


@pytest.mark.parametrize("vendor", FAMILIES)
def test_gather_scatter_every_vendor(vendor):
    dn = GD(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    check(lambda x, i: lax.scatter_add(x, i, lax.gather(x, i, dn, (1, 3), mode="clip"), ROWS,
                                       mode="drop"),
          f32(4, 3), np.array([[2], [2], [0], [7]], np.int32), vendor=vendor)
