"""The record of one library routine call: what ran, which algorithm, and why.

Every routine of a library (GEMM, the DNN routines) returns a :class:`CallRecord`
and appends it to the library's ``calls`` log, which the run report lists under
``algorithms_chosen``.  Its own module so that the routine mixins
(:mod:`fornax.layers.gemm`, :mod:`fornax.layers.dnn`) and the seam that composes
them (:mod:`fornax.layers.library`) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CallRecord:
    """One routine call.  ``shape`` is the routine's problem size in its own order (GEMM:
    ``(batch, m, n, k)``; convolution: ``(n, c, h, w, k, r, s)``; rows: ``(rows, cols)``)."""

    routine: str
    algorithm: str
    reason: str
    image: str                     # "format:target" of the kernel image used
    shape: tuple[int, ...]
    workspace: int = 0             # bytes of workspace the call allocated (and released)
    #: autotune: algorithm name -> predicted seconds (the cost model's price of each candidate)
    predictions: dict[str, float] = field(default_factory=dict)
    #: the call's resolved options as JSON values (dtypes, transposes, epilogue, split-K, tile)
    options: dict[str, Any] = field(default_factory=dict)
