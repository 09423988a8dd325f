"""Lowering rules for jax's PRNG primitives and ``bitcast_convert_type``.

A key array ``key<fry>[*s]`` is carried as its data, uint32[*s, 2] held in int64.  The
rules reproduce jax's ``threefry2x32`` implementation (``jax._src.random.threefry2x32``)
bit for bit, in both settings of ``jax_threefry_partitionable`` (read when a rule runs,
as jax reads it when it lowers):

* ``random_seed``: key = (seed >> 32, seed & 0xFFFFFFFF) as uint32 words (a seed of 32
  bits or fewer has high word 0);
* ``random_bits``: partitionable: element ``i`` (row-major) of the result hashes the
  counter ``i`` split into its high and low 32-bit words, and is ``x0 ^ x1`` (8/16 bits:
  its low bits); otherwise: the hash of ``iota(n)`` split into two halves, the halves'
  results concatenated (8/16 bits: each word unpacked into 4 or 2 values, low first);
* ``random_split``: partitionable: new key ``i`` is the pair (x0, x1) of counter ``i``;
  otherwise the hash of ``iota(2n)`` reshaped to ``(n, 2)``;
* ``random_fold_in``: the hash of the pair (0, data);
* ``threefry2x32``: the hash itself, 20 rounds on 32-bit words carried in int64 (add then
  mask, rotate by a multiply and a floor division by powers of two, xor).

A single key's 32-bit ``random_bits`` in partitionable mode is the graph's own
``random_bits`` op, which computes exactly this; everything else is built from
elementwise graph ops.  Keys of another implementation (rbg, unsafe_rbg) are refused:
their bits come from XLA's RngBitGenerator, which the graph IR does not model.

``bitcast_convert_type`` reinterprets bits between floats and integers arithmetically:
an integer's two's-complement pattern is a carried int64 value, and a float's sign,
exponent and mantissa are read or built with exact float64 arithmetic on powers of two
(normals, subnormals, zeros, infinities; every NaN encodes as the canonical quiet NaN,
since a NaN's sign and payload are not observable in the graph IR).
"""

from __future__ import annotations

import math

import jax
import ml_dtypes
import numpy as np

from ...layers.graph import DType, Value
from ...layers.nn_ops import THREEFRY_PARITY, THREEFRY_ROTATIONS
from .lowering import LowerCtx, carried, carried_of, device_shape, lowering

I64 = DType.INT64
MASK32 = (1 << 32) - 1


# ---- threefry-2x32 on graph values -------------------------------------------------------------
def _u32_add(ctx: LowerCtx, a: Value, b: Value) -> Value:
    return ctx.op("bitwise_and", ctx.op("add", a, b), ctx.scalar(MASK32, I64))


def _rotl(ctx: LowerCtx, x: Value, r: int) -> Value:
    hi = ctx.op("bitwise_and", ctx.op("mul", x, ctx.scalar(1 << r, I64)), ctx.scalar(MASK32, I64))
    return ctx.op("bitwise_or", hi, ctx.op("floor_divide", x, ctx.scalar(1 << (32 - r), I64)))


def threefry(ctx: LowerCtx, k0: Value, k1: Value, x0: Value, x1: Value) -> tuple[Value, Value]:
    """Threefry-2x32, 20 rounds, on int64 values holding uint32 words (broadcasting)."""
    ks = (k0, k1, ctx.op("bitwise_xor", ctx.op("bitwise_xor", k0, k1),
                         ctx.scalar(THREEFRY_PARITY, I64)))
    x0, x1 = _u32_add(ctx, x0, ks[0]), _u32_add(ctx, x1, ks[1])
    for block in range(5):
        rots = THREEFRY_ROTATIONS[(block % 2) * 4:(block % 2) * 4 + 4]
        for r in rots:
            x0 = _u32_add(ctx, x0, x1)
            x1 = ctx.op("bitwise_xor", _rotl(ctx, x1, r), x0)
        x0 = _u32_add(ctx, x0, ks[(block + 1) % 3])
        x1 = _u32_add(ctx, _u32_add(ctx, x1, ks[(block + 2) % 3]), ctx.scalar(block + 1, I64))
    return x0, x1


def _to_u32(ctx: LowerCtx, v: Value) -> Value:
    """Any integer value as jax's ``convert_element_type(v, uint32)`` (mod 2**32), in int64."""
    return ctx.op("bitwise_and", ctx.cast(v, I64), ctx.scalar(MASK32, I64))


def _key_words(ctx: LowerCtx, key: Value, trailing: int) -> tuple[Value, Value]:
    """The two words of a key array ``(*s, 2)``, each shaped ``(*s, 1 x trailing)`` to
    broadcast against per-key counters of rank ``trailing``."""
    s = tuple(key.shape[:-1])
    words = []
    for w in (0, 1):
        v = ctx.op("slice", key, start=(0,) * len(s) + (w,), stop=s + (w + 1,))
        words.append(_reshape(ctx, v, s + (1,) * trailing))
    return words[0], words[1]


def _reshape(ctx: LowerCtx, v: Value, shape) -> Value:
    shape = tuple(shape)
    return v if tuple(v.shape) == shape else ctx.op("reshape", v, shape=shape)


def _operand(ctx: LowerCtx, v: Value, var) -> Value:
    """An operand in its aval's shape (a 0-d literal may arrive as a one-element array)."""
    return _reshape(ctx, v, device_shape(var.aval))


def _linear_iota(ctx: LowerCtx, shape) -> Value:
    """int64 row-major linear index of every element of ``shape`` (rank >= 1)."""
    n = math.prod(shape)
    return _reshape(ctx, ctx.op("iota", shape=(n,), axis=0, dtype=I64.value), shape)


def _counter_words(ctx: LowerCtx, shape) -> tuple[Value, Value]:
    """(hi, lo) 32-bit words of the row-major counter over ``shape`` (jax's
    ``iota_2x32_shape``); a 0-d shape has counter 0."""
    if not shape:
        zero = ctx.scalar(0, I64)
        return zero, zero
    count = _linear_iota(ctx, shape)
    if math.prod(shape) <= MASK32 + 1:
        return ctx.scalar(0, I64), count
    return (ctx.op("floor_divide", count, ctx.scalar(1 << 32, I64)),
            ctx.op("bitwise_and", count, ctx.scalar(MASK32, I64)))


def _hash_iota(ctx: LowerCtx, k0: Value, k1: Value, n: int) -> Value:
    """jax's ``threefry_2x32(key, iota(n))`` (the non-partitionable layout): the counters'
    two halves are hashed as (x0, x1) pairs and the results concatenated; int64 ``(..., n)``."""
    if n > MASK32:
        raise ctx.fail(f"{n} counters exceed the 32-bit iota of jax's non-partitionable "
                       "threefry layout (jax then hashes per-block subkeys); set "
                       "jax_threefry_partitionable")
    half = (n + 1) // 2
    count = ctx.op("iota", shape=(2 * half,), axis=0, dtype=I64.value)
    if 2 * half != n:                      # an odd count is padded with a 0 counter
        count = ctx.op("where", ctx.op("lt", count, ctx.scalar(n, I64)), count, ctx.scalar(0, I64))
    lo = ctx.op("slice", count, start=(0,), stop=(half,))
    hi = ctx.op("slice", count, start=(half,), stop=(2 * half,))
    y0, y1 = threefry(ctx, k0, k1, lo, hi)          # both (..., half)
    shape = tuple(y0.shape)
    out = ctx.op("concat", y0, y1, axis=len(shape) - 1)
    if 2 * half != n:
        out = ctx.op("slice", out, start=(0,) * len(shape), stop=shape[:-1] + (n,))
    return out


def _partitionable() -> bool:
    # jax's Config declares its flags at run time, so its type has no attribute for this one
    return bool(jax.config.jax_threefry_partitionable)  # type: ignore[attr-defined]


def _check_impl(ctx: LowerCtx, aval) -> None:
    impl = aval.dtype._impl
    if impl.name != "threefry2x32":
        raise ctx.fail(f"PRNG implementation {impl.name!r} draws its bits from XLA's "
                       "RngBitGenerator, which fornax does not model; use the default "
                       "threefry2x32 keys (jax.random.key / PRNGKey)")


# ---- key primitives ----------------------------------------------------------------------------
@lowering("random_wrap", "random_unwrap")
def random_wrap(ctx, eqn, x):
    """Key arrays are carried as their data: wrapping and unwrapping change no value."""
    return x


@lowering("random_seed")
def random_seed(ctx, eqn, seeds):
    """jax's ``threefry_seed``: key words (high 32 bits, low 32 bits) of each integer seed."""
    _check_impl(ctx, eqn.outvars[0].aval)
    dt = np.dtype(eqn.invars[0].aval.dtype)
    seeds = _operand(ctx, seeds, eqn.invars[0])
    s = ctx.cast(seeds, I64)
    lo = ctx.op("bitwise_and", s, ctx.scalar(MASK32, I64))
    if dt.itemsize == 8:
        hi = ctx.op("bitwise_and", ctx.op("floor_divide", s, ctx.scalar(1 << 32, I64)),
                    ctx.scalar(MASK32, I64))
    else:                                          # a shift by >= the width gives 0
        hi = _broadcast(ctx, ctx.scalar(0, I64), lo.shape)
    shape = tuple(seeds.shape) + (1,)
    return ctx.op("concat", _reshape(ctx, hi, shape), _reshape(ctx, lo, shape), axis=len(shape) - 1)


@lowering("random_bits")
def random_bits(ctx, eqn, keys):
    """uint{8,16,32} bits of shape ``(*keys.shape, *shape)``, by jax's threefry layout (see
    the module docstring).  uint64 bits have no device dtype and never reach this rule."""
    key_aval, out_aval = eqn.invars[0].aval, eqn.outvars[0].aval
    _check_impl(ctx, key_aval)
    width = int(eqn.params["bit_width"])
    shape = tuple(int(d) for d in eqn.params["shape"])
    out_shape = device_shape(out_aval)
    if _partitionable():
        if not key_aval.shape and width == 32:
            return _reshape(ctx, ctx.op("random_bits", keys, shape=shape, offset=0), out_shape)
        k0, k1 = _key_words(ctx, keys, len(shape))
        hi, lo = _counter_words(ctx, shape)
        y0, y1 = threefry(ctx, k0, k1, hi, lo)
        bits = ctx.op("bitwise_xor", y0, y1)
        if width < 32:
            bits = ctx.op("bitwise_and", bits, ctx.scalar((1 << width) - 1, I64))
    else:
        n = math.prod(shape)
        words = -(-width * n // 32)
        k0, k1 = _key_words(ctx, keys, 1)
        flat = _hash_iota(ctx, k0, k1, words)           # (*s, words)
        if width < 32:
            per = 32 // width
            pos = np.arange(n)
            pick = ctx.const(pos // per)
            shift = ctx.const(np.left_shift(np.int64(1), width * (pos % per)))
            flat = ctx.op("index_select", flat, pick, axis=len(flat.shape) - 1)
            flat = ctx.op("bitwise_and", ctx.op("floor_divide", flat, shift),
                          ctx.scalar((1 << width) - 1, I64))
        bits = flat
    return ctx.cast(_reshape(ctx, bits, out_shape), carried(out_aval.dtype).dtype)


@lowering("random_split")
def random_split(ctx, eqn, keys):
    """Keys ``(*keys.shape, *shape)`` derived from each key by jax's threefry split."""
    key_aval = eqn.invars[0].aval
    _check_impl(ctx, key_aval)
    shape = tuple(int(d) for d in eqn.params["shape"])
    out_shape = device_shape(eqn.outvars[0].aval)
    if _partitionable():
        k0, k1 = _key_words(ctx, keys, len(shape))
        hi, lo = _counter_words(ctx, shape)
        y0, y1 = threefry(ctx, k0, k1, hi, lo)
        full = out_shape[:-1] + (1,)
        y0, y1 = (_reshape(ctx, _broadcast(ctx, y, out_shape[:-1]), full) for y in (y0, y1))
        return ctx.op("concat", y0, y1, axis=len(full) - 1)
    k0, k1 = _key_words(ctx, keys, 1)
    return _reshape(ctx, _hash_iota(ctx, k0, k1, 2 * math.prod(shape)), out_shape)


def _broadcast(ctx: LowerCtx, v: Value, shape) -> Value:
    shape = tuple(shape)
    return v if tuple(v.shape) == shape else ctx.op("broadcast_to", v, shape=shape)


@lowering("random_fold_in")
def random_fold_in(ctx, eqn, keys, msgs):
    """New key = threefry(key, (0, uint32(data))) (jax's ``threefry_fold_in``)."""
    key_aval = eqn.invars[0].aval
    _check_impl(ctx, key_aval)
    out_shape = device_shape(eqn.outvars[0].aval)
    k0, k1 = _key_words(ctx, keys, 0)
    msgs = _operand(ctx, msgs, eqn.invars[1])
    y0, y1 = threefry(ctx, k0, k1, ctx.scalar(0, I64), _to_u32(ctx, msgs))
    full = out_shape[:-1] + (1,)
    y0, y1 = (_reshape(ctx, _broadcast(ctx, y, out_shape[:-1]), full) for y in (y0, y1))
    return ctx.op("concat", y0, y1, axis=len(full) - 1)


@lowering("threefry2x32")
def threefry2x32(ctx, eqn, k0, k1, x0, x1):
    """The hash primitive itself, its four uint32 operands broadcast together."""
    shape = tuple(int(d) for d in eqn.outvars[0].aval.shape)
    k0, k1, x0, x1 = (_operand(ctx, v, var) for v, var in zip((k0, k1, x0, x1), eqn.invars))
    y0, y1 = threefry(ctx, k0, k1, x0, x1)
    return _broadcast(ctx, y0, shape), _broadcast(ctx, y1, shape)


# ---- bitcast_convert_type ------------------------------------------------------------------------
#: float formats: (exponent bits, mantissa bits)
_FLOAT_FORMATS = {np.dtype(np.float64): (11, 52), np.dtype(np.float32): (8, 23),
                  np.dtype(np.float16): (5, 10), np.dtype(ml_dtypes.bfloat16): (8, 7)}
F64 = DType.FLOAT64


def _mul_pow2(ctx: LowerCtx, x: Value, p: int) -> Value:
    """``x * 2**p`` exactly, in steps whose factors are finite float64 constants."""
    while p:
        step = max(-512, min(512, p))
        x = ctx.op("mul", x, ctx.scalar(2.0 ** step, x.dtype))
        p -= step
    return x


def _pow2_of(ctx: LowerCtx, e: Value, lo: int, hi: int) -> Value:
    """``2.0 ** e`` (float64) for an int64 tensor ``e`` in ``[lo, hi]``, exactly: the product
    of the powers of two of the bits of ``e - lo``."""
    d = ctx.op("sub", e, ctx.scalar(lo, I64))
    out = ctx.scalar(2.0 ** lo, F64)
    for k in range(max(1, (hi - lo).bit_length())):
        bit = ctx.op("ne", ctx.op("bitwise_and", d, ctx.scalar(1 << k, I64)), ctx.scalar(0, I64))
        out = ctx.op("where", bit, _mul_pow2(ctx, out, 1 << k), out)
    return out


def _decode_float(ctx: LowerCtx, bits: Value, fmt: tuple[int, int], width: int) -> Value:
    """The float64 value of a ``width``-bit IEEE pattern (int64, unsigned for width < 64,
    two's complement for 64)."""
    ebits, mbits = fmt
    bias = (1 << (ebits - 1)) - 1
    emax = (1 << ebits) - 1
    if width == 64:
        neg = ctx.op("lt", bits, ctx.scalar(0, I64))
        mag = ctx.op("bitwise_and", bits, ctx.scalar((1 << 63) - 1, I64))
    else:
        neg = ctx.op("ge", bits, ctx.scalar(1 << (width - 1), I64))
        mag = ctx.op("bitwise_and", bits, ctx.scalar((1 << (width - 1)) - 1, I64))
    mant = ctx.op("bitwise_and", mag, ctx.scalar((1 << mbits) - 1, I64))
    expf = ctx.op("floor_divide", mag, ctx.scalar(1 << mbits, I64))
    normal = ctx.op("gt", expf, ctx.scalar(0, I64))
    sig = ctx.op("add", mant, ctx.op("where", normal, ctx.scalar(1 << mbits, I64), ctx.scalar(0, I64)))
    e = ctx.op("maximum", expf, ctx.scalar(1, I64))
    scale = _pow2_of(ctx, ctx.op("sub", e, ctx.scalar(bias + mbits, I64)), 1 - bias - mbits,
                     emax - bias - mbits)
    val = ctx.op("mul", ctx.cast(sig, F64), scale)
    special = ctx.op("where", ctx.op("eq", mant, ctx.scalar(0, I64)), ctx.scalar(math.inf, F64),
                     ctx.scalar(math.nan, F64))
    val = ctx.op("where", ctx.op("eq", expf, ctx.scalar(emax, I64)), special, val)
    return ctx.op("where", neg, ctx.op("neg", val), val)


def _encode_float(ctx: LowerCtx, x: Value, fmt: tuple[int, int], width: int) -> Value:
    """The IEEE pattern of float values (int64: unsigned for width < 64, two's complement
    for 64); NaN gives the canonical quiet NaN."""
    ebits, mbits = fmt
    bias = (1 << (ebits - 1)) - 1
    emax = (1 << ebits) - 1
    v = ctx.cast(x, F64)
    zero = ctx.scalar(0.0, F64)
    # -0.0 is negative: its reciprocal is -inf
    neg = ctx.op("logical_or", ctx.op("lt", v, zero), ctx.op("lt", ctx.op("reciprocal", v), zero))
    a = ctx.op("abs", v)
    finite_pos = ctx.op("logical_and", ctx.op("gt", a, zero),
                        ctx.op("lt", a, ctx.scalar(math.inf, F64)))
    t = ctx.op("where", finite_pos, a, ctx.scalar(1.0, F64))      # normalised into [1, 2)
    e = ctx.scalar(0, I64)
    for k in reversed(range(bias.bit_length())):             # divide down to t < 2
        p = 1 << k
        up = ctx.op("ge", t, ctx.scalar(2.0 ** p, F64))
        t = ctx.op("where", up, _mul_pow2(ctx, t, -p), t)
        e = ctx.op("add", e, ctx.op("where", up, ctx.scalar(p, I64), ctx.scalar(0, I64)))
    for k in reversed(range((bias - 1 + mbits).bit_length())):   # multiply up to t >= 1
        p = 1 << k
        down = ctx.op("lt", t, ctx.scalar(2.0 ** (1 - p), F64))
        t = ctx.op("where", down, _mul_pow2(ctx, t, p), t)
        e = ctx.op("sub", e, ctx.op("where", down, ctx.scalar(p, I64), ctx.scalar(0, I64)))
    normal = ctx.op("ge", e, ctx.scalar(1 - bias, I64))
    n_mant = ctx.op("mul", ctx.op("sub", t, ctx.scalar(1.0, F64)), ctx.scalar(2.0 ** mbits, F64))
    s_mant = _mul_pow2(ctx, a, bias - 1 + mbits)
    mant = ctx.cast(ctx.op("where", normal, n_mant, s_mant), I64)
    expf = ctx.op("where", normal, ctx.op("add", e, ctx.scalar(bias, I64)), ctx.scalar(0, I64))
    # zeros, infinities, NaN
    is_zero = ctx.op("eq", a, zero)
    is_nan = ctx.op("isnan", v)
    is_inf = ctx.op("eq", a, ctx.scalar(math.inf, F64))
    special = ctx.op("logical_or", is_nan, is_inf)
    expf = ctx.op("where", special, ctx.scalar(emax, I64),
                  ctx.op("where", is_zero, ctx.scalar(0, I64), expf))
    mant = ctx.op("where", is_nan, ctx.scalar(1 << (mbits - 1), I64),
                  ctx.op("where", ctx.op("logical_or", is_zero, is_inf), ctx.scalar(0, I64), mant))
    neg = ctx.op("logical_and", neg, ctx.op("logical_not", is_nan))
    mag = ctx.op("add", ctx.op("mul", expf, ctx.scalar(1 << mbits, I64)), mant)
    sign = -(1 << 63) if width == 64 else 1 << (width - 1)
    return ctx.op("where", neg, ctx.op("add", mag, ctx.scalar(sign, I64)), mag)


def _to_pattern(ctx: LowerCtx, v: Value, dtype) -> Value:
    """The bit pattern of ``v`` (jax dtype ``dtype``) as int64: unsigned for < 64 bits."""
    dt = np.dtype(dtype)
    width = dt.itemsize * 8
    if dt in _FLOAT_FORMATS:
        return _encode_float(ctx, v, _FLOAT_FORMATS[dt], width)
    v = ctx.cast(v, I64)
    if width == 64:
        return v
    return ctx.op("bitwise_and", v, ctx.scalar((1 << width) - 1, I64))


def _from_pattern(ctx: LowerCtx, bits: Value, dtype) -> Value:
    """The value of jax dtype ``dtype`` whose bit pattern is ``bits`` (as from _to_pattern)."""
    dt = np.dtype(dtype)
    width = dt.itemsize * 8
    dev = carried_of(dt).dtype
    if dt in _FLOAT_FORMATS:
        return ctx.cast(_decode_float(ctx, bits, _FLOAT_FORMATS[dt], width), dev)
    if dt.kind == "i" and width < 64:
        half = ctx.scalar(1 << (width - 1), I64)
        bits = ctx.op("where", ctx.op("ge", bits, half),
                      ctx.op("sub", bits, ctx.scalar(1 << width, I64)), bits)
    return ctx.cast(bits, dev)


@lowering("bitcast_convert_type")
def bitcast_convert_type(ctx, eqn, x):
    """Reinterpret the bits of each element (XLA's bitcast-convert).  A narrower result adds
    a trailing dim holding the pieces of each element, least significant first (the
    little-endian order of XLA CPU); a wider one consumes such a dim."""
    src, dst = np.dtype(eqn.invars[0].aval.dtype), np.dtype(eqn.outvars[0].aval.dtype)
    x = _operand(ctx, x, eqn.invars[0])
    ws, wd = src.itemsize * 8, dst.itemsize * 8
    bits = _to_pattern(ctx, x, src)
    if ws > wd:
        parts = []
        shape = tuple(bits.shape) + (1,)
        if ws == 64:                                      # split the signed pattern safely
            lo = ctx.op("bitwise_and", bits, ctx.scalar(MASK32, I64))
            hi = ctx.op("bitwise_and", ctx.op("floor_divide", bits, ctx.scalar(1 << 32, I64)),
                        ctx.scalar(MASK32, I64))
            words = [lo, hi]
            sub = 32
        else:
            words, sub = [bits], ws
        for w in words:
            for i in range(sub // wd):
                piece = ctx.op("floor_divide", w, ctx.scalar(1 << (wd * i), I64)) if i else w
                parts.append(_reshape(ctx, ctx.op("bitwise_and", piece,
                                                  ctx.scalar((1 << wd) - 1, I64)), shape))
        bits = ctx.op("concat", *parts, axis=len(shape) - 1)
    elif ws < wd:
        n = wd // ws
        lead = tuple(bits.shape[:-1])
        total = None
        for i in range(n):
            piece = _reshape(ctx, ctx.op("slice", bits, start=(0,) * len(lead) + (i,),
                                         stop=lead + (i + 1,)), lead)
            if wd == 64 and ws * (i + 1) == 64:           # the top piece carries the sign
                half = 1 << (ws - 1)
                piece = ctx.op("where", ctx.op("ge", piece, ctx.scalar(half, I64)),
                               ctx.op("sub", piece, ctx.scalar(1 << ws, I64)), piece)
            term = ctx.op("mul", piece, ctx.scalar(1 << (ws * i), I64)) if i else piece
            total = term if total is None else ctx.op("add", total, term)
        bits = total
    return _from_pattern(ctx, bits, dst)
