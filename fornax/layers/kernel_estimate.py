"""Static cost estimates of generated kernels: what the executor would count, without executing.

A generator attaches an estimate to each program it builds
(``program.meta["estimate"]``) so a shape-only device prices a launch
without running it.  :func:`static_counters` follows a program's registers
by tile shape, dtype and whether they vary across instances, and counts
instructions, vector and matrix FLOPs and the bytes of every load and store
exactly as the executor does; the footprint helpers give each buffer's byte
range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..sim import isa
from .kernel_builder import Instruction, Operand

#: a kernel's cost estimate as stored in ``program.meta["estimate"]`` (JSON-shaped: its keys
#: depend on the estimate's ``kind``: "counters", "gemm", "outputs", ...)
Estimate = dict[str, Any]
#: a register's tile shape, dtype and whether it varies across program instances
_Reg = tuple[tuple[int, ...], str, bool]


def _bcast(*tiles: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*tiles))


def static_counters(program: isa.Program, grid: tuple[int, int, int],
                    active: Mapping[str, int] | None = None,
                    args: Mapping[str, int] | None = None) -> Estimate:
    """Count a program's work the way the executor does, from tile shapes alone.

    Registers are followed by tile shape, dtype and whether they vary across
    instances; ``active`` gives, for each mask register, how many of its
    lanes (over all instances) are true — the one thing that needs the
    kernel's meaning rather than its shapes.  Vector FLOPs (index arithmetic
    included), matrix FLOPs and the bytes of every load and store come out
    as the executor counts them.  Loop trip counts come from the program or,
    for scalar bounds, from ``args``.
    """
    active = active or {}
    args = args or {}
    n = grid[0] * grid[1] * grid[2]
    params = {p.name: p for p in program.params}
    regs: dict[str, _Reg] = {}
    scalars: dict[str, str] = {}           # register -> the scalar parameter it reads
    tables: dict[str, dict[str, float]] = {"matrix_flops": {}, "vector_flops": {}}
    counts = {"bytes_read": 0, "bytes_written": 0, "instructions": 0}

    def flops(table: str, dtype: str, amount: float) -> None:
        tables[table][dtype] = tables[table].get(dtype, 0.0) + float(amount)

    def lanes(mask: str | None, tile: tuple[int, ...]) -> int:
        """Active lanes of an access of ``tile`` over all instances."""
        if mask is None:
            return n * math.prod(tile)
        mtile = regs[mask][0]
        return active[mask] * math.prod(tile) // math.prod(mtile)

    def walk(body: Sequence[Instruction], reps: int) -> None:
        for ins in body:
            counts["instructions"] += reps
            if isinstance(ins, isa.ProgramId):
                regs[ins.dst] = ((), "int64", True)
            elif isinstance(ins, isa.Arange):
                regs[ins.dst] = ((ins.n,), "int64", False)
            elif isinstance(ins, isa.Const):
                regs[ins.dst] = ((), ins.dtype, False)
            elif isinstance(ins, isa.ScalarArg):
                regs[ins.dst] = ((), params[ins.param].dtype, False)
                scalars[ins.dst] = ins.param
            elif isinstance(ins, isa.Unary):
                tile, dt, var = regs[ins.src]
                flops("vector_flops", dt, reps * n * math.prod(tile))
                regs[ins.dst] = (tile, "bool" if ins.fn in ("not", "isnan") else dt, var)
            elif isinstance(ins, isa.Binary):
                (ta, da, va), (tb, _, vb) = regs[ins.a], regs[ins.b]
                tile = _bcast(ta, tb)
                flops("vector_flops", da, reps * n * math.prod(tile))
                res = "bool" if ins.fn in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or") else da
                regs[ins.dst] = (tile, res, va or vb)
            elif isinstance(ins, isa.Where):
                (tc, _, vc), (ta, da, va), (tb, _, vb) = regs[ins.cond], regs[ins.a], regs[ins.b]
                regs[ins.dst] = (_bcast(tc, ta, tb), da, vc or va or vb)
            elif isinstance(ins, isa.Convert):
                tile, _, var = regs[ins.src]
                regs[ins.dst] = (tile, ins.dtype, var)
            elif isinstance(ins, (isa.Reshape, isa.Broadcast)):
                _, dt, var = regs[ins.src]
                regs[ins.dst] = (tuple(ins.shape), dt, var)
            elif isinstance(ins, isa.Reduce):
                tile, dt, var = regs[ins.src]
                flops("vector_flops", dt, reps * (n if var else 1) * math.prod(tile))
                ax = ins.axis if ins.axis >= 0 else len(tile) + ins.axis
                regs[ins.dst] = (tuple(1 if d == ax else s for d, s in enumerate(tile)),
                                 "int64" if ins.fn in isa.ARG_REDUCE else dt, var)
            elif isinstance(ins, isa.Load):
                to, _, vo = regs[ins.offsets]
                tm, _, vm = regs[ins.mask] if ins.mask is not None else ((), "bool", False)
                tile = _bcast(to, tm)
                item = isa.np_dtype(params[ins.ptr].dtype).itemsize
                counts["bytes_read"] += reps * lanes(ins.mask, tile) * item
                regs[ins.dst] = (tile, params[ins.ptr].dtype, vo or vm)
            elif isinstance(ins, isa.Store):
                to, _, vo = regs[ins.offsets]
                tv, _, vv = regs[ins.value]
                tm, _, vm = regs[ins.mask] if ins.mask is not None else ((), "bool", False)
                tile = _bcast(to, tv, tm)
                item = isa.np_dtype(params[ins.ptr].dtype).itemsize
                if ins.mask is None:
                    count = (n if (vo or vv) else 1) * math.prod(tile)
                else:
                    count = lanes(ins.mask, tile)
                counts["bytes_written"] += reps * count * item
            elif isinstance(ins, (isa.Dot, isa.SparseDot)):
                # a 2:4 operand's [M, K/2] values stand for K columns: dense-equivalent work
                (ta, da, _), (tb, _, _) = regs[ins.a], regs[ins.b]
                flops("matrix_flops", da, reps * 2.0 * ta[0] * tb[1] * tb[0] * n)
                regs[ins.dst] = (regs[ins.acc][0], ins.acc_dtype, True)
            elif isinstance(ins, isa.Loop):
                stop = ins.stop if isinstance(ins.stop, int) else int(args[scalars[ins.stop]])
                regs[ins.var] = ((), "int64", False)
                walk(ins.body, reps * len(range(ins.start, stop, ins.step)))
    walk(program.body, 1)
    return {"instances": n, "matrix_flops": tables["matrix_flops"],
            "vector_flops": tables["vector_flops"], "bytes_read": counts["bytes_read"],
            "bytes_written": counts["bytes_written"], "instructions": counts["instructions"]}


def attach_estimate(program: isa.Program, estimate: Estimate) -> isa.Program:
    """Store ``estimate`` as the program's cost estimate and return the program."""
    program.meta["estimate"] = estimate
    return program


def footprint(params: Sequence[tuple[str, int]]) -> dict[str, list[int]]:
    """Byte ranges [0, nbytes) relative to each parameter's base (every element touched)."""
    return {name: [0, nbytes] for name, nbytes in params}


def pointwise_estimate(program: isa.Program, grid: tuple[int, int, int], mask: str, numel: int,
                       inputs: Mapping[int, Operand], outputs: Mapping[int, Operand],
                       active: Mapping[str, int] | None = None) -> Estimate:
    """The counters estimate of a pointwise kernel of ``numel`` elements under ``mask``,
    every input and output touched whole."""
    est = static_counters(program, grid, {mask: numel, **(active or {})})
    est.update(kind="counters",
               read=footprint([(o.param, o.value.type.nbytes) for o in inputs.values()]),
               write=footprint([(o.param, o.value.type.nbytes) for o in outputs.values()]))
    return est
