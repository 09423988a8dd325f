"""Elementwise ops: unary math, binary arithmetic and comparisons, ``where``, ``clamp``,
``cast`` and ``iota``.

Binary ops broadcast (numpy's rules) and promote their operands to one dtype
(:func:`fornax.layers.ir.promote_types`; ``div`` and ``atan2`` promote
integers to float32); comparisons and logical ops give bool.  ``iota`` has
no operands: it is the index along ``axis`` at every position of a tensor
of ``shape``.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..errors import GraphError
from ..ir import DType, TensorType
from .registry import (Array, Attrs, OpDef, ReferenceFn, broadcast_shape, float_only, norm_axis,
                       register, same_dtype)


def _unary(name: str, ref: ReferenceFn, floats: bool = True, out_bool: bool = False,
           no_bool: bool = False, infer_attrs: Callable[[Attrs], None] | None = None,
           attrs: tuple[str, ...] = ()) -> None:
    def infer(types: list[TensorType], attrs: Attrs) -> TensorType:
        if floats:
            float_only(name, types[0].dtype)
        if no_bool and types[0].dtype is DType.BOOL:
            raise GraphError(f"{name}: needs a numeric operand, got bool", op=name)
        if infer_attrs is not None:
            infer_attrs(attrs)
        return TensorType(types[0].shape, DType.BOOL) if out_bool else types[0]
    register(OpDef(name, "elementwise", 1, infer, ref, attrs=attrs))


def _binary(name: str, ref: ReferenceFn, out_bool: bool = False, to_float: bool = False,
            no_bool: bool = False, ints_only: bool = False) -> None:
    def infer(types: list[TensorType], attrs: Attrs) -> TensorType:
        dt = same_dtype(name, types)
        if no_bool and dt is DType.BOOL:
            raise GraphError(f"{name}: needs numeric operands, got bool", op=name)
        if ints_only and dt.is_float:
            raise GraphError(f"{name}: needs integer or bool operands, got {dt}", op=name)
        if to_float:
            float_only(name, dt)
        return TensorType(broadcast_shape(name, types), DType.BOOL if out_bool else dt)
    register(OpDef(name, "elementwise", 2, infer, ref, promote=(0, 1), promote_to_float=to_float))


def erf(x: Array) -> Array:
    """The error function, elementwise (scipy's, imported when first used)."""
    from scipy.special import erf as scipy_erf
    out: Array = scipy_erf(x)
    return out


def _gelu_ref(x: Array, approximate: str = "none") -> Array:
    out: Array
    if approximate == "tanh":
        out = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    else:
        out = 0.5 * x * (1 + erf(x / math.sqrt(2)))
    return out


def _check_gelu(attrs: Attrs) -> None:
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        raise GraphError(f"gelu: approximate must be 'none' or 'tanh', got {attrs['approximate']!r}",
                         op="gelu")


_unary("neg", np.negative, floats=False)
_unary("abs", np.abs, floats=False)
_unary("exp", np.exp)
_unary("log", np.log)
_unary("tanh", np.tanh)
_unary("sqrt", np.sqrt)
_unary("rsqrt", lambda x: 1 / np.sqrt(x))
_unary("relu", lambda x: np.maximum(x, 0))
_unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)))
_unary("erf", erf)
_unary("sin", np.sin)
_unary("cos", np.cos)
_unary("reciprocal", lambda x: 1 / x)
_unary("floor", np.floor, floats=False, no_bool=True)
_unary("ceil", np.ceil, floats=False, no_bool=True)
_unary("round", np.round, floats=False, no_bool=True)       # half to even, as torch.round
_unary("sign", np.sign, floats=False, no_bool=True)
_unary("logical_not", np.logical_not, floats=False, out_bool=True)
_unary("isnan", np.isnan, floats=False, out_bool=True)
_unary("gelu", _gelu_ref, infer_attrs=_check_gelu, attrs=("approximate",))
_unary("silu", lambda x: x / (1 + np.exp(-x)))
_binary("add", np.add)
_binary("sub", np.subtract, no_bool=True)
_binary("mul", np.multiply)
_binary("div", np.true_divide, to_float=True)
_binary("maximum", np.maximum)
_binary("minimum", np.minimum)
_binary("pow", np.power, no_bool=True)
_binary("atan2", np.arctan2, to_float=True)
_binary("floor_divide", np.floor_divide, no_bool=True)
_binary("remainder", np.mod, no_bool=True)                  # sign of the divisor, as torch.remainder
_binary("lt", np.less, out_bool=True)
_binary("le", np.less_equal, out_bool=True)
_binary("gt", np.greater, out_bool=True)
_binary("ge", np.greater_equal, out_bool=True)
_binary("eq", np.equal, out_bool=True)
_binary("ne", np.not_equal, out_bool=True)
_binary("logical_and", np.logical_and, out_bool=True)
_binary("logical_or", np.logical_or, out_bool=True)
_binary("bitwise_and", np.bitwise_and, ints_only=True)
_binary("bitwise_or", np.bitwise_or, ints_only=True)
_binary("bitwise_xor", np.bitwise_xor, ints_only=True)


def _infer_where(types: list[TensorType], attrs: Attrs) -> TensorType:
    cond, a, b = types
    if cond.dtype is not DType.BOOL:
        raise GraphError(f"where: condition must be bool, got {cond.dtype}", op="where")
    return TensorType(broadcast_shape("where", types), same_dtype("where", [a, b]))


def _where_ref(c: Array, a: Array, b: Array) -> Array:
    return np.where(c, a, b)


register(OpDef("where", "elementwise", 3, _infer_where, _where_ref, promote=(1, 2)))


def _infer_clamp(types: list[TensorType], attrs: Attrs) -> TensorType:
    dt = same_dtype("clamp", types)
    if dt is DType.BOOL:
        raise GraphError("clamp: needs numeric operands, got bool", op="clamp")
    shape = broadcast_shape("clamp", types)
    if shape != types[0].shape:
        raise GraphError(f"clamp: bounds {types[1].shape} and {types[2].shape} must broadcast to "
                         f"the operand's shape {types[0].shape}", op="clamp")
    return TensorType(shape, dt)


# clamp(x, lo, hi) = min(max(x, lo), hi), as torch.clamp
register(OpDef("clamp", "elementwise", 3, _infer_clamp,
               lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), promote="all"))


def _infer_cast(types: list[TensorType], attrs: Attrs) -> TensorType:
    return TensorType(types[0].shape, DType.of(attrs["dtype"]))


register(OpDef("cast", "elementwise", 1, _infer_cast,
               lambda x, dtype: x.astype(np.float64 if DType.of(dtype).is_float else DType.of(dtype).numpy),
               attrs=("dtype",)))


def _infer_iota(types: list[TensorType], attrs: Attrs) -> TensorType:
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not shape or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise GraphError(f"iota: shape must be a non-empty tuple of positive ints, got {shape!r}",
                         op="iota")
    axis = norm_axis("iota", attrs.get("axis", 0), len(shape))
    dtype = DType.of(attrs.get("dtype", "int64"))
    if dtype is DType.BOOL:
        raise GraphError("iota: dtype must be numeric, got bool", op="iota")
    if dtype in (DType.FLOAT16, DType.BFLOAT16) and shape[axis] > 256:
        raise GraphError(f"iota: {dtype} cannot count to {shape[axis]} exactly (at most 256)", op="iota")
    return TensorType(tuple(shape), dtype)


def _iota_ref(shape: tuple[int, ...], axis: int = 0, dtype: str = "int64") -> Array:
    shape = tuple(shape)
    ax = axis % len(shape)
    r = np.arange(shape[ax]).reshape([-1 if d == ax else 1 for d in range(len(shape))])
    dt = DType.of(dtype)
    return np.broadcast_to(r, shape).astype(np.float64 if dt.is_float else dt.numpy)


# the index along ``axis`` at every position of a tensor of ``shape`` (no operands)
register(OpDef("iota", "elementwise", 0, _infer_iota, _iota_ref, attrs=("shape", "axis", "dtype")))
