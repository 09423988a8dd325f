"""``_foreach_*`` lowerings (the optimizers' list ops): one lowering per list element, the
element op's own lowering from the table, for the unary ops (``_foreach_exp``, ...), the
binary ones (``_foreach_add``, ``_foreach_mul``, ``_foreach_pow``, ...), ``_foreach_lerp``,
``_foreach_addcmul``, ``_foreach_addcdiv``, ``_foreach_norm``, ``_foreach_max``,
``_foreach_zero`` and ``_foreach_copy``."""

from __future__ import annotations

from fornax.layers.graph import Value
from fornax.frameworks.builders import full as _full

from .arithmetic import add, addcdiv, addcmul, clamp_max, clamp_min, div, lerp, maximum, minimum, mul, pow_, sub
from .factories import copy
from .operands import zeros_as
from .promotion import compute_dtype
from .reductions import linalg_vector_norm, max_
from .shape import select
from .table import TABLE, lowering


def _each(ctx, n, fn):
    return [fn(ctx.for_output(i), i) for i in range(n)]


def _pick(x, i):
    return x[i] if isinstance(x, (list, tuple)) else x


for _name in ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "exp", "expm1", "floor", "frac", "log",
              "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh",
              "sqrt", "tan", "tanh", "trunc", "clone"):
    def _fe_unary(ctx, self, _base=f"aten::{_name}.default"):
        fn = TABLE[_base]
        return _each(ctx, len(self), lambda c, i: fn(c, self[i]))
    lowering(f"aten::_foreach_{_name}.default")(_fe_unary)


_FE_BINARY = {"add": add, "sub": sub, "mul": mul, "div": div, "maximum": maximum, "minimum": minimum,
              "clamp_min": clamp_min, "clamp_max": clamp_max, "pow": pow_}


for _name, _fn in _FE_BINARY.items():
    def _fe_binary(ctx, self, other=None, scalar=None, scalars=None, alpha=1, exponent=None, _fn=_fn, _name=_name):
        rhs = next(a for a in (other, scalar, scalars, exponent) if a is not None)
        if _name == "pow" and not isinstance(self, (list, tuple)):        # pow.ScalarAndTensor
            return _each(ctx, len(exponent), lambda c, i: _fn(c, self, exponent[i]))
        extra = {"alpha": alpha} if _name in ("add", "sub") else {}
        return _each(ctx, len(self), lambda c, i: _fn(c, self[i], _pick(rhs, i), **extra))
    overloads = {"List", "Scalar", "ScalarList"} | ({"Tensor"} if _name in ("add", "mul", "div") else set())
    if _name == "pow":
        overloads |= {"ScalarAndTensor"}
    lowering(*(f"aten::_foreach_{_name}.{o}" for o in sorted(overloads)))(_fe_binary)


@lowering("aten::_foreach_lerp.List", "aten::_foreach_lerp.Scalar", "aten::_foreach_lerp.ScalarList")
def _foreach_lerp(ctx, self, tensors1, weights=None, weight=None):
    w = weights if weights is not None else weight
    return _each(ctx, len(self), lambda c, i: lerp(c, self[i], tensors1[i], _pick(w, i)))


def _foreach_addc(base):
    def fn(ctx, self, tensor1, tensor2, value=1, scalars=None):
        def one(c, i):
            if isinstance(scalars, Value):         # .Tensor: a 1-D tensor of per-element scalars
                dt = compute_dtype(c)
                prod = base(c, _full(c, self[i].shape, 0, dt), tensor1[i], tensor2[i])
                return ctx.op("add", ctx.cast(self[i], dt), ctx.op("mul", prod, select(c, ctx.cast(scalars, dt), 0, i)))
            return base(c, self[i], tensor1[i], tensor2[i], _pick(scalars, i) if scalars is not None else value)
        return _each(ctx, len(self), one)
    return fn


lowering("aten::_foreach_addcmul.Scalar", "aten::_foreach_addcmul.ScalarList",
         "aten::_foreach_addcmul.Tensor")(_foreach_addc(addcmul))


lowering("aten::_foreach_addcdiv.Scalar", "aten::_foreach_addcdiv.ScalarList",
         "aten::_foreach_addcdiv.Tensor")(_foreach_addc(addcdiv))


@lowering("aten::_foreach_norm.Scalar")
def _foreach_norm(ctx, self, ord=2, dtype=None):
    return _each(ctx, len(self), lambda c, i: linalg_vector_norm(c, self[i], ord, None, False, dtype))


@lowering("aten::_foreach_max.default")
def _foreach_max(ctx, self):
    return _each(ctx, len(self), lambda c, i: max_(c, self[i]))


@lowering("aten::_foreach_zero.default")
def _foreach_zero(ctx, self):
    return [zeros_as(ctx, t) for t in self]


@lowering("aten::_foreach_copy.default")
def _foreach_copy(ctx, self, src, non_blocking=False):
    return [copy(ctx, a, b) for a, b in zip(self, src)]
