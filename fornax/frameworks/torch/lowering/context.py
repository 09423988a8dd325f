"""What a lowering works with: :class:`LowerCtx` (the graph being built, torch's
:class:`OutMeta` description of each output, a shared scalar-constant cache) and
:class:`OutMeta` itself."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from fornax.layers.graph import DType, Graph, Value

from .dtypes import as_graph_dtype
from .errors import NotLowerable


@dataclass(frozen=True)
class OutMeta:
    """What torch says one tensor output is (from a meta tensor or FakeTensor)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, t: torch.Tensor) -> "OutMeta":
        return cls(tuple(int(d) for d in t.shape), t.dtype)


class Lifted(float):
    """A float argument of an eager op that the op's graph reads as a 0-d input instead of a
    constant (``slot``: its position among the call's flattened arguments), so one compiled
    plan serves every value of it (an optimizer's step size, a bias correction).  Only
    :meth:`LowerCtx.scalar` makes it an input; anything else a lowering does with it (a
    comparison, arithmetic) sees the plain number, and whatever follows from that shows in
    the graph, which is what a plan is looked up by."""

    slot: int

    def __new__(cls, value: float, slot: int) -> "Lifted":
        obj = super().__new__(cls, value)
        obj.slot = slot
        return obj


class LowerCtx:
    """The graph a lowering adds to, and torch's description of the op's outputs.

    ``outs[i]`` is ``None`` for an output torch returns as ``None`` (a gradient
    masked off by ``output_mask``).  ``consts``: a scalar-constant cache to share
    between the contexts of one graph (each scalar value and dtype made once)."""

    def __init__(self, g: Graph, outs: list[OutMeta | None],
                 consts: dict[tuple[str, str, DType], Value] | None = None):
        self.g = g
        self.outs = list(outs)
        self.where = ""                       # the overload being lowered (for messages)
        self._consts: dict[tuple[str, str, DType], Value] = {} if consts is None else consts
        #: the 0-d inputs :class:`Lifted` scalars became: (slot, dtype) -> Value, in the order made
        self.lifted: dict[tuple[int, DType], Value] = {}

    def op(self, name: str, *vals: Value, **attrs: Any) -> Value:
        return self.g.op(name, *vals, **attrs)

    def scalar(self, value: float | torch.Tensor, dtype: DType | torch.dtype) -> Value:
        """A 0-d constant of ``dtype`` (one per value and dtype in this graph)."""
        dt = as_graph_dtype(dtype)
        if isinstance(value, torch.Tensor):
            value = value.item()
        if type(value) is Lifted and dt.is_float:
            held = self.lifted.get((value.slot, dt))
            if held is None:
                held = self.lifted[(value.slot, dt)] = self.g.input(f"lift{value.slot}_{dt.value}", (), dt)
            return held
        key = (type(value).__name__, repr(value), dt)
        if key not in self._consts:
            if not dt.is_float and isinstance(value, float) and not math.isfinite(value):
                raise NotLowerable(f"{self.where}: {value} is not representable in {dt}")
            self._consts[key] = self.g.constant(np.array(value).astype(dt.numpy), "s")
        return self._consts[key]

    def cast(self, v: Value, dtype: DType | torch.dtype) -> Value:
        dt = as_graph_dtype(dtype)
        return v if v.dtype is dt else self.g.op("cast", v, dtype=dt.value)

    def out(self, i: int = 0) -> DType:
        """The graph dtype of output ``i`` (one torch computes: not ``None``)."""
        meta = self.outs[i]
        assert meta is not None, f"output {i} is masked off"
        return as_graph_dtype(meta.dtype)

    def const(self, array: npt.ArrayLike, name: str = "c") -> Value:
        return self.g.constant(np.asarray(array), name)

    def fail(self, why: str) -> NotLowerable:
        return NotLowerable(f"{self.where}: {why}")

    def for_output(self, i: int) -> "LowerCtx":
        """A context for lowering output ``i`` alone (same graph and constants)."""
        sub = LowerCtx(self.g, [self.outs[i]], self._consts)
        sub.where = self.where
        sub.lifted = self.lifted
        return sub
