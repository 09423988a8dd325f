"""The kernel builder: the base every kernel generator writes tile-ISA programs with.

:class:`KernelBuilder` appends :mod:`fornax.sim.isa` instructions to a program
body under fresh register names (constants deduplicated), and closes the body
into a verified :class:`~fornax.sim.isa.Program`.  Beside it live the index
helpers every generator shares: row-major :func:`strides`, :func:`next_pow2`
tile widths, and :func:`offsets`, the element offsets of an operand broadcast
into an iteration space (NumPy rules, dims aligned right).

The compiler's fused kernels (:mod:`fornax.layers.codegen`,
:mod:`fornax.layers.codegen_nn`), the DNN and BLAS libraries' kernels
(:mod:`fornax.layers.codegen_dnn`, :mod:`fornax.layers.blas`) and the
collectives' kernels all build on this module; it depends only on the ISA and
the graph's :class:`~fornax.layers.graph.Value` (an :class:`Operand`'s tensor).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union, overload

from ..sim import isa
from .graph import Value

#: 32-bit registers per lane a generated kernel declares for addressing
POINTWISE_REGISTERS = 32

#: a launch grid: program instances along axes 0, 1 and 2
Grid = tuple[int, int, int]
#: a tile-ISA instruction that writes a destination register (``dst``)
Defining = Union[isa.ProgramId, isa.Arange, isa.Const, isa.ScalarArg, isa.Unary, isa.Binary,
                 isa.Where, isa.Convert, isa.Reshape, isa.Broadcast, isa.Reduce, isa.Load, isa.Dot,
                 isa.SparseDot]
#: one tile-ISA instruction, as a kernel body holds it
Instruction = Union[Defining, isa.Store, isa.StoreReduce, isa.Barrier, isa.Loop]


def defined(name: str | None) -> str:
    """The register a defining instruction (or an index sum) yields: one always exists where
    this is called."""
    assert name is not None, "the instruction defines no register"
    return name


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of a contiguous tensor of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def next_pow2(n: int) -> int:
    """The least power of two not below ``n`` (1 for ``n <= 1``): a tile width."""
    return 1 << max(0, (n - 1).bit_length())


class KernelBuilder:
    """Emits ISA instructions into registers with fresh names."""

    def __init__(self, name: str):
        self.name = name
        self.params: list[isa.Param] = []
        self.body: list[Instruction] = []
        self._regs = itertools.count()
        self._consts: dict[tuple[float | int | bool, str], str] = {}

    def reg(self) -> str:
        """A fresh register name."""
        return f"%r{next(self._regs)}"

    def param(self, name: str, kind: str, dtype: str) -> str:
        """Declare a parameter (``kind`` "ptr" or "scalar") and return its name."""
        self.params.append(isa.Param(name, kind, dtype))
        return name

    @overload
    def emit(self, ins: Defining) -> str: ...

    @overload
    def emit(self, ins: isa.Store | isa.StoreReduce | isa.Barrier | isa.Loop) -> None: ...

    def emit(self, ins: Instruction) -> str | None:
        """Append ``ins``; its destination register, if it writes one."""
        self.body.append(ins)
        dst: str | None = getattr(ins, "dst", None)
        return dst

    def scalar(self, name: str, dtype: str = "int64") -> str:
        """Declare the scalar parameter ``name`` and return the register holding its value."""
        self.param(name, "scalar", dtype)
        return self.emit(isa.ScalarArg(self.reg(), name))

    def const(self, value: float | int | bool, dtype: str) -> str:
        """A register holding the constant ``value`` of ``dtype`` (one per distinct pair)."""
        key = (value, dtype)
        if key not in self._consts:
            self._consts[key] = self.emit(isa.Const(self.reg(), value, dtype))
        return self._consts[key]

    def pid(self, axis: int = 0) -> str:
        """The program instance's index along grid ``axis``."""
        return self.emit(isa.ProgramId(self.reg(), axis))

    def arange(self, n: int) -> str:
        """The tile ``[0, n)`` of int64 lane indices."""
        return self.emit(isa.Arange(self.reg(), n))

    def unary(self, fn: str, x: str) -> str:
        """``fn(x)`` elementwise."""
        return self.emit(isa.Unary(self.reg(), fn, x))

    def binary(self, fn: str, a: str, b: str) -> str:
        """``fn(a, b)`` elementwise, broadcasting."""
        return self.emit(isa.Binary(self.reg(), fn, a, b))

    def imul(self, a: str, k: int) -> str:
        """``a * k`` in int64 (``a`` itself when ``k`` is 1)."""
        return a if k == 1 else self.binary("mul", a, self.const(k, "int64"))

    @overload
    def iadd(self, a: str, b: str | None) -> str: ...

    @overload
    def iadd(self, a: str | None, b: str) -> str: ...

    @overload
    def iadd(self, a: str | None, b: str | None) -> str | None: ...

    def iadd(self, a: str | None, b: str | None) -> str | None:
        """``a + b``, where a missing term (None) is zero; None when both are."""
        if a is None:
            return b
        if b is None:
            return a
        return self.binary("add", a, b)

    def program(self, **meta: Any) -> isa.Program:
        """The verified program of the body so far, with launch metadata ``meta``."""
        return isa.verify(isa.Program(self.name, tuple(self.params), tuple(self.body), dict(meta)))


@dataclass
class Operand:
    """A materialised tensor a kernel reads or writes (a buffer parameter)."""

    param: str
    value: Value


def offsets(kb: KernelBuilder, shape: tuple[int, ...], space: tuple[int, ...],
            index: Sequence[str | None]) -> str:
    """Element offsets of an operand of ``shape`` broadcast into ``space``.

    ``index`` holds, per dim of ``space``, the register of that dim's index
    (None: the dim is not indexed, e.g. reduced away)."""
    rank = len(space)
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    st = strides(aligned)
    off: str | None = None
    for d in range(rank):
        i = index[d]
        if aligned[d] == 1 or i is None:
            continue
        off = kb.iadd(off, kb.imul(i, st[d]))
    return off if off is not None else kb.const(0, "int64")
