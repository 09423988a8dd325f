"""Arithmetic the device defines where numpy does not: the executor's conversions and
integer powers.

numpy leaves a float-to-integer cast of NaN, an infinity or an out-of-range value
undefined (and warns), and refuses integers raised to negative integer powers (raises).
A device does neither: its convert instruction saturates and its integer power is a
total function.  These are the tile ISA's definitions of both, used by every path of the
executor (first launches and replays alike).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

#: the narrow float types numpy does not know as ``kind == "f"``
_LOW_PRECISION = frozenset(np.dtype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                                   ml_dtypes.float8_e5m2))


def cast(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``arr`` in ``dtype`` as the device's convert instruction defines it (numpy leaves the
    first two undefined and warns):

    * float to integer truncates toward zero and **saturates**: values above the range
      (``+inf`` included) give the largest integer, values below it the smallest, NaN gives
      0 (what GPU float-to-integer conversions do);
    * float to a narrower float rounds to nearest even, overflowing to ``inf`` (IEEE);
    * everything else is numpy's cast."""
    dtype = np.dtype(dtype)
    if arr.dtype == dtype:
        return arr
    if dtype.kind in "iu" and (arr.dtype.kind == "f" or arr.dtype in _LOW_PRECISION):
        return _float_to_int(arr, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return arr.astype(dtype)


def _float_to_int(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    work = arr if arr.dtype.kind == "f" else arr.astype(np.float32)
    info = np.iinfo(dtype)
    # the exclusive upper bound and the lower bound are powers of two (or 0): exact in floats
    above = float(info.max) + 1.0
    with np.errstate(invalid="ignore"):
        whole = np.trunc(work)
        high = whole >= above
        low = whole < float(info.min)
        nan = np.isnan(work)
        bad = high | low | nan
        if not bad.any():
            done: npt.NDArray[Any] = whole.astype(dtype)
            return done
        out = np.where(bad, np.zeros((), work.dtype), whole).astype(dtype)
    out[high] = info.max
    out[low] = info.min
    return out


def power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a ** b`` as a device computes it.  Signed integers to a negative power truncate
    toward zero like integer division: ``1`` stays 1, ``-1`` alternates in sign, every
    other base gives 0 (numpy refuses such powers; a device has no exceptions).  Positive
    integer powers wrap around on overflow, floats follow IEEE."""
    if a.dtype.kind != "i" or b.dtype.kind != "i" or not (b < 0).any():
        result: npt.NDArray[Any] = np.power(a, b)
        return result
    negative = b < 0
    plain = np.power(a, np.where(negative, np.zeros((), b.dtype), b))
    one = np.ones((), a.dtype)
    odd = (b & 1).astype(bool)
    unit = np.where(a == 1, one, np.where(a == -1, np.where(odd, -one, one), np.zeros((), a.dtype)))
    return np.where(negative, unit, plain)
