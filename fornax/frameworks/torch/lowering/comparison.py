"""Comparison and logic lowerings: ``eq``/``ne``/``lt``/``le``/``gt``/``ge``, ``logical_and``/
``or``/``xor``/``not``, ``bitwise_and``/``or``/``xor``/``not``, ``isnan``, ``isinf``, ``isposinf``,
``isneginf``, ``nan_to_num``; :func:`inf_mask` is shared with other families."""

from __future__ import annotations

import math

import numpy as np
import torch

from fornax.layers.graph import DType, Value
from fornax.frameworks.builders import full as _full

from .operands import binop, operand
from .promotion import promote
from .table import lowering


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    def _cmp(ctx, self, other, _name=_name):
        return binop(ctx, _name, self, other, kind="bool")
    lowering(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar")(_cmp)


def _as_bool(ctx, x):
    return ctx.cast(x, DType.BOOL) if isinstance(x, Value) else ctx.scalar(bool(x), DType.BOOL)


@lowering("aten::logical_and.default")
def logical_and(ctx, self, other):
    return ctx.op("logical_and", _as_bool(ctx, self), _as_bool(ctx, other))


@lowering("aten::logical_or.default")
def logical_or(ctx, self, other):
    return ctx.op("logical_or", _as_bool(ctx, self), _as_bool(ctx, other))


@lowering("aten::logical_xor.default")
def logical_xor(ctx, self, other):
    return ctx.op("ne", _as_bool(ctx, self), _as_bool(ctx, other))


@lowering("aten::logical_not.default")
def logical_not(ctx, self):
    return ctx.op("logical_not", _as_bool(ctx, self))


for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    def _bitwise(ctx, self, other, _name=_name):
        cdt, _ = promote(self, other)
        if cdt.is_float:
            raise ctx.fail(f"{_name} needs integer or bool operands, got {cdt}")
        return ctx.op(_name, operand(ctx, self, cdt), operand(ctx, other, cdt))
    lowering(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar", f"aten::{_name}.Scalar_Tensor")(_bitwise)


@lowering("aten::bitwise_not.default")
def bitwise_not(ctx, self):
    if self.dtype is DType.BOOL:
        return ctx.op("logical_not", self)
    if self.dtype.is_float:
        raise ctx.fail(f"bitwise_not needs an integer or bool operand, got {self.dtype}")
    return ctx.op("sub", ctx.op("neg", self), ctx.scalar(1, self.dtype))     # ~x == -x - 1


@lowering("aten::isnan.default")
def isnan(ctx, self):
    return ctx.op("isnan", self)


def inf_mask(ctx, x, sign=0):
    if not x.dtype.is_float:
        return _full(ctx, x.shape, False, DType.BOOL)
    if sign > 0:
        return ctx.op("eq", x, ctx.scalar(math.inf, x.dtype))
    if sign < 0:
        return ctx.op("eq", x, ctx.scalar(-math.inf, x.dtype))
    return ctx.op("eq", ctx.op("abs", x), ctx.scalar(math.inf, x.dtype))


@lowering("aten::isinf.default")
def isinf(ctx, self):
    return inf_mask(ctx, self)


@lowering("aten::isposinf.default")
def isposinf(ctx, self):
    return inf_mask(ctx, self, 1)


@lowering("aten::isneginf.default")
def isneginf(ctx, self):
    return inf_mask(ctx, self, -1)


@lowering("aten::nan_to_num.default")
def nan_to_num(ctx, self, nan=None, posinf=None, neginf=None):
    x = self
    if not x.dtype.is_float:
        return x
    fi = np.finfo(x.dtype.numpy) if x.dtype is not DType.BFLOAT16 else torch.finfo(torch.bfloat16)
    x = ctx.op("where", ctx.op("isnan", x), ctx.scalar(0.0 if nan is None else nan, x.dtype), x)
    x = ctx.op("where", inf_mask(ctx, x, 1), ctx.scalar(float(fi.max) if posinf is None else posinf, x.dtype), x)
    return ctx.op("where", inf_mask(ctx, x, -1), ctx.scalar(float(fi.min) if neginf is None else neginf,
                                                         x.dtype), x)
