"""The ops of the MAX-style graph API (``max.graph.ops``'s names where MAX has them), each
recording one fornax graph-IR op in the graph being built."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...layers.errors import GraphError
from .graph import CustomOp, DType, TensorValue, current


def constant(value: object, dtype: DType | None = None) -> TensorValue:
    """A constant tensor (weights): the array is copied into the graph."""
    arr = np.asarray(value)
    if dtype is not None:
        arr = arr.astype(DType.of(dtype).ir.numpy)
    elif arr.dtype == np.float64:
        arr = arr.astype(np.float32)         # Python floats: the graph's default float type
    return current()._constant(arr)


def _unary(name: str, x: TensorValue, **attrs: object) -> TensorValue:
    return x.graph._op(name, [x], **attrs)


def add(a: TensorValue, b: TensorValue) -> TensorValue:
    return a + b


def sub(a: TensorValue, b: TensorValue) -> TensorValue:
    return a - b


def mul(a: TensorValue, b: TensorValue) -> TensorValue:
    return a * b


def div(a: TensorValue, b: TensorValue) -> TensorValue:
    return a / b


def matmul(a: TensorValue, b: TensorValue) -> TensorValue:
    return a @ b


def relu(x: TensorValue) -> TensorValue:
    return _unary("relu", x)


def gelu(x: TensorValue, approximate: str = "none") -> TensorValue:
    return _unary("gelu", x, approximate=approximate)


def silu(x: TensorValue) -> TensorValue:
    return _unary("silu", x)


def sigmoid(x: TensorValue) -> TensorValue:
    return _unary("sigmoid", x)


def tanh(x: TensorValue) -> TensorValue:
    return _unary("tanh", x)


def exp(x: TensorValue) -> TensorValue:
    return _unary("exp", x)


def sqrt(x: TensorValue) -> TensorValue:
    return _unary("sqrt", x)


def rsqrt(x: TensorValue) -> TensorValue:
    return _unary("rsqrt", x)


def softmax(x: TensorValue, axis: int = -1) -> TensorValue:
    return _unary("softmax", x, axis=axis)


def mean(x: TensorValue, axis: int = -1) -> TensorValue:
    """The mean over ``axis``, keeping it (size 1), as MAX's reductions do."""
    return _unary("reduce_mean", x, axis=axis, keepdims=True)


def sum(x: TensorValue, axis: int = -1) -> TensorValue:    # noqa: A001  (MAX's name)
    return _unary("reduce_sum", x, axis=axis, keepdims=True)


def reshape(x: TensorValue, shape: Sequence[int]) -> TensorValue:
    """``x`` with a new shape of the same size (one -1 is inferred)."""
    return x.reshape(tuple(shape))


def transpose(x: TensorValue, dim_1: int, dim_2: int) -> TensorValue:
    """``x`` with two dimensions swapped (MAX's ``ops.transpose(x, dim_1, dim_2)``)."""
    perm = list(range(x.type.rank))
    a, b = dim_1 % x.type.rank, dim_2 % x.type.rank
    perm[a], perm[b] = perm[b], perm[a]
    return _unary("transpose", x, perm=tuple(perm))


def permute(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    return _unary("transpose", x, perm=tuple(int(d) for d in dims))


def layer_norm(x: TensorValue, gamma: TensorValue, beta: TensorValue, epsilon: float = 1e-5) -> TensorValue:
    """LayerNorm over the last axis (biased variance, eps inside the square root)."""
    return x.graph._op("layer_norm", [x, gamma, beta], eps=float(epsilon))


def custom(op: CustomOp, values: Sequence[TensorValue]) -> list[TensorValue]:
    """Apply ``op`` (its kernel written by the user) to ``values``; its outputs."""
    if not values:
        raise GraphError(f"custom op {op.name!r} needs at least one input value", seam="framework")
    return values[0].graph._custom(op, list(values))
