"""Loss lowerings: ``nll_loss_forward``/``nll_loss2d_forward`` (and backward), ``mse_loss``,
``binary_cross_entropy``, ``huber_loss``, ``smooth_l1_loss`` (each with its backward),
``binary_cross_entropy_with_logits`` and ``l1_loss``."""

from __future__ import annotations

import functools
import math

from fornax.layers.graph import DType
from fornax.frameworks.builders import full as _full, log1p as _log1p, reshape as _reshape

from .axes import ndim, sum_dims
from .indexing import index_operand
from .operands import div_in
from .promotion import compute_dtype, opmath
from .shape import unsqueeze
from .table import lowering


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_parts(ctx, self, target, weight, ignore_index):
    """(x with a batch dim, class axis, target, per-element weight (0 where ignored), valid mask)."""
    dt = opmath(self.dtype)
    x = ctx.cast(self, dt)
    t = index_operand(ctx, target)
    if ndim(x) == 1:
        x, t = _reshape(ctx, x, (1,) + tuple(x.shape)), _reshape(ctx, t, (1,))
    valid = ctx.op("ne", t, ctx.scalar(ignore_index, DType.INT64))
    if weight is not None:
        w = ctx.op("index_select", ctx.cast(weight, dt), _reshape(ctx, t, (math.prod(t.shape),)), axis=0)
        w = _reshape(ctx, w, t.shape)
    else:
        w = _full(ctx, t.shape, 1, dt)
    w = ctx.op("where", valid, w, ctx.scalar(0, dt))
    return x, t, w, valid


@lowering("aten::nll_loss_forward.default", "aten::nll_loss2d_forward.default")
def nll_loss_forward(ctx, self, target, weight, reduction, ignore_index):
    x, t, w, valid = _nll_parts(ctx, self, target, weight, ignore_index)
    dt = x.dtype
    picked = ctx.op("gather", x, unsqueeze(ctx, t, 1), axis=1)
    picked = _reshape(ctx, picked, t.shape)
    loss = ctx.op("where", valid, ctx.op("neg", ctx.op("mul", picked, w)), ctx.scalar(0, dt))
    red = _REDUCTIONS[reduction]
    if red == "none":
        return _reshape(ctx, loss, ctx.outs[0].shape), _full(ctx, (), 0, dt)
    all_dims = list(range(ndim(t)))
    total = sum_dims(ctx, w, all_dims, False)
    s = sum_dims(ctx, loss, all_dims, False)
    return (ctx.op("div", s, total) if red == "mean" else s), total


@lowering("aten::nll_loss_backward.default", "aten::nll_loss2d_backward.default")
def nll_loss_backward(ctx, grad_output, self, target, weight, reduction, ignore_index, total_weight):
    x, t, w, valid = _nll_parts(ctx, self, target, weight, ignore_index)
    dt = x.dtype
    coef = ctx.op("neg", w)
    red = _REDUCTIONS[reduction]
    if red == "mean":
        coef = ctx.op("div", coef, ctx.cast(total_weight, dt))
    g = ctx.cast(grad_output, dt)
    coef = ctx.op("mul", coef, _reshape(ctx, g, t.shape) if red == "none" else g)
    onehot = ctx.op("eq", ctx.op("iota", shape=tuple(x.shape), axis=1, dtype="int64"), unsqueeze(ctx, t, 1))
    # ignored targets get no gradient at all (not 0 / total_weight: NaN when every target is ignored)
    onehot = ctx.op("logical_and", onehot, unsqueeze(ctx, valid, 1))
    gi = ctx.op("where", onehot, unsqueeze(ctx, coef, 1), ctx.scalar(0, dt))
    return _reshape(ctx, gi, self.shape)


def _reduce_loss(ctx, loss, reduction):
    red = _REDUCTIONS[reduction]
    if red == "none":
        return loss
    s = sum_dims(ctx, loss, list(range(ndim(loss))), False)
    return div_in(ctx, s, math.prod(loss.shape), loss.dtype) if red == "mean" else s


@lowering("aten::mse_loss.default")
def mse_loss(ctx, self, target, reduction=1):
    dt = compute_dtype(ctx)
    d = ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))
    return _reduce_loss(ctx, ctx.op("mul", d, d), reduction)


@lowering("aten::mse_loss_backward.default")
def mse_loss_backward(ctx, grad_output, self, target, reduction):
    dt = compute_dtype(ctx)
    d = ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))
    norm = 2.0 / math.prod(self.shape) if _REDUCTIONS[reduction] == "mean" else 2.0
    return ctx.op("mul", ctx.op("mul", ctx.scalar(norm, dt), d), ctx.cast(grad_output, dt))


@lowering("aten::binary_cross_entropy.default")
def binary_cross_entropy(ctx, self, target, weight=None, reduction=1):
    dt = compute_dtype(ctx)
    x, y = ctx.cast(self, dt), ctx.cast(target, dt)
    s = functools.partial(ctx.scalar, dtype=dt)
    log_x = ctx.op("maximum", ctx.op("log", x), s(-100))
    log_1mx = ctx.op("maximum", ctx.op("log", ctx.op("sub", s(1), x)), s(-100))
    loss = ctx.op("neg", ctx.op("add", ctx.op("mul", y, log_x), ctx.op("mul", ctx.op("sub", s(1), y), log_1mx)))
    if weight is not None:
        loss = ctx.op("mul", loss, ctx.cast(weight, dt))
    return _reduce_loss(ctx, loss, reduction)


@lowering("aten::binary_cross_entropy_backward.default")
def binary_cross_entropy_backward(ctx, grad_output, self, target, weight=None, reduction=1):
    dt = compute_dtype(ctx)
    x, y = ctx.cast(self, dt), ctx.cast(target, dt)
    s = functools.partial(ctx.scalar, dtype=dt)
    denom = ctx.op("maximum", ctx.op("mul", ctx.op("sub", s(1), x), x), s(1e-12))
    gi = ctx.op("div", ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("sub", x, y)), denom)
    if weight is not None:
        gi = ctx.op("mul", gi, ctx.cast(weight, dt))
    if _REDUCTIONS[reduction] == "mean":
        gi = ctx.op("div", gi, s(math.prod(self.shape)))
    return gi


@lowering("aten::binary_cross_entropy_with_logits.default")
def binary_cross_entropy_with_logits(ctx, self, target, weight=None, pos_weight=None, reduction=1):
    """(1 - y) x + w_pos (log1p(exp(-|x|)) + max(-x, 0)), w_pos = (pos_weight - 1) y + 1."""
    dt = compute_dtype(ctx)
    x, y = ctx.cast(self, dt), ctx.cast(target, dt)
    one = ctx.scalar(1, dt)
    sp = ctx.op("add", _log1p(ctx, ctx.op("exp", ctx.op("neg", ctx.op("abs", x)))),
                ctx.op("maximum", ctx.op("neg", x), ctx.scalar(0, dt)))
    if pos_weight is not None:
        lw = ctx.op("add", ctx.op("mul", ctx.op("sub", ctx.cast(pos_weight, dt), one), y), one)
        sp = ctx.op("mul", lw, sp)
    loss = ctx.op("add", ctx.op("mul", ctx.op("sub", one, y), x), sp)
    if weight is not None:
        loss = ctx.op("mul", loss, ctx.cast(weight, dt))
    return _reduce_loss(ctx, loss, reduction)


def _loss_norm(self, reduction):
    return 1.0 / math.prod(self.shape) if _REDUCTIONS[reduction] == "mean" else 1.0


@lowering("aten::huber_loss.default")
def huber_loss(ctx, self, target, reduction=1, delta=1.0):
    dt = compute_dtype(ctx)
    d = ctx.op("abs", ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt)))
    s = functools.partial(ctx.scalar, dtype=dt)
    quad = ctx.op("mul", ctx.op("mul", d, d), s(0.5))
    lin = ctx.op("mul", ctx.op("sub", d, s(0.5 * delta)), s(delta))
    return _reduce_loss(ctx, ctx.op("where", ctx.op("lt", d, s(delta)), quad, lin), reduction)


@lowering("aten::huber_loss_backward.default")
def huber_loss_backward(ctx, grad_output, self, target, reduction, delta):
    dt = compute_dtype(ctx)
    x = ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))
    c = ctx.op("clamp", x, ctx.scalar(-delta, dt), ctx.scalar(delta, dt))
    return ctx.op("mul", ctx.op("mul", c, ctx.scalar(_loss_norm(self, reduction), dt)), ctx.cast(grad_output, dt))


@lowering("aten::smooth_l1_loss.default")
def smooth_l1_loss(ctx, self, target, reduction=1, beta=1.0):
    dt = compute_dtype(ctx)
    d = ctx.op("abs", ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt)))
    if beta == 0:
        return _reduce_loss(ctx, d, reduction)
    s = functools.partial(ctx.scalar, dtype=dt)
    quad = ctx.op("div", ctx.op("mul", ctx.op("mul", d, d), s(0.5)), s(beta))
    return _reduce_loss(ctx, ctx.op("where", ctx.op("lt", d, s(beta)), quad, ctx.op("sub", d, s(0.5 * beta))),
                        reduction)


@lowering("aten::smooth_l1_loss_backward.default")
def smooth_l1_loss_backward(ctx, grad_output, self, target, reduction, beta):
    dt = compute_dtype(ctx)
    x = ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))
    s = functools.partial(ctx.scalar, dtype=dt)
    if beta == 0:
        d = ctx.op("sign", x)
    else:
        d = ctx.op("where", ctx.op("le", x, s(-beta)), s(-1),
                   ctx.op("where", ctx.op("ge", x, s(beta)), s(1), ctx.op("div", x, s(beta))))
    return ctx.op("mul", ctx.op("mul", d, s(_loss_norm(self, reduction))), ctx.cast(grad_output, dt))


@lowering("aten::l1_loss.default")
def l1_loss(ctx, self, target, reduction=1):
    dt = compute_dtype(ctx)
    return _reduce_loss(ctx, ctx.op("abs", ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))), reduction)
