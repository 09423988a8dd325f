"""The graph IR's element types: dtypes, tensor types, SSA values and nodes.

:class:`DType` names the element types fornax graphs use (with their numpy
dtypes and PyTorch's promotion rules, :func:`promote_types`);
:class:`TensorType` is a shape and a dtype; a :class:`Value` is defined once
(by a graph input, a constant, or one :class:`Node`'s output).  The graph
that holds them is :class:`fornax.layers.graph.Graph`; the ops a node may
name are the registry's (:mod:`fornax.layers.ops`).  Both build on this
module, which imports neither.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from numpy.typing import NDArray

from .errors import GraphError


class DType(str, enum.Enum):
    """An element type of a graph tensor."""

    FLOAT64 = "float64"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype[Any]:
        dt: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16) if self is DType.BFLOAT16 else np.dtype(self.value)
        return dt

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT64, DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @classmethod
    def of(cls, dtype: object) -> DType:
        """The DType of a numpy dtype / array / name."""
        if isinstance(dtype, DType):
            return dtype
        if isinstance(dtype, str):
            try:
                return cls(dtype)
            except ValueError:
                raise GraphError(f"unknown dtype {dtype!r}; fornax graphs use "
                                 f"{', '.join(d.value for d in cls)}") from None
        # a scalar type (np.float16) has a class-level ``dtype`` descriptor: use it directly
        # anything numpy reads as a dtype: a dtype, a name, or an object with a ``dtype``
        spec: Any = dtype if isinstance(dtype, type) else getattr(dtype, "dtype", dtype)
        dt = np.dtype(spec)
        for d in cls:
            if d.numpy == dt:
                return d
        raise GraphError(f"dtype {dt} is not a fornax graph dtype")

    def __str__(self) -> str:
        return self.value


_PROMOTION_KIND = {DType.BOOL: 0, DType.INT32: 1, DType.INT64: 1, DType.FLOAT16: 2,
                   DType.BFLOAT16: 2, DType.FLOAT32: 2, DType.FLOAT64: 2}


def promote_types(*dtypes: DType) -> DType:
    """The common dtype of operands, by PyTorch's rules for tensors of any rank.

    bool < integers < floats; two of one kind give the wider; an integer with a
    float gives the float; float16 with bfloat16 gives float32."""
    out = DType.of(dtypes[0])
    for d in dtypes[1:]:
        d = DType.of(d)
        if d is out:
            continue
        ka, kb = _PROMOTION_KIND[out], _PROMOTION_KIND[d]
        if ka != kb:
            out = out if ka > kb else d
        elif {out, d} == {DType.FLOAT16, DType.BFLOAT16}:
            out = DType.FLOAT32
        else:
            out = out if out.itemsize >= d.itemsize else d
    return out


@dataclass(frozen=True)
class TensorType:
    """The static type of a value: its shape and element type."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


_value_ids = itertools.count()


def _next_value_id() -> int:
    return next(_value_ids)


@dataclass(eq=False)
class Value:
    """An SSA value: a graph input, a constant (``const`` holds its array) or a node's output."""

    type: TensorType
    name: str
    producer: Node | None = None
    const: NDArray[Any] | None = field(default=None, repr=False)
    id: int = field(default_factory=_next_value_id)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}:{self.type}"


@dataclass(eq=False)
class Node:
    """One op application: the op's name, its operands, its outputs and its attributes."""

    op: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        ins = ", ".join(f"%{v.name}" for v in self.inputs)
        attrs = "".join(f" {k}={v}" for k, v in sorted(self.attrs.items()))
        return f"{outs} = {self.op}({ins}){attrs} : {', '.join(str(v.type) for v in self.outputs)}"


def to_f64(a: NDArray[Any]) -> NDArray[Any]:
    """Floating-point arrays (bfloat16 included) as float64; others unchanged (the reference's
    working precision)."""
    if a.dtype.kind == "f" or a.dtype == np.dtype(ml_dtypes.bfloat16):
        return a.astype(np.float64)
    return a
