"""The collectives' own kernels: one pointwise ISA kernel per reduction step.

``combine``: ``out = a fn b`` (``fn`` the reduction's ISA function, e.g.
``add``); ``div``: ``out = a / N`` (``avg``'s one division by the rank
count).  Each is built with the kernel builder and carries a counted cost
estimate, so the cost model prices it like any generated kernel.
"""

from __future__ import annotations

import math

from ...sim import isa
from ..codegen import POINTWISE_REGISTERS, KernelBuilder, next_pow2, static_counters
from ..ir import DType

#: the largest block (elements per work-group) of a reduction kernel
BLOCK = 1024

#: (kind, fn, dtype, n) of a reduction kernel: ("combine", ISA function, ...) or
#: ("div", rank count, ...)
KernelKey = tuple[str, str | int, DType, int]


def reduction_program(name: str, kind: str, fn: str | int, dtype: DType, n: int,
                      group_size: int) -> tuple[isa.Program, tuple[int, int, int]]:
    """``out = a fn b`` (``combine``) or ``out = a / fn`` (``div`` by the rank count) over
    ``n`` elements: one pointwise ISA kernel with a counted cost estimate, and its grid."""
    kb = KernelBuilder(name)
    dt = dtype.value
    pa = kb.param("a", "ptr", dt)
    pb = kb.param("b", "ptr", dt) if kind == "combine" else None
    po = kb.param("out", "ptr", dt)
    block = min(BLOCK, next_pow2(n))
    flat = kb.binary("add", kb.imul(kb.pid(0), block), kb.arange(block))
    mask = kb.binary("lt", flat, kb.const(n, "int64"))
    x = kb.reg()
    kb.emit(isa.Load(x, pa, flat, mask))
    if pb is not None:
        y = kb.reg()
        kb.emit(isa.Load(y, pb, flat, mask))
        res = kb.binary(str(fn), x, y)
    else:
        res = kb.binary("div", x, kb.const(float(fn), dt))
    kb.emit(isa.Store(po, flat, res, mask))
    grid = (math.ceil(n / block), 1, 1)
    program = kb.program(group_size=group_size, kind="pointwise", block=block,
                         registers=POINTWISE_REGISTERS, shared_memory=0)
    est = static_counters(program, grid, {mask: n})
    nbytes = n * dtype.itemsize
    est.update(kind="counters", read={p: [0, nbytes] for p in (pa, pb) if p},
               write={po: [0, nbytes]})
    program.meta["estimate"] = est
    return program, grid
