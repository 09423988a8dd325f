"""Activation lowerings and their backward ops: ``relu``, ``gelu`` (both approximations),
``silu``, ``hardtanh``, ``leaky_relu``, ``elu``, ``celu``, ``selu``, ``softplus``, ``mish``,
``hardsigmoid``, ``hardswish``, ``glu``, ``_prelu_kernel``, ``threshold``; and
``threshold_backward``, ``sigmoid_backward``, ``tanh_backward``, ``silu_backward``,
``gelu_backward``, ``hardtanh_backward``, ``leaky_relu_backward``, ``elu_backward``,
``softplus_backward``, ``hardsigmoid_backward``, ``hardswish_backward``,
``_prelu_kernel_backward``, ``glu_backward``, ``mish_backward``."""

from __future__ import annotations

import functools
import math

from fornax.layers.graph import DType
from fornax.frameworks.builders import expm1 as _expm1, log1p as _log1p

from .arithmetic import clamp
from .axes import ndim, wrap_dim
from .operands import binop, operand
from .promotion import compute_dtype, float_in
from .shape import split_parts
from .table import lowering


# ---- activations ---------------------------------------------------------------------------------
@lowering("aten::relu.default")
def relu(ctx, self):
    if self.dtype.is_float:
        return ctx.op("relu", self)
    if self.dtype is DType.BOOL:
        raise ctx.fail("relu of a bool tensor is not supported (torch refuses it too)")
    return ctx.op("maximum", self, ctx.scalar(0, self.dtype))


@lowering("aten::gelu.default")
def gelu(ctx, self, approximate="none"):
    return ctx.op("gelu", float_in(ctx, self), approximate=approximate)


@lowering("aten::silu.default")
def silu(ctx, self):
    return ctx.op("silu", float_in(ctx, self))


@lowering("aten::hardtanh.default")
def hardtanh(ctx, self, min_val=-1, max_val=1):
    return clamp(ctx, self, min_val, max_val)


@lowering("aten::leaky_relu.default")
def leaky_relu(ctx, self, negative_slope=0.01):
    x = float_in(ctx, self)
    return ctx.op("where", ctx.op("gt", x, ctx.scalar(0, x.dtype)), x,
                  ctx.op("mul", x, ctx.scalar(negative_slope, x.dtype)))


@lowering("aten::elu.default")
def elu(ctx, self, alpha=1, scale=1, input_scale=1):
    x = float_in(ctx, self)
    dt = x.dtype
    neg = ctx.op("mul", _expm1(ctx, ctx.op("mul", x, ctx.scalar(input_scale, dt))),
                 ctx.scalar(alpha * scale, dt))
    return ctx.op("where", ctx.op("gt", x, ctx.scalar(0, dt)), ctx.op("mul", x, ctx.scalar(scale, dt)), neg)


def _softplus(ctx, x, beta, threshold):
    dt = x.dtype
    bx = ctx.op("mul", x, ctx.scalar(beta, dt))
    soft = ctx.op("div", _log1p(ctx, ctx.op("exp", bx)), ctx.scalar(beta, dt))
    return ctx.op("where", ctx.op("gt", bx, ctx.scalar(threshold, dt)), x, soft)


@lowering("aten::softplus.default")
def softplus(ctx, self, beta=1, threshold=20):
    return _softplus(ctx, float_in(ctx, self), beta, threshold)


@lowering("aten::mish.default")
def mish(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("mul", x, ctx.op("tanh", _softplus(ctx, x, 1, 20)))


def _relu6ish(ctx, x):
    """min(max(x + 3, 0), 6) / 6"""
    dt = x.dtype
    c = ctx.op("clamp", ctx.op("add", x, ctx.scalar(3, dt)), ctx.scalar(0, dt), ctx.scalar(6, dt))
    return ctx.op("div", c, ctx.scalar(6, dt))


@lowering("aten::hardsigmoid.default")
def hardsigmoid(ctx, self):
    return _relu6ish(ctx, float_in(ctx, self))


@lowering("aten::hardswish.default")
def hardswish(ctx, self):
    x = float_in(ctx, self)
    return ctx.op("mul", x, _relu6ish(ctx, x))


@lowering("aten::glu.default")
def glu(ctx, self, dim=-1):
    x = float_in(ctx, self)
    d = wrap_dim(dim, ndim(x))
    a, b = split_parts(ctx, x, [x.shape[d] // 2] * 2, d)
    return ctx.op("mul", a, ctx.op("sigmoid", b))


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@lowering("aten::celu.default")
def celu(ctx, self, alpha=1.0):
    return elu(ctx, self, alpha, 1, 1.0 / alpha)


@lowering("aten::selu.default")
def selu(ctx, self):
    return elu(ctx, self, _SELU_ALPHA, _SELU_SCALE, 1)


@lowering("aten::_prelu_kernel.default")
def _prelu_kernel(ctx, self, weight):
    dt = compute_dtype(ctx)
    x = ctx.cast(self, dt)
    return ctx.op("where", ctx.op("gt", x, ctx.scalar(0, dt)), x, ctx.op("mul", ctx.cast(weight, dt), x))


# ---- activation backward -------------------------------------------------------------------------
@lowering("aten::threshold_backward.default")
def threshold_backward(ctx, grad_output, self, threshold):
    dt = compute_dtype(ctx)
    g = ctx.cast(grad_output, dt)
    return ctx.op("where", binop(ctx, "le", self, threshold, kind="bool"), ctx.scalar(0, dt), g)


@lowering("aten::threshold.default")
def threshold(ctx, self, threshold, value):
    dt = ctx.out()
    return ctx.op("where", binop(ctx, "le", self, threshold, kind="bool"), operand(ctx, value, dt),
                  ctx.cast(self, dt))


@lowering("aten::sigmoid_backward.default")
def sigmoid_backward(ctx, grad_output, output):
    dt = compute_dtype(ctx)
    y = ctx.cast(output, dt)
    return ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("mul", ctx.op("sub", ctx.scalar(1, dt), y), y))


@lowering("aten::tanh_backward.default")
def tanh_backward(ctx, grad_output, output):
    dt = compute_dtype(ctx)
    y = ctx.cast(output, dt)
    return ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("sub", ctx.scalar(1, dt), ctx.op("mul", y, y)))


@lowering("aten::silu_backward.default")
def silu_backward(ctx, grad_output, self):
    dt = compute_dtype(ctx)
    x = ctx.cast(self, dt)
    s = ctx.op("sigmoid", x)
    inner = ctx.op("add", ctx.scalar(1, dt), ctx.op("mul", x, ctx.op("sub", ctx.scalar(1, dt), s)))
    return ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("mul", s, inner))


@lowering("aten::gelu_backward.default")
def gelu_backward(ctx, grad_output, self, approximate="none"):
    dt = compute_dtype(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    s = functools.partial(ctx.scalar, dtype=dt)
    if approximate == "tanh":
        beta, kappa = math.sqrt(2.0 / math.pi), 0.044715
        x2 = ctx.op("mul", x, x)
        inner = ctx.op("mul", s(beta), ctx.op("add", x, ctx.op("mul", s(kappa), ctx.op("mul", x2, x))))
        t = ctx.op("tanh", inner)
        left = ctx.op("mul", s(0.5), x)
        left_d = ctx.op("mul", s(0.5), ctx.op("add", s(1), t))
        right_d = ctx.op("mul", ctx.op("mul", left, ctx.op("sub", s(1), ctx.op("mul", t, t))),
                         ctx.op("mul", s(beta), ctx.op("add", s(1), ctx.op("mul", s(3 * kappa), x2))))
        return ctx.op("mul", g, ctx.op("add", left_d, right_d))
    if approximate != "none":
        raise ctx.fail(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    cdf = ctx.op("mul", s(0.5), ctx.op("add", s(1), ctx.op("erf", ctx.op("mul", x, s(math.sqrt(0.5))))))
    pdf = ctx.op("mul", ctx.op("exp", ctx.op("mul", ctx.op("mul", x, x), s(-0.5))),
                 s(1 / math.sqrt(2 * math.pi)))
    return ctx.op("mul", g, ctx.op("add", cdf, ctx.op("mul", x, pdf)))


@lowering("aten::hardtanh_backward.default")
def hardtanh_backward(ctx, grad_output, self, min_val, max_val):
    dt = compute_dtype(ctx)
    x = ctx.cast(self, dt)
    out = ctx.op("logical_or", ctx.op("le", x, ctx.scalar(min_val, dt)), ctx.op("ge", x, ctx.scalar(max_val, dt)))
    return ctx.op("where", out, ctx.scalar(0, dt), ctx.cast(grad_output, dt))


@lowering("aten::leaky_relu_backward.default")
def leaky_relu_backward(ctx, grad_output, self, negative_slope, self_is_result):
    dt = compute_dtype(ctx)
    g = ctx.cast(grad_output, dt)
    return ctx.op("where", ctx.op("gt", ctx.cast(self, dt), ctx.scalar(0, dt)), g,
                  ctx.op("mul", g, ctx.scalar(negative_slope, dt)))


@lowering("aten::elu_backward.default")
def elu_backward(ctx, grad_output, alpha, scale, input_scale, is_result, self_or_result):
    dt = compute_dtype(ctx)
    g, y = ctx.cast(grad_output, dt), ctx.cast(self_or_result, dt)
    s = functools.partial(ctx.scalar, dtype=dt)
    if is_result:       # y = alpha*scale*(exp(x*is)-1) on the negative side: dy/dx = is*(y + alpha*scale)
        neg = ctx.op("mul", ctx.op("mul", g, s(input_scale)), ctx.op("add", y, s(alpha * scale)))
        cond = ctx.op("le", y, s(0))
    else:
        neg = ctx.op("mul", ctx.op("mul", g, s(input_scale * alpha * scale)),
                     ctx.op("exp", ctx.op("mul", y, s(input_scale))))
        cond = ctx.op("le", y, s(0))
    return ctx.op("where", cond, neg, ctx.op("mul", g, s(scale)))


@lowering("aten::softplus_backward.default")
def softplus_backward(ctx, grad_output, self, beta, threshold):
    dt = compute_dtype(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    bx = ctx.op("mul", x, ctx.scalar(beta, dt))
    z = ctx.op("exp", bx)
    soft = ctx.op("mul", g, ctx.op("div", z, ctx.op("add", z, ctx.scalar(1, dt))))
    return ctx.op("where", ctx.op("gt", bx, ctx.scalar(threshold, dt)), g, soft)


@lowering("aten::hardsigmoid_backward.default")
def hardsigmoid_backward(ctx, grad_output, self):
    dt = compute_dtype(ctx)
    x = ctx.cast(self, dt)
    inside = ctx.op("logical_and", ctx.op("gt", x, ctx.scalar(-3, dt)), ctx.op("lt", x, ctx.scalar(3, dt)))
    return ctx.op("where", inside, ctx.op("div", ctx.cast(grad_output, dt), ctx.scalar(6, dt)), ctx.scalar(0, dt))


@lowering("aten::hardswish_backward.default")
def hardswish_backward(ctx, grad_output, self):
    dt = compute_dtype(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    mid = ctx.op("mul", g, ctx.op("add", ctx.op("div", x, ctx.scalar(3, dt)), ctx.scalar(0.5, dt)))
    r = ctx.op("where", ctx.op("lt", x, ctx.scalar(3, dt)), mid, g)
    return ctx.op("where", ctx.op("le", x, ctx.scalar(-3, dt)), ctx.scalar(0, dt), r)


@lowering("aten::_prelu_kernel_backward.default")
def _prelu_kernel_backward(ctx, grad_output, self, weight):
    dt = compute_dtype(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    pos_ = ctx.op("gt", x, ctx.scalar(0, dt))
    gi = ctx.op("where", pos_, g, ctx.op("mul", ctx.cast(weight, dt), g))
    gw = ctx.op("where", pos_, ctx.scalar(0, dt), ctx.op("mul", x, g))
    return gi, gw


@lowering("aten::glu_backward.default")
def glu_backward(ctx, grad_output, self, dim):
    dt = compute_dtype(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    d = wrap_dim(dim, ndim(x))
    a, b = split_parts(ctx, x, [x.shape[d] // 2] * 2, d)
    s = ctx.op("sigmoid", b)
    ga = ctx.op("mul", g, s)
    gb = ctx.op("mul", ctx.op("mul", ga, a), ctx.op("sub", ctx.scalar(1, dt), s))
    return ctx.op("concat", ga, gb, axis=d)


@lowering("aten::mish_backward.default")
def mish_backward(ctx, grad_output, self):
    dt = compute_dtype(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    t = ctx.op("tanh", _softplus(ctx, x, 1, 20))
    s = ctx.op("sigmoid", x)
    d = ctx.op("mul", ctx.op("mul", x, s), ctx.op("sub", ctx.scalar(1, dt), ctx.op("mul", t, t)))
    return ctx.op("mul", g, ctx.op("add", t, d))
