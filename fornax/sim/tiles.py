"""Register tiles: the arrays the interpreter computes on, and their dtype helpers.

A register holds an array of shape ``(instances, *tile)``, or ``(1, *tile)`` for a
value that is the same in every instance.  Tile dimensions are aligned to the right
(numpy's rule), the instance axis always first.  The narrow float types (float16,
bfloat16, the float8s) compute in float32 and round back, as a device's vector unit does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from . import isa
from .arithmetic import cast

#: a register's value: an array of any ISA dtype (the dtype is the register's, at run time)
Tile = npt.NDArray[Any]
#: an index tile (instance ids, element offsets, byte addresses)
Index = npt.NDArray[np.int64]

#: ISA dtypes that compute in float32
LOW_PRECISION = frozenset({"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"})

_DTYPE_NAMES = {dt: name for name, dt in isa.DTYPES.items()}


def dtype_name(arr: Tile) -> str:
    """The ISA name of a tile's dtype (numpy's name for one the ISA does not know)."""
    name = _DTYPE_NAMES.get(arr.dtype)
    if name is not None:
        return name
    for name, dt in isa.DTYPES.items():
        if arr.dtype == dt:
            return name
    return str(arr.dtype.name)


def align(a: Tile, b: Tile) -> tuple[Tile, Tile]:
    """Right-align tile dims of two registers (instance axis stays first)."""
    ra, rb = a.ndim, b.ndim
    if ra < rb:
        a = a.reshape(a.shape[:1] + (1,) * (rb - ra) + a.shape[1:])
    elif rb < ra:
        b = b.reshape(b.shape[:1] + (1,) * (ra - rb) + b.shape[1:])
    return a, b


def operand(arr: Tile, dtype: np.dtype[Any]) -> Tile:
    """``arr`` converted to ``dtype`` (:func:`~.arithmetic.cast`) without the copy when it
    already is a C-contiguous array of ``dtype``: the same values and strides (for a matrix
    product, the same BLAS call)."""
    return arr if arr.dtype == dtype and arr.flags.c_contiguous else cast(arr, dtype)


def compute_dtype(arr: Tile) -> Tile:
    """``arr`` as the vector unit computes on it: a narrow float widened to float32."""
    return arr.astype(np.float32) if dtype_name(arr) in LOW_PRECISION else arr
