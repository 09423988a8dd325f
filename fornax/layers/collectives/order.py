"""The summation order of each collective algorithm, on host arrays.

The in-process communicator's schedules (:mod:`.algorithms`) reduce in a fixed order, which
is what makes a float result bit-exact and the same on every rank:

* **ring**: chunk ``c`` of the buffer (``np.array_split`` bounds over ``N`` ranks) is summed
  in ring order starting at rank ``c+1``: ``((x[c+1] + x[c+2]) + ...) + x[c]``;
* **tree**: pairwise by binomial level, ``((x0 + x1) + (x2 + x3)) + ...``;

``avg`` divides the finished sum by ``N`` once.  ``max`` and ``min`` do not depend on order.
A process-per-rank backend (``fornax.frameworks.torch.distributed``), which gathers every
rank's input and reduces on each rank, computes the same bits with :func:`reduce_in_order`,
on numpy arrays (:data:`NUMPY`) or on any array type given its :class:`ArrayOps` (torch's
CPU tensors, for dtypes numpy lacks such as bfloat16).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .algorithms import bounds


@dataclass(frozen=True)
class ArrayOps:
    """What a reduction needs of an array type: elementwise combines by reduction name, a
    concatenation of 1-D pieces, and the division of ``avg`` (array, ranks) in the dtype."""

    combine: dict[str, Callable[[Any, Any], Any]]
    concat: Callable[[list[Any]], Any]
    average: Callable[[Any, int], Any]


def _np_average(x: Any, n: int) -> Any:
    if np.issubdtype(x.dtype, np.integer):
        return x // n
    return (x / np.asarray(n, dtype=x.dtype)).astype(x.dtype)


NUMPY = ArrayOps(
    combine={"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
             "product": np.multiply, "band": np.bitwise_and, "bor": np.bitwise_or,
             "bxor": np.bitwise_xor},
    concat=np.concatenate, average=_np_average)


def reduce_in_order(xs: Sequence[Any], op: str, algorithm: str = "ring", ops: ArrayOps = NUMPY) -> Any:
    """The reduction of the equally shaped 1-D arrays ``xs`` (one per rank) in ``algorithm``'s
    order; ``avg`` divides by the number of ranks once, at the end (in the input dtype)."""
    if op not in ops.combine:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(ops.combine)}")
    n = len(xs)
    if n == 0:
        raise ValueError("a reduction needs at least one rank's input")
    combine = ops.combine[op]
    if n == 1:
        out = xs[0][:]
    elif algorithm == "tree":
        v = list(xs)
        step = 1
        while step < n:
            for i in range(0, n, 2 * step):
                if i + step < n:
                    v[i] = combine(v[i], v[i + step])
            step *= 2
        out = v[0]
    else:
        pieces = []
        for c, (lo, hi) in enumerate(bounds(len(xs[0]), n)):
            if hi <= lo:
                continue
            acc = xs[(c + 1) % n][lo:hi]
            for k in range(2, n + 1):
                acc = combine(acc, xs[(c + k) % n][lo:hi])
            pieces.append(acc)
        out = ops.concat(pieces) if pieces else xs[0][:0]
    return ops.average(out, n) if op == "avg" else out
