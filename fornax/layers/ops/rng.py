"""Counter-based random numbers: ``random_bits``, ``random_uniform``, ``random_normal`` over
Threefry-2x32 (20 rounds, as Random123 and JAX define it).

A key is an int64 tensor of shape ``(2,)`` holding two 32-bit words;
element ``i`` (row-major) of the result uses counter ``offset + i``, split
into its high and low 32-bit words.  ``random_bits`` is the xor of the two
output words (JAX's partitionable ``random.bits``), as int64 in
``[0, 2**32)``; ``random_uniform`` uses its top 24 bits; ``random_normal``
is Box-Muller over both words.  The constants of the hash
(:data:`MASK32`, :data:`THREEFRY_ROTATIONS`, :data:`THREEFRY_PARITY`) are
shared with the code generator and the JAX front end.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import GraphError
from ..ir import DType, TensorType
from .registry import Array, Attrs, OpDef, register

MASK32 = 0xFFFFFFFF
THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
THREEFRY_PARITY = 0x1BD11BDA
#: the dtypes random_uniform and random_normal produce
RANDOM_DTYPES = (DType.FLOAT32, DType.FLOAT64)

_Words = NDArray[np.int64]


def threefry2x32(key: tuple[int, int], c0: ArrayLike, c1: ArrayLike) -> tuple[_Words, _Words]:
    """Threefry-2x32 with 20 rounds (Salmon et al., SC'11), on uint32 words held in int64."""
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    ks = (k0, k1, THREEFRY_PARITY ^ k0 ^ k1)
    x0 = (np.asarray(c0, np.int64) + ks[0]) & MASK32
    x1 = (np.asarray(c1, np.int64) + ks[1]) & MASK32
    for block in range(5):
        for r in THREEFRY_ROTATIONS[(block % 2) * 4:(block % 2) * 4 + 4]:
            x0 = (x0 + x1) & MASK32
            x1 = ((x1 << r) | (x1 >> (32 - r))) & MASK32
            x1 = x1 ^ x0
        x0 = (x0 + ks[(block + 1) % 3]) & MASK32
        x1 = (x1 + ks[(block + 2) % 3] + block + 1) & MASK32
    return x0, x1


def _words(key: ArrayLike, shape: tuple[int, ...], offset: int) -> tuple[_Words, _Words]:
    counter = np.arange(math.prod(shape), dtype=np.int64) + offset
    k = np.asarray(key).astype(np.int64).reshape(-1)
    x0, x1 = threefry2x32((int(k[0]), int(k[1])), counter >> 32, counter & MASK32)
    return x0.reshape(shape), x1.reshape(shape)


def _check_random(op: str, types: list[TensorType], attrs: Attrs, floats: bool) -> TensorType:
    (key,) = types
    if key.dtype is not DType.INT64 or key.shape != (2,):
        raise GraphError(f"{op}: key must be int64[2] (two 32-bit words), got {key}", op=op)
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                      and d > 0 for d in shape):
        raise GraphError(f"{op}: shape must be a tuple of positive ints, got {shape!r}", op=op)
    offset = attrs.get("offset", 0)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or \
            offset + math.prod(shape) > 2 ** 63:
        raise GraphError(f"{op}: offset must be a non-negative int counter start, got {offset!r}", op=op)
    if floats:
        dt = DType.of(attrs.get("dtype", "float32"))
        if dt not in RANDOM_DTYPES:
            raise GraphError(f"{op}: dtype must be float32 or float64, got {dt}; cast the result",
                             op=op)
        return TensorType(tuple(shape), dt)
    return TensorType(tuple(shape), DType.INT64)


def _infer_random_uniform(types: list[TensorType], attrs: Attrs) -> TensorType:
    t = _check_random("random_uniform", types, attrs, True)
    lo, hi = attrs.get("minval", 0.0), attrs.get("maxval", 1.0)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (lo, hi)) \
            or not lo < hi:
        raise GraphError(f"random_uniform: needs finite minval < maxval, got {lo!r}, {hi!r}",
                         op="random_uniform")
    return t


def _random_bits_ref(key: Array, shape: Sequence[int], offset: int = 0) -> Array:
    x0, x1 = _words(key, tuple(shape), offset)
    return x0 ^ x1


def _random_uniform_ref(key: Array, shape: Sequence[int], dtype: str = "float32", minval: float = 0.0,
                        maxval: float = 1.0, offset: int = 0) -> Array:
    bits = _random_bits_ref(key, shape, offset)
    u = (bits >> 8).astype(np.float64) * 2.0 ** -24
    out: NDArray[Any] = minval + u * (maxval - minval)
    return out


def _random_normal_ref(key: Array, shape: Sequence[int], dtype: str = "float32", offset: int = 0) -> Array:
    x0, x1 = _words(key, tuple(shape), offset)
    u1 = ((x0 >> 8) + 1).astype(np.float64) * 2.0 ** -24          # (0, 1]
    u2 = (x1 >> 8).astype(np.float64) * 2.0 ** -24                  # [0, 1)
    out: NDArray[Any] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return out


register(OpDef("random_bits", "indexed", 1, lambda t, a: _check_random("random_bits", t, a, False),
               _random_bits_ref, attrs=("shape", "offset")))
register(OpDef("random_uniform", "indexed", 1, _infer_random_uniform, _random_uniform_ref,
               attrs=("shape", "dtype", "minval", "maxval", "offset")))
register(OpDef("random_normal", "indexed", 1,
               lambda t, a: _check_random("random_normal", t, a, True),
               _random_normal_ref, attrs=("shape", "dtype", "offset")))
