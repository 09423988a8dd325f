"""The core primitive rules of the JAX front end against ``jax.jit`` on CPU.

Each check traces a function, lowers its jaxpr into one fornax graph, runs it on a
composed stack (:func:`jaxcheck.run_lowered`) and compares every result with what
``jax.jit`` computes: the dtype and shape exactly, integers, bools and layout
exactly, float32 to a relative tolerance, float16/bfloat16 to one unit in the last
place.  Most checks use the cuda-like stack; ``test_all_vendors`` runs a mixed
program on all three.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import fornax.frameworks.jax  # noqa: F401  (registers the lowering rules)
from fornax.frameworks import builders as B
from fornax.frameworks.jax.lowering import LowerCtx, NotLowerable, lower_eqn
from fornax.layers.graph import Graph
from jaxcheck import run_lowered, stack_for
from helpers import FAMILIES

BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32
LOW = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
INF, NAN = math.inf, math.nan


def rng(seed=0):
    return np.random.RandomState(seed)


def normal(shape, dtype=np.float32, scale=1.0, seed=0):
    return (rng(seed).randn(*shape) * scale).astype(dtype)


def uniform(shape, lo, hi, dtype=np.float32, seed=0):
    return rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def ints(shape, dtype, lo=None, hi=None, seed=0):
    info = np.iinfo(dtype)
    lo = int(info.min) if lo is None else lo
    hi = int(info.max) if hi is None else hi
    return rng(seed).randint(lo, hi, size=shape, dtype=np.int64).astype(dtype)


def _ordered(a: np.ndarray) -> np.ndarray:
    """16-bit float bit patterns as integers in value order (adjacent floats differ by one)."""
    bits = a.view(np.uint16).astype(np.int64)
    return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)


def primitives(fn, *args) -> set[str]:
    """Every primitive name in ``fn``'s jaxpr, nested jaxprs included."""
    names = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)
    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return names


def check(fn, *args, rtol=1e-6, atol=0.0, ulp=1, uses=(), vendor="cuda-like"):
    """``fn(*args)`` lowered and run equals ``jax.jit(fn)(*args)``, result by result (named by
    their path in ``fn``'s output); ``uses``: primitives the jaxpr must contain, so the
    check exercises the rules it is about."""
    uses = (uses,) if isinstance(uses, str) else tuple(uses)
    missing = set(uses) - primitives(fn, *args)
    assert not missing, f"{sorted(missing)} not in the jaxpr of the check"
    got = run_lowered(fn, *args, vendor=vendor)
    paths, _ = jax.tree_util.tree_flatten_with_path(jax.jit(fn)(*args))
    assert len(got) == len(paths)
    for g, (path, w) in zip(got, paths):
        g, w, at = np.asarray(g), np.asarray(w), f"result {jax.tree_util.keystr(path)}"
        assert g.dtype == w.dtype, f"{at}: dtype {g.dtype}, jax gives {w.dtype}"
        assert g.shape == w.shape, f"{at}: shape {g.shape}, jax gives {w.shape}"
        if w.dtype in LOW:
            gn, wn = np.isnan(g.astype(np.float32)), np.isnan(w.astype(np.float32))
            np.testing.assert_array_equal(gn, wn, err_msg=f"{at}: NaN positions")
            dist = np.abs(_ordered(g) - _ordered(w))[~wn]
            assert dist.size == 0 or dist.max() <= ulp, f"{at}: {dist.max()} ulps apart\n got {g}\nwant {w}"
        elif w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=at)
        else:
            np.testing.assert_array_equal(g, w, err_msg=at)
    return got


def each(fn, **arrays):
    """``fn`` applied to every keyword array: a function of those arrays returning a dict."""
    names = list(arrays)
    return (lambda *vs: {n: fn(v) for n, v in zip(names, vs)}), [arrays[n] for n in names]


def lowp(x):
    """``x`` as bfloat16 and float16 (float16 overflowing to inf where it must)."""
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(BF16), np.asarray(x).astype(F16)


# ---- elementwise float math -----------------------------------------------------------------------
SPECIAL = np.array([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5], np.float32)


def _f32(*parts):
    return np.concatenate([np.ravel(p) for p in parts]).astype(np.float32)


#: (primitive, function, float32 input, float32 rtol)
UNARY = [
    ("exp", jnp.exp, lambda: normal((3, 5), scale=4), 2e-6),
    ("exp2", jnp.exp2, lambda: normal((3, 5), scale=30), 2e-6),
    ("log", jnp.log, lambda: uniform((3, 5), 1e-3, 1e3), 2e-6),
    ("log1p", jnp.log1p, lambda: _f32(uniform((8,), -0.9, 5), normal((7,), scale=1e-6), [3e38]), 2e-6),
    ("expm1", jnp.expm1, lambda: _f32(normal((8,), scale=3), normal((7,), scale=1e-6), [88.5]), 2e-6),
    ("tanh", jnp.tanh, lambda: normal((2, 3, 4), scale=3), 2e-6),
    ("logistic", jax.nn.sigmoid, lambda: normal((4, 4), scale=5), 2e-6),
    ("sin", jnp.sin, lambda: normal((4, 4), scale=5), 2e-6),
    ("cos", jnp.cos, lambda: normal((4, 4), scale=5), 2e-6),
    ("tan", jnp.tan, lambda: uniform((4, 4), -1.5, 1.5), 4e-6),
    ("asin", jnp.arcsin, lambda: uniform((4, 4), -1, 1), 2e-6),
    ("acos", jnp.arccos, lambda: uniform((4, 4), -1, 1), 2e-6),
    ("atan", jnp.arctan, lambda: normal((4, 4), scale=10), 2e-6),
    ("sinh", jnp.sinh, lambda: _f32(normal((12,), scale=4), [1e-5, -3e-4, 89.0, -88.9]), 4e-6),
    ("cosh", jnp.cosh, lambda: _f32(normal((12,), scale=4), [1e-5, 89.0, -88.9, 20.0]), 4e-6),
    ("asinh", jnp.arcsinh, lambda: _f32(normal((12,), scale=5), [1e-6, -2e-5, 1e30, -3e20]), 2e-6),
    ("acosh", jnp.arccosh, lambda: _f32(uniform((12,), 1, 50), [1.0, 1.00001, 1e30, 0.5]), 2e-6),
    ("atanh", jnp.arctanh, lambda: _f32(uniform((12,), -0.999, 0.999), [1e-6, -3e-5]), 2e-6),
    ("sqrt", jnp.sqrt, lambda: uniform((3, 5), 0, 100), 1e-6),
    ("rsqrt", lax.rsqrt, lambda: uniform((3, 5), 1e-3, 100), 1e-6),
    ("cbrt", jnp.cbrt, lambda: normal((3, 5), scale=100), 1e-6),
    ("erf", lax.erf, lambda: normal((3, 5), scale=2), 2e-6),
    # erfc above ~9.2 is a float32 subnormal, which XLA CPU flushes to zero
    ("erfc", lax.erfc, lambda: _f32(normal((10,), scale=2), [3.0, 5.0, 7.5, 9.0, -4.0, 9.1]), 2e-5),
    ("erf_inv", lax.erf_inv, lambda: _f32(uniform((12,), -1, 1), [0.9999999, -0.99999, 1e-7]), 2e-6),
    ("floor", jnp.floor, lambda: normal((3, 5), scale=10), 0),
    ("ceil", jnp.ceil, lambda: normal((3, 5), scale=10), 0),
    ("is_finite", jnp.isfinite, lambda: normal((3, 5)), 0),
    ("sign", jnp.sign, lambda: normal((3, 5)), 0),
    ("neg", jnp.negative, lambda: normal((3, 5)), 0),
    ("abs", jnp.abs, lambda: normal((3, 5)), 0),
    ("square", jnp.square, lambda: normal((3, 5)), 1e-7),
]


@pytest.mark.parametrize("name,fn,make,rtol", UNARY, ids=[u[0] for u in UNARY])
def test_float_unary(name, fn, make, rtol):
    """float32 (random and special values) to ``rtol``, bfloat16/float16 to one ulp."""
    x = make()
    bf, hf = lowp(x)
    f, args = each(fn, f32=x, special=SPECIAL, bf16=bf, f16=hf)
    check(f, *args, rtol=rtol, uses=name)


def test_round_both_methods():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 2.4999998, 1e8, 3.7, -3.7, 0.0,
                  -0.0, INF, -INF, NAN], np.float32)

    def f(v, b, h):
        return [[lax.round(a, m) for a in (v, b, h)]
                for m in (lax.RoundingMethod.AWAY_FROM_ZERO, lax.RoundingMethod.TO_NEAREST_EVEN)]
    check(f, x, x.astype(BF16), normal((3, 4), scale=10).astype(F16), rtol=0, uses="round")


def test_integer_pow_and_pow():
    x = normal((3, 4), scale=2)
    ys = (0, 1, 2, 3, 5, 8, -1, -3)
    check(lambda v, b: ({y: lax.integer_pow(v, y) for y in ys}, b ** 7), x, x.astype(BF16), uses="integer_pow")
    ints_ = (ints((3, 4), np.int32, -50, 50), ints((6,), np.uint32), ints((6,), np.int8))
    check(lambda i, u, s: ([lax.integer_pow(i, y) for y in (2, 3, 7)], lax.integer_pow(u, 5), lax.integer_pow(s, 3)),
          *ints_, uses="integer_pow")                  # exact, wrapping at the type's width
    a, b = uniform((3, 4), 0.1, 5), normal((3, 4), scale=3)
    sa = np.array([-2, 0, -8, NAN, 1, -1, 0, INF, -0.0], np.float32)
    sb = np.array([3, -1, 1 / 3, 0, NAN, INF, 0, -1, -3], np.float32)
    si = np.array([3, -1, 3, 0, 2, -3, 0, 2, -1], np.int32)
    check(lambda p, q, r, s, t, u, v: [lax.pow(p, q), lax.pow(r, s), lax.pow(t, u), lax.pow(t, v)],
          a, b, a.astype(BF16), b.astype(BF16), sa, sb, si, rtol=2e-6, uses="pow")


# ---- float binary ---------------------------------------------------------------------------------
BINARY = [("add", lax.add), ("sub", lax.sub), ("mul", lax.mul), ("div", lax.div), ("rem", lax.rem),
          ("max", lax.max), ("min", lax.min), ("atan2", lax.atan2)]


@pytest.mark.parametrize("name,fn", BINARY, ids=[b[0] for b in BINARY])
def test_float_binary(name, fn):
    a, b = normal((3, 4), scale=5, seed=1), normal((3, 4), scale=5, seed=2)
    sa = np.array([NAN, 1, INF, -INF, 0, -0.0, 5.5, -5.5, -1e-10, 3, INF, 7], np.float32)
    sb = np.array([1, NAN, INF, 2, -0.0, 0, 2, 2, 1, 0, 1, -INF], np.float32)
    pairs = [(a, b), (sa, sb), *zip(lowp(a), lowp(b))]
    check(lambda *v: [fn(v[i], v[i + 1]) for i in range(0, len(v), 2)], *[t for p in pairs for t in p],
          rtol=2e-6, uses=name)


def test_nextafter():
    """One ulp toward y: across binades, into and out of subnormals, from ±inf, equal and NaN."""
    # (XLA CPU reads subnormal operands as zero: none here but the smallest one, which steps to 0 either way)
    x = np.array([0, 0, 1, 1, -1, -1, 2, INF, -INF, NAN, 1, 3.4028235e38, 1.17549435e-38, 1e-45, -0.0, 5, 3.3],
                 np.float32)
    y = np.array([1, -1, 2, 0, 0, -2, 2, 0, 0, 1, NAN, INF, 0, 0, 1, 5, -4], np.float32)
    r, s = normal((3, 4), scale=100, seed=1), normal((3, 4), scale=100, seed=2)
    check(lambda *v: [jnp.nextafter(v[i], v[i + 1]) for i in range(0, len(v), 2)],
          x, y, r, s, *[t for p in zip(lowp(x), lowp(y)) for t in p], rtol=0, ulp=0, uses="nextafter")


def test_add_any_from_a_gradient():
    check(jax.grad(lambda v: jnp.sum(jnp.sin(v) * v)), normal((3, 4)), rtol=2e-6, uses="add_any")


# ---- integers -------------------------------------------------------------------------------------
INT_DTYPES = [np.int32, np.uint32, np.int8, np.uint8, np.int16, np.uint16]
INT_BINARY = [("add", lax.add), ("sub", lax.sub), ("mul", lax.mul), ("div", lax.div), ("rem", lax.rem),
              ("max", lax.max), ("min", lax.min), ("and", lax.bitwise_and), ("or", lax.bitwise_or),
              ("xor", lax.bitwise_xor), ("eq", lax.eq), ("lt", lax.lt), ("ge", lax.ge)]
INT_UNARY = [("neg", lax.neg), ("abs", lax.abs), ("sign", lax.sign), ("not", lax.bitwise_not),
             ("square", lax.square), ("population_count", lax.population_count)]
SHIFTS = [("shift_left", lax.shift_left), ("shift_right_logical", lax.shift_right_logical),
          ("shift_right_arithmetic", lax.shift_right_arithmetic)]


def int_operands(dt, seed=0):
    """Random values plus the edge cases (min, max, 0, ±1; x/0, INT_MIN/-1) of ``dt``."""
    info = np.iinfo(dt)
    signed = info.min < 0
    a = [info.min, info.max, 0, 1, info.max, info.min, 7, 0] + ([-1, -7] if signed else [3, 9])
    b = [-1 if signed else 1, 1, 0, 0, info.max, 0, 2, 5, 3, 0]
    as_dt = (lambda v: np.array(v, np.int64).astype(dt))
    return (np.concatenate([ints((14,), dt, seed=seed), as_dt(a)]),
            np.concatenate([ints((14,), dt, seed=seed + 1), as_dt(b)]))


@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integers(dt):
    """Wrapping arithmetic, C division and remainder, bit operations and shifts (amounts
    beyond the width, and negative ones, included), exactly as jax."""
    a, b = int_operands(dt)
    bits = np.iinfo(dt).bits
    x = np.concatenate([ints((10,), dt), np.array([np.iinfo(dt).min, np.iinfo(dt).max, 0, 1, 5, 5], np.int64)
                        .astype(dt)])
    s = np.array([0, 1, 2, 3, bits - 1, bits, bits + 1, 3, 7 % bits, 4, 1, bits - 1, 0, bits - 1, 2 * bits + 3,
                  -1 if np.iinfo(dt).min else 1], np.int64).astype(dt)
    unary = [(n, f) for n, f in INT_UNARY if not (n == "abs" and not np.iinfo(dt).min)]   # no unsigned abs

    def f(a, b, x, s):
        return ({n: fn(a, b) for n, fn in INT_BINARY}, {n: fn(a) for n, fn in unary},
                {n: fn(x, s) for n, fn in SHIFTS})
    check(f, a, b, x, s, uses=[n for n, _ in INT_BINARY + unary + SHIFTS])


def test_int64_and_float64_under_x64():
    with jax.enable_x64(True):
        info = np.iinfo(np.int64)
        a = np.array([info.min, info.max, -7, 7, 5, -1, 123456789012345, 0], np.int64)
        b = np.array([-1, 2, 2, -2, 0, 3, 1 << 20, 0], np.int64)
        s = np.array([0, 1, 63, 64, 62, 5, -1, 32], np.int64)
        f = np.array([NAN, INF, -INF, 9.3e18, -9.3e18, 2.0 ** 62, -3.7, 1e19], np.float64)
        r = np.array([1e-40, 1.0000001, 1e39, 3e-39], np.float64)

        def prog(a, b, s, f, r, h):
            return ([fn(a, b) for fn in (lax.div, lax.rem, lax.mul, lax.add)],
                    [fn(a, s) for _, fn in SHIFTS], lax.population_count(a),
                    f.astype(np.int64), f.astype(np.uint32), lax.reduce_precision(r, 8, 23), jnp.sinh(h))
        check(prog, a, b, s, f, r, normal((6,), np.float64, 3), rtol=1e-13)


def test_bool_logic():
    a, b = rng(1).rand(4, 5) > 0.5, rng(2).rand(4, 5) > 0.5
    ops = [("and", lax.bitwise_and), ("or", lax.bitwise_or), ("xor", lax.bitwise_xor), ("eq", lax.eq),
           ("ne", lax.ne), ("max", lax.max), ("min", lax.min)]
    check(lambda a, b: ({n: fn(a, b) for n, fn in ops}, lax.bitwise_not(a)), a, b,
          uses=[n for n, _ in ops] + ["not"])


def test_comparisons():
    """NaN compares unequal and unordered; carried uint32 compares unsigned."""
    a = np.array([NAN, 1, 2, -0.0, INF, 3, -INF, 5], np.float32)
    b = np.array([1, NAN, 2, 0.0, INF, -3, 0, NAN], np.float32)
    u = np.array([0, 2 ** 31, 2 ** 32 - 1, 5, 7, 2 ** 31 - 1, 1, 3], np.uint32)
    v = np.array([1, 2 ** 31 - 1, 0, 5, 2 ** 32 - 2, 2 ** 31, 1, 9], np.uint32)
    names = ("eq", "ne", "lt", "le", "gt", "ge")
    pairs = [(a, b), (a.astype(BF16), b.astype(BF16)), (u, v), (ints((8,), np.int32, seed=3),
                                                                 ints((8,), np.int32, seed=4))]
    check(lambda *x: [{n: getattr(lax, n)(x[i], x[i + 1]) for n in names} for i in range(0, len(x), 2)],
          *[t for p in pairs for t in p], uses=names)


def test_select_n_and_clamp():
    p = rng(3).rand(3, 4) > 0.5
    x, y, z = normal((3, 4), seed=1), normal((3, 4), seed=2), normal((3, 4), seed=3)
    which = ints((3, 4), np.int32, 0, 3)
    u1, u2 = ints((3, 4), np.uint32), ints((3, 4), np.uint32, seed=5)
    edge = _f32(x, [NAN, INF, -INF])

    def f(p, x, y, z, which, u1, u2, edge, i8):
        return (lax.select_n(p, x, y), jnp.where(x > y, x, 0.0), lax.select_n(which, x, y, z),
                lax.select_n(p, u1, u2), lax.select_n(p, p, ~p),
                lax.clamp(-0.5, edge, 0.5), lax.clamp(x - 1, y, x + 1), lax.clamp(np.int8(-5), i8, np.int8(100)),
                jnp.clip(x.astype(BF16), 0.0, 1.0))
    check(f, p, x, y, z, which, u1, u2, edge, ints((10,), np.int8), uses=["select_n", "clamp"])


# ---- conversions ----------------------------------------------------------------------------------
TARGETS = [np.int32, np.uint32, np.int8, np.uint8, np.int16, np.uint16, np.bool_, np.float32, BF16, F16]


@pytest.mark.parametrize("src", [np.float32, BF16, F16, np.int32, np.uint32, np.int8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_convert_element_type(src):
    """float → int truncates and saturates (NaN → 0), int → int wraps, x → bool is x != 0."""
    if np.dtype(src).kind == "f" or src is BF16:
        x = _f32(normal((10,), scale=300), [NAN, INF, -INF, 1e10, -1e10, 2.5e9, 4.3e9, -0.5, 127.9, 200, -200,
                                            65535.5, 70000, 2 ** 31, -2 ** 31, 255.5])
        with np.errstate(over="ignore"):
            x = x.astype(src)
    elif src is np.bool_:
        x = rng(0).rand(12) > 0.5
    else:
        x = int_operands(src)[0]
    targets = [d for d in TARGETS if np.dtype(d) != np.dtype(src)]
    check(lambda v: {np.dtype(d).name: lax.convert_element_type(v, d) for d in targets}, x, rtol=0,
          uses="convert_element_type")


def test_reduce_precision():
    """Mantissa rounding, overflow to inf and (narrower exponent) subnormals flushed to zero."""
    tiny16 = 2.0 ** -14
    x = np.array([1e-6, 6e-5, tiny16, tiny16 * (1 - 2 ** -12), tiny16 * (1 - 2 ** -10), -tiny16 * 0.75, 1e-8,
                  70000, 65519, 65520, -65520, 1.00048828125, 1.0009765625 + 2 ** -11, NAN, INF, 0.0, 3.14159],
                 np.float32)
    y = np.array([1e-39, 1.00390625, 1.01171875, 3.4e38, -2.0 ** -130, 1.5, NAN, 7.77e-20], np.float32)
    check(lambda x, y, b: (lax.reduce_precision(x, 5, 10), lax.reduce_precision(y, 8, 7),
                           lax.reduce_precision(y, 8, 23), lax.reduce_precision(b, 5, 10)),
          x, y, y.astype(BF16), rtol=0, uses="reduce_precision")


# ---- reductions -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axes", [((7,), (0,)), ((3, 5), (1,)), ((2, 3, 5), (0, 2)), ((2, 3, 4), (0, 1, 2))])
def test_reductions(shape, axes):
    """Sums, extremes (NaN propagating), products, bit and logical reductions over ``axes``."""
    x = normal(shape, scale=2)
    xn = x.copy()
    xn.flat[1] = NAN
    arrays = dict(f32=x, nan=xn, bf16=(x * 4).round().astype(BF16), i32=ints(shape, np.int32, -1000, 1000),
                  u32=ints(shape, np.uint32), i8=ints(shape, np.int8, -5, 5))
    b = rng(4).rand(*shape) > 0.3
    bits = [lax.reduce_and_p, lax.reduce_or_p, lax.reduce_xor_p]

    def f(h, b, *vs):
        num = [[fn(v, axis=axes) for fn in (jnp.sum, jnp.max, jnp.min, jnp.prod)] for v in vs]
        logic = [[fn(t, axis=axes) for fn in (jnp.all, jnp.any)] for t in (b, jnp.ones_like(b))]
        bitwise = [[p.bind(t, axes=axes) for p in bits] for t in (vs[3], vs[4], b)]
        return num, jnp.sum(h, axis=axes), logic, bitwise, jnp.max(b, axis=axes)
    check(f, normal(shape, F16), b, *arrays.values(), rtol=2e-6,
          uses=["reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor"])


def test_argmax_argmin():
    """The first index of the extreme; NaN is the extreme of both."""
    x = normal((4, 7), scale=3)
    x[1, 2] = x[1, 5] = NAN
    x[2, :] = 1.0
    x[3, 4] = x[3, 1] = 99.0

    def f(x, b, u, t):
        return [[fn(x, axis=0), fn(x, axis=1), fn(b, axis=1), fn(u, axis=0), fn(t, axis=1), fn(x)]
                for fn in (jnp.argmax, jnp.argmin)]
    check(f, x, x.astype(BF16), ints((5, 3), np.uint32), rng(2).rand(3, 6) > 0.5, uses=["argmax", "argmin"])


# ---- cumulative -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"])
def test_cumulative(name):
    fn = getattr(lax, name)
    x = normal((3, 7), scale=2)
    xn = x.copy()
    xn[1, 3] = NAN
    xn[2, 2] = -INF
    small = rng(5).randint(-3, 4, size=(2, 6)).astype(np.float32)   # sums and products exact in 16 bits
    floats = dict(f32=x, f32_3d=normal((5, 2, 3)), nan=xn, bf16=small.astype(BF16), f16=small.astype(F16))
    integers = {} if name == "cumlogsumexp" else dict(i32=ints((3, 6), np.int32, -9, 9), u32=ints((4, 3), np.uint32),
                                                      i8=ints((4, 3), np.int8))
    arrays = {**floats, **integers}

    def f(*vs):
        return [[fn(v, axis=v.ndim - 1 if i % 2 else 0, reverse=r) for r in (False, True)] for i, v in enumerate(vs)]
    check(f, *arrays.values(), rtol=3e-6, uses=name)


# ---- layout ---------------------------------------------------------------------------------------
def test_layout():
    def f(v):
        return dict(
            bcast=lax.broadcast_in_dim(v, (5, 2, 3, 4), (1, 2, 3)),
            bcast1=lax.broadcast_in_dim(v[:, :1], (2, 6, 4, 2), (0, 1, 2)),
            expand=jnp.expand_dims(v, (0, 3)), reshape=v.reshape(4, 6),
            reshape_dims=lax.reshape(v, (6, 4), dimensions=(2, 1, 0)), transpose=jnp.transpose(v, (2, 0, 1)),
            squeeze=jnp.squeeze(v[:, :1, None], (1, 2)), rev=lax.rev(v, (0, 2)), slice=v[1:, ::2, 1:4:2],
            slice2=lax.slice(v, (0, 1, 0), (2, 3, 4), (1, 1, 3)),
            concat=jnp.concatenate([v, v[:, :1], v], axis=1), split=jnp.split(v, [1, 3], axis=2),
            copy=lax.copy_p.bind(v), barrier=lax.optimization_barrier((v, v[0])),
            stopped=lax.stop_gradient(v))
    fn, args = each(f, f32=normal((2, 3, 4)), u32=ints((2, 3, 4), np.uint32), bf16=normal((2, 3, 4)).astype(BF16),
                    bool=rng(0).rand(2, 3, 4) > 0.5)
    check(fn, *args, rtol=0, uses=["broadcast_in_dim", "reshape", "transpose", "squeeze", "rev", "slice",
                                   "concatenate", "split", "copy", "optimization_barrier"])
    check(jax.nn.log_softmax, normal((3, 5)), rtol=2e-6, uses="stop_gradient")


def test_iota():
    dts = (np.int32, np.uint32, np.uint8, np.int8, np.float32, BF16, F16)
    check(lambda: [(lax.iota(d, 300), lax.broadcasted_iota(d, (3, 4, 5), 1)) for d in dts], rtol=0, uses="iota")


def test_pad():
    """Edge, interior and negative (cropping) padding; a constant and a computed padding value."""
    configs = [((1, 2, 0), (0, 1, 0)), ((1, 2, 1), (-1, 1, 2)), ((0, 0, 2), (2, -3, 1)), ((-1, -1, 0), (3, 0, 0)),
               ((-4, 2, 1), (0, 0, 0))]

    def f(x, p, i8, u32, b, h):
        return [(lax.pad(x, 0.5, c), lax.pad(x, p, c), lax.pad(i8, np.int8(-3), c),
                 lax.pad(u32, np.uint32(2 ** 32 - 1), c), lax.pad(b, True, c)) for c in configs] + [
            jnp.pad(h, ((1, 2), (0, 1)), constant_values=7)]
    check(f, normal((3, 4)), np.float32(-2.5), ints((3, 4), np.int8), ints((3, 4), np.uint32),
          rng(1).rand(3, 4) > 0.5, normal((3, 4)).astype(BF16), rtol=0, uses="pad")


# ---- contractions ---------------------------------------------------------------------------------
def test_dot_general():
    """Float products accumulate in float32; integer ones wrap exactly."""
    a, b = normal((4, 6), seed=1), normal((6, 5), seed=2)
    p, q = normal((2, 3, 4, 5), seed=3), normal((3, 5, 2, 4, 6), seed=4)
    dn = (((3, 2), (1, 3)), ((0, 1), (2, 0)))

    def f(a, b, p, q, v, w):
        lo = [(jnp.matmul(a.astype(t), b.astype(t)), jnp.matmul(a.astype(t), b.astype(t), preferred_element_type=F32))
              for t in (BF16, F16)]
        return jnp.matmul(a, b), lo, lax.dot_general(p, q, dn), jnp.dot(v, w)
    check(f, a, b, p, q, normal((7,)), normal((7,), seed=5), rtol=2e-5, atol=1e-5, uses="dot_general")

    def g(p, q, a, b, u, v):
        return (lax.dot_general(p, q, dn), jnp.matmul(a, b, preferred_element_type=np.int32), jnp.matmul(u, v))
    check(g, ints(p.shape, np.int32, -99, 99), ints(q.shape, np.int32, -99, 99), ints((4, 6), np.int8),
          ints((6, 5), np.int8), ints((4, 6), np.uint32), ints((6, 5), np.uint32), uses="dot_general")


CONVS = [  # (lhs shape, rhs shape, keyword arguments)
    ((2, 4, 9, 9), (6, 4, 3, 3), dict(window_strides=(1, 1), padding="VALID")),
    ((2, 4, 9, 8), (6, 2, 3, 3), dict(window_strides=(2, 2), padding="SAME", rhs_dilation=(2, 1),
                                      feature_group_count=2)),
    ((2, 9, 8, 4), (3, 3, 4, 6), dict(window_strides=(2, 1), padding=((1, 0), (2, 1)),
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    ((2, 9, 3), (3, 3, 4), dict(window_strides=(1,), padding=((2, 1),), lhs_dilation=(2,),
                                dimension_numbers=("NWC", "WIO", "NWC"))),
    ((1, 2, 5, 4, 4), (2, 2, 2, 3, 2), dict(window_strides=(1, 2, 1), padding=((0, 1), (1, -1), (0, 0)))),
]


@pytest.mark.parametrize("lhs,rhs,kw", CONVS, ids=["valid", "grouped-strided-dilated", "nhwc", "1d-lhs-dilated",
                                                     "3d-negative-pad"])
def test_conv(lhs, rhs, kw):
    x, w = normal(lhs, seed=1), normal(rhs, seed=2)
    check(lambda a, b, c, d: (lax.conv_general_dilated(a, b, **kw), lax.conv_general_dilated(c, d, **kw),
                              lax.conv_general_dilated(c, d, preferred_element_type=F32, **kw)),
          x, w, x.astype(BF16), w.astype(BF16), rtol=2e-5, atol=2e-5, uses="conv_general_dilated")


@pytest.mark.parametrize("lhs,rhs,kw", CONVS[1:3], ids=["nchw-grouped", "nhwc"])
def test_conv_gradients(lhs, rhs, kw):
    """The input gradient dilates the lhs; the weight gradient swaps the dimension numbers
    and, for grouped convolutions, has a batch group count."""
    x, w = normal(lhs, seed=1), normal(rhs, seed=2)

    def loss(a, b):
        return jnp.sum(jnp.tanh(lax.conv_general_dilated(a, b, **kw)) ** 2)
    check(jax.grad(loss, argnums=(0, 1)), x, w, rtol=2e-4, atol=2e-5)
    if kw.get("feature_group_count", 1) > 1:
        assert any(e.primitive.name == "conv_general_dilated" and e.params["batch_group_count"] > 1
                   for e in jax.make_jaxpr(jax.grad(loss, argnums=1))(x, w).jaxpr.eqns)


def test_dot_and_pad_gradients():
    a, b = normal((3, 4, 5), seed=1), normal((3, 5, 2), seed=2)
    cfg = ((1, 2, 1), (-1, 1, 2))

    def f(x, y, v):
        gx, gy = jax.grad(lambda s, t: jnp.sum(jnp.einsum("bij,bjk->bik", s, t) ** 2), argnums=(0, 1))(x, y)
        return gx, gy, jax.grad(lambda s: jnp.sum(jnp.sin(lax.pad(s, 0.0, cfg)) * 3))(v)
    check(f, a, b, normal((3, 4)), rtol=2e-5, atol=1e-5, uses=["dot_general", "pad"])


# ---- sorting --------------------------------------------------------------------------------------
def test_sort():
    """Stable; NaN last, -0.0 equal to 0.0; several operands, several keys."""
    x = np.array([[3.0, NAN, -0.0, 0.0, -INF, NAN, 1.0, INF, 0.0, -0.0, 3.0]], np.float32)
    r = normal((3, 6, 5))
    keys = ints((2, 10), np.int32, 0, 3)
    vals = np.array([[1, NAN, 2, 2, NAN, 0, -1, 1, 1, 0]] * 2, np.float32)

    def f(x, r, i, u, b, k, v, w):
        return (jnp.sort(x), jnp.argsort(x), jnp.sort(r, axis=1), jnp.argsort(r, axis=0), jnp.argsort(i),
                jnp.argsort(u), jnp.sort(r.astype(BF16)), jnp.argsort(b), lax.sort((k, v, -v), dimension=1, num_keys=2),
                lax.sort((v, k), dimension=1, num_keys=2), jnp.lexsort((w[0], w[1])))
    check(f, x, r, ints((4, 9), np.int32, 0, 4), ints((4, 9), np.uint32), rng(3).rand(2, 7) > 0.5, keys,
          vals, normal((2, 9)).round(), rtol=0, uses="sort")


def test_top_k():
    """NaN the largest, 0.0 above -0.0, equal values lower index first; k above 64 sorts."""
    x = np.array([[1, NAN, -0.0, 3, 3, NAN, -INF, 0, 2]], np.float32)
    big = normal((2, 100)).round(1)
    big[1, 7] = big[0, 50] = NAN
    check(lambda x, r, i, b: (lax.top_k(x, 8), lax.top_k(r, 3), lax.top_k(i, 2), lax.top_k(b, 70)),
          x, normal((3, 2, 9)), ints((4, 6), np.int32, 0, 4), big, rtol=0, uses="top_k")


def test_top_k_float64_zero_signs():
    with jax.enable_x64(True):
        x = np.array([[0.0, -0.0, 1.0, -0.0, NAN, 0.0, -1.0]], np.float64)
        check(lambda v: lax.top_k(v, 6), x, rtol=0, uses="top_k")


def test_sort_gradient():
    check(jax.grad(lambda v: jnp.sum(jnp.sort(v, axis=1) * jnp.arange(5.0))), normal((3, 5)), rtol=1e-6,
          uses="sort")


def test_sort_order_descending_keys():
    """The shared sorting network with two keys, descending: NaN first, stable among ties."""
    k1 = np.array([[2, 1, 2, 0, 1, 2, 0]], np.int32)
    k2 = np.array([[NAN, 3, 1, 5, 3, 1, NAN]], np.float32)
    g = Graph("sort_order")
    ctx = LowerCtx(g)
    a, b = g.input("a", k1.shape, "int32"), g.input("b", k2.shape, "float32")
    g.output(B.sort_order(ctx, [a, b], 1, descending=True))
    (got,) = stack_for("cuda-like").run(g, {"a": k1, "b": k2}).outputs
    # by k1 descending, then k2 descending with NaN as the largest value, then index
    want = sorted(range(7), key=lambda i: (-k1[0, i], 0 if np.isnan(k2[0, i]) else 1, -np.nan_to_num(k2[0, i]), i))
    np.testing.assert_array_equal(got[0], want)


# ---- refusals -------------------------------------------------------------------------------------
def _lower_first(fn, *args):
    """Lower the first equation of ``fn``'s jaxpr on graph inputs of its operands' types."""
    eqn = jax.make_jaxpr(fn)(*args).jaxpr.eqns[0]
    g = Graph("refusal")
    ins = [g.input(f"in{i}", tuple(v.aval.shape), str(np.dtype(v.aval.dtype))) for i, v in enumerate(eqn.invars)]
    return lower_eqn(LowerCtx(g), eqn, ins)


def test_refusals_name_the_primitive():
    with pytest.raises(NotLowerable, match="'lgamma'"):
        _lower_first(lax.lgamma, np.ones(3, np.float32))
    with pytest.raises(NotLowerable, match="reduce_precision.*4 exponent and 3 mantissa"):
        _lower_first(lambda v: lax.reduce_precision(v, 4, 3), np.ones(3, np.float32))
    with jax.enable_x64(True):
        with pytest.raises(NotLowerable, match="erfc: float64"):
            _lower_first(lax.erfc, np.ones(3, np.float64))
        with pytest.raises(NotLowerable, match="erf_inv: float64"):
            _lower_first(lax.erf_inv, np.ones(3, np.float64))
    with pytest.raises(NotLowerable, match="integer convolution"):
        _lower_first(lambda a, b: lax.conv_general_dilated(a, b, (1,), "VALID"), np.ones((1, 1, 4), np.int32),
                     np.ones((1, 1, 2), np.int32))


# ---- all vendors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", FAMILIES)
def test_all_vendors(vendor):
    x, w = normal((2, 3, 6, 6), seed=1), normal((4, 3, 3, 3), seed=2)

    def program(a, b):
        y = lax.conv_general_dilated(a, b, (2, 2), "SAME")
        z = jnp.cumsum(jax.nn.sigmoid(y), axis=3)
        flat = z.reshape(2, -1)
        k = lax.erf_inv(jnp.tanh(flat[:, :5]))
        bits = (flat * 1000).astype(jnp.uint32) << 3 ^ jnp.uint32(0xF0F0F0F0)
        return jnp.sort(flat, axis=1), k, jnp.argmax(flat, axis=1), bits, lax.rem(flat, 0.3)
    check(program, x, w, rtol=2e-5, atol=2e-5, vendor=vendor,
          uses=["conv_general_dilated", "cumsum", "logistic", "erf_inv", "sort", "argmax", "shift_left", "rem"])
