"""The ATen → fornax graph IR lowering table, shared by both PyTorch paths.

The eager device lowers each ATen op that reaches the ``fornax`` key into a
one-op graph; the graph path (``torch.compile`` / ``torch.export``) lowers an
FX graph of core ATen ops node by node.  Both call :func:`lower` with a
:class:`LowerCtx` (the graph being built and what torch says every tensor
output is) and the op's arguments, Tensors already replaced by graph
:class:`~fornax.layers.graph.Value` s.

Keys are overload names: ``str(op._schema.name) + "." + op._overloadname``,
so the default overload is ``"aten::relu.default"`` and others read
``"aten::add.Tensor"``, ``"aten::sum.dim_IntList"``.  A lowering is one
decorated function whose parameters are the schema's argument names::

    @lowering("aten::add.Tensor", "aten::add.Scalar")
    def add(ctx, self, other, alpha=1): ...

Semantics are PyTorch's, not the graph IR's: result dtypes come from
``ctx.outs`` (torch's own answer, so type promotion with Python scalars and
0-d tensors is exactly torch's), arithmetic on float16/bfloat16 is done in
float32 and rounded once (as torch's CPU kernels do), integer sums widen to
int64, ``div`` rounding modes, ``remainder``/``fmod`` signs, ``argmax`` ties,
``pow`` special exponents, ``clamp`` with absent bounds, ``var`` corrections
and both ``gelu`` approximations follow torch.

Honest limits (a refusal raises :class:`NotLowerable` with its reason):

* dtypes outside float64/32/16, bfloat16, int64/32 and bool (complex, uint8,
  int8, int16, float8) have no graph dtype;
* the graph IR has no zero-element tensors: an output torch makes empty is
  returned as ``None`` (the caller makes the empty tensor), and any op whose
  outputs are all empty (lowered or not) is answered with ``None`` s;
* ops whose result shape depends on data (``nonzero``, boolean-mask
  indexing, ``unique``) and random ops (dropout with ``0 < p < 1`` in
  training: RNG belongs to the framework's generator) are not lowered;
* ops that mutate an input (``native_batch_norm`` in training with running
  statistics) are not lowered: use the functional form
  (``_native_batch_norm_legit_functional``), which returns the new stats;
* ``as_strided`` indexes the input's own contiguous row-major elements (the
  caller passes the base it strides into);
* 3-d pooling, ``embedding_bag``, ``grid_sampler``, ``cdist``/``pdist``, FFTs,
  ``erfc`` (1 - erf loses its small values) and the allocation ops (``empty``,
  ``empty_strided``, ``resize_``: the eager path allocates) have no lowering;
* integer matrix products, ``pow`` of integers to negative integer powers,
  ``max_pool2d`` of integers, the ``mean`` of integers in ``scatter_reduce``,
  ``sort`` (and ``topk`` of more than 64 elements, which sorts) along an axis
  longer than 2**16 (a bitonic network of log2(n)**2 / 2 stages) and
  ``prod``/``amax``/``amin`` scatters (and ``scatter`` with
  ``reduce="multiply"``) of more than 2**22 update-position pairs (they compare
  every update with every position) are refused;
* ``index_put`` with a boolean mask is lowered when the value is the same for
  every selected element (``x[mask] = v``); per-element values need the count
  of selected elements (a data-dependent shape);
* ``topk`` puts equal values lower index first (torch's order among ties is
  unspecified); ``_adaptive_avg_pool2d`` with uneven windows and
  ``upsample_bilinear2d`` use averaging matrices, so an inf/NaN input also
  reaches the other outputs of its row (0 * inf).

In-place overloads (``aten::add_.Tensor``, ``aten::_foreach_mul_.Scalar``...) share
their functional op's lowering: ``ctx.outs`` then describes the new value of each
mutated argument (``self``, or each element of a ``_foreach`` list), the lowering
returns those values, and the caller writes them back.

A wrapped number (the 0-d CPU tensor ATen makes from a Python scalar in
``x + 2.5``) should be passed as the Python scalar: as a 0-d tensor it would
take part in type promotion as a tensor, which changes what comparisons and
``where`` compute in.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from fornax.layers.errors import GraphError, NotSupportedError
from fornax.layers.graph import DType, Graph, Value

from fornax.frameworks.builders import bitonic_sort, top_k
from fornax.frameworks.builders import (broadcast as _bcast, expm1 as _expm1, full as _full, halving as _halving,
                                        log1p as _log1p, permute as _permute, reshape as _reshape, scan as _scan,
                                        trunc as _trunc)

TORCH_TO_DTYPE: dict[torch.dtype, DType] = {
    torch.float64: DType.FLOAT64, torch.float32: DType.FLOAT32, torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16, torch.int64: DType.INT64, torch.int32: DType.INT32,
    torch.bool: DType.BOOL,
}
DTYPE_TO_TORCH: dict[DType, torch.dtype] = {v: k for k, v in TORCH_TO_DTYPE.items()}

_LOW = (DType.FLOAT16, DType.BFLOAT16)
_IGNORED_KWARGS = frozenset({"device", "layout", "pin_memory", "memory_format", "non_blocking"})


class NotLowerable(NotSupportedError):
    """An ATen op (or this combination of its arguments) has no graph lowering.

    ``str(exc)`` is the reason, starting with the overload name, e.g.
    ``"aten::add.Tensor: complex64 has no fornax dtype"``.  Callers fall back
    (eager: CPU; graph path: split the graph or refuse the compile)."""

    kind = "not_lowerable"

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class OutMeta:
    """What torch says one tensor output is (from a meta tensor or FakeTensor)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, t: torch.Tensor) -> "OutMeta":
        return cls(tuple(int(d) for d in t.shape), t.dtype)


def graph_dtype(dtype: torch.dtype, where: str = "") -> DType:
    """The graph dtype of a torch dtype, or :class:`NotLowerable` naming it."""
    try:
        return TORCH_TO_DTYPE[dtype]
    except KeyError:
        name = str(dtype).removeprefix("torch.")
        raise NotLowerable(f"{where + ': ' if where else ''}{name} has no fornax dtype (fornax graphs use "
                           f"{', '.join(d.value for d in DType)})") from None


def _dt(dtype) -> DType:
    return dtype if isinstance(dtype, DType) else graph_dtype(dtype)


class LowerCtx:
    """The graph a lowering adds to, and torch's description of the op's outputs.

    ``outs[i]`` is ``None`` for an output torch returns as ``None`` (a gradient
    masked off by ``output_mask``).  ``consts``: a scalar-constant cache to share
    between the contexts of one graph (each scalar value and dtype made once)."""

    def __init__(self, g: Graph, outs: list[OutMeta], consts: dict | None = None):
        self.g = g
        self.outs = list(outs)
        self.where = ""                       # the overload being lowered (for messages)
        self._consts: dict = {} if consts is None else consts

    def op(self, name: str, *vals: Value, **attrs) -> Value:
        return self.g.op(name, *vals, **attrs)

    def scalar(self, value, dtype) -> Value:
        """A 0-d constant of ``dtype`` (one per value and dtype in this graph)."""
        dt = _dt(dtype)
        if isinstance(value, torch.Tensor):
            value = value.item()
        key = (type(value).__name__, repr(value), dt)
        if key not in self._consts:
            if not dt.is_float and isinstance(value, float) and not math.isfinite(value):
                raise NotLowerable(f"{self.where}: {value} is not representable in {dt}")
            self._consts[key] = self.g.constant(np.array(value).astype(dt.numpy), "s")
        return self._consts[key]

    def cast(self, v: Value, dtype) -> Value:
        dt = _dt(dtype)
        return v if v.dtype is dt else self.g.op("cast", v, dtype=dt.value)

    def out(self, i: int = 0) -> DType:
        """The graph dtype of output ``i``."""
        return _dt(self.outs[i].dtype)

    def const(self, array, name: str = "c") -> Value:
        return self.g.constant(np.asarray(array), name)

    def fail(self, why: str) -> NotLowerable:
        return NotLowerable(f"{self.where}: {why}")

    def for_output(self, i: int) -> "LowerCtx":
        """A context for lowering output ``i`` alone (same graph and constants)."""
        sub = LowerCtx(self.g, [self.outs[i]], self._consts)
        sub.where = self.where
        return sub


# ---- the table ----------------------------------------------------------------------------
_TABLE: dict[str, Callable] = {}


def op_key(op) -> str:
    """``"aten::add.Tensor"`` / ``"aten::relu.default"`` for an OpOverload."""
    return f"{op._schema.name}.{op._overloadname}"


def lowering(*names: str):
    """Register the decorated function as the lowering of each named overload."""
    def deco(fn):
        for n in names:
            if n in _TABLE:
                raise ValueError(f"two lowerings for {n}")
            _TABLE[n] = fn
        return fn
    return deco


def lookup(op) -> Callable | None:
    """The lowering of an OpOverload (or overload name), or None."""
    return _TABLE.get(op if isinstance(op, str) else op_key(op))


def _bind(op, args: tuple, kwargs: dict, where: str) -> dict:
    """Arguments by schema name, defaults filled in, device/layout kwargs dropped."""
    out = {}
    schema_args = op._schema.arguments
    if len(args) > len(schema_args):
        raise NotLowerable(f"{where}: {len(args)} positional arguments, the schema has {len(schema_args)}")
    for i, a in enumerate(schema_args):
        if i < len(args) and not a.kwarg_only:
            val = args[i]
        elif a.name in kwargs:
            val = kwargs[a.name]
        elif a.has_default_value():
            val = a.default_value
        else:
            raise NotLowerable(f"{where}: argument {a.name!r} is missing")
        if a.name in _IGNORED_KWARGS:
            continue
        out[a.name] = val
    unknown = set(kwargs) - {a.name for a in schema_args}
    if unknown:
        raise NotLowerable(f"{where}: unknown keyword argument(s) {', '.join(sorted(unknown))}")
    return out


def lower(ctx: LowerCtx, op, args: tuple, kwargs: dict) -> list[Value | None]:
    """Lower one ATen op call (an OpOverload, or its name) into ``ctx.g``; one Value (or
    None) per tensor output.

    Tensors in ``args``/``kwargs`` are graph Values (Tensor[] a list of them,
    an absent optional tensor None), scalars plain Python numbers, dtype
    arguments ``torch.dtype``, SymInts ints.  Each result is cast to
    ``ctx.outs[i].dtype`` and its shape checked against ``ctx.outs[i].shape``;
    an output torch returns as ``None`` or with zero elements comes back as
    ``None``.  Raises :class:`NotLowerable` when the op or this argument
    combination has no lowering."""
    if isinstance(op, str):
        op = _resolve(op)
    where = op_key(op)
    ctx.where = where
    if ctx.outs and all(o is None or math.prod(o.shape) == 0 for o in ctx.outs):
        return [None] * len(ctx.outs)          # nothing to compute
    fn = _TABLE.get(where)
    if fn is None:
        raise NotLowerable(f"{where}: no fornax lowering")
    for o in ctx.outs:
        if o is not None:
            graph_dtype(o.dtype, where)
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.dtype):
            graph_dtype(a, where)
    bound = _bind(op, args, kwargs, where)
    try:
        res = fn(ctx, **bound)
    except NotLowerable:
        raise
    except GraphError as exc:
        raise NotLowerable(f"{where}: {exc.message}") from exc
    except Exception as exc:        # an argument form the lowering does not handle: never crash the op
        raise NotLowerable(f"{where}: the lowering failed ({type(exc).__name__}: {exc}); "
                           "a fornax lowering bug or an unsupported argument form") from exc
    if isinstance(res, Value) or res is None:
        res = [res]
    res = list(res)
    if len(res) != len(ctx.outs):
        raise NotLowerable(f"{where}: the lowering gave {len(res)} output(s), torch says {len(ctx.outs)} "
                           "(a fornax lowering bug)")
    out: list[Value | None] = []
    for i, (v, meta) in enumerate(zip(res, ctx.outs)):
        if meta is None or math.prod(meta.shape) == 0:
            out.append(None)
            continue
        if v is None:
            raise NotLowerable(f"{where}: output {i} is missing from the lowering (a fornax lowering bug)")
        if tuple(v.shape) != tuple(meta.shape):
            raise NotLowerable(f"{where}: output {i} has shape {tuple(v.shape)}, torch says "
                               f"{tuple(meta.shape)} (a fornax lowering bug)")
        try:
            out.append(ctx.cast(v, meta.dtype))
        except GraphError as exc:
            raise NotLowerable(f"{where}: {exc.message}") from exc
    return out


def _resolve(name: str):
    """The OpOverload of an overload name (``"aten::add.Tensor"``)."""
    try:
        ns, rest = name.split("::")
        packet, overload = rest.split(".")
        return getattr(getattr(getattr(torch.ops, ns), packet), overload)
    except (ValueError, AttributeError, RuntimeError):
        raise NotLowerable(f"{name}: not an ATen overload name (expected e.g. 'aten::add.Tensor')") from None


# ---- building a one-op graph (for the eager path and tests) --------------------------------
def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(a) for a in x)
    return x


def output_metas(op, args: tuple, kwargs: dict) -> list[OutMeta | None]:
    """torch's description of every tensor output of ``op(*args, **kwargs)``, from meta tensors."""
    res = op(*_to_meta(tuple(args)), **{k: _to_meta(v) for k, v in kwargs.items()})
    res = res if isinstance(res, (tuple, list)) else (res,)
    outs = []
    for r in res:
        if isinstance(r, (tuple, list)):
            outs.extend(None if t is None else OutMeta.of(t) for t in r)
        else:
            outs.append(None if r is None else OutMeta.of(r) if isinstance(r, torch.Tensor) else None)
    return outs


def single_op_graph(op, args: tuple, kwargs: dict | None = None,
                    outs: list[OutMeta | None] | None = None,
                    name: str | None = None) -> tuple[Graph, list[torch.Tensor], list[Value | None]]:
    """A graph of one ATen op call: every tensor argument (with at least one
    element) becomes a graph input named ``in0``, ``in1``...; returns the graph
    (its non-None outputs marked), the tensors to feed in input order, and
    the lowered outputs.  ``outs`` defaults to :func:`output_metas`."""
    kwargs = dict(kwargs or {})
    where = op_key(op)
    g = Graph(name or where.replace("::", "_").replace(".", "_"))
    feeds: list[torch.Tensor] = []

    def conv(x):
        if isinstance(x, torch.Tensor):
            if x.numel() == 0:
                raise NotLowerable(f"{where}: a tensor argument has no elements (graphs have no empty tensors)")
            v = g.input(f"in{len(feeds)}", tuple(x.shape), graph_dtype(x.dtype, where))
            feeds.append(x)
            return v
        if isinstance(x, (list, tuple)):
            return type(x)(conv(a) for a in x)
        return x

    vargs = conv(tuple(args))
    vkwargs = {k: conv(v) for k, v in kwargs.items()}
    ctx = LowerCtx(g, outs if outs is not None else output_metas(op, args, kwargs))
    res = lower(ctx, op, vargs, vkwargs)
    real = [v for v in res if v is not None]
    if real:
        g.output(*real)
    return g, feeds, res


# ---- helpers ----------------------------------------------------------------------------------
_KINDS = {"default": ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
          "bool": ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL,
          "float": ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT,
          "no_opmath": ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH}


@functools.lru_cache(maxsize=None)
def _meta_of(shape, dtype: DType) -> torch.Tensor:
    return torch.empty(shape, dtype=DTYPE_TO_TORCH[dtype], device="meta")


def _promote(*args, kind: str = "default") -> tuple[DType, DType]:
    """(compute dtype, result dtype) of an elementwise op over Values and Python scalars,
    by torch's rules (the compute dtype of float16/bfloat16 is float32)."""
    metas = [_meta_of(tuple(a.shape), a.dtype) if isinstance(a, Value) else a
             for a in args if a is not None]
    comp, res = elementwise_dtypes(*metas, type_promotion_kind=_KINDS[kind])
    return graph_dtype(comp), graph_dtype(res)


def _opmath(dt: DType) -> DType:
    return DType.FLOAT32 if dt in _LOW else dt


def _v(ctx: LowerCtx, x, dt: DType) -> Value:
    """A Value or Python scalar as a Value of ``dt``."""
    return ctx.cast(x, dt) if isinstance(x, Value) else ctx.scalar(x, dt)


def _binop(ctx, name, a, b, kind="default"):
    cdt, _ = _promote(a, b, kind=kind)
    return ctx.op(name, _v(ctx, a, cdt), _v(ctx, b, cdt))


def _compute(ctx, i: int = 0) -> DType:
    """The dtype to compute output ``i`` in: its dtype, float32 for float16/bfloat16."""
    return _opmath(ctx.out(i))


def _zeros_like(ctx, v: Value) -> Value:
    return _full(ctx, v.shape, 0, v.dtype)


def _ndim(v: Value) -> int:
    return len(v.shape)


def _wrap(d: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= d < r:
        raise GraphError(f"dim {d} is out of range for rank {rank}")
    return d % r


def _dims(dim, rank: int) -> list[int]:
    """Normalised reduction dims; None or [] mean every dim."""
    if dim is None:
        return list(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return list(range(rank))
    return sorted({_wrap(d, rank) for d in dim}) if rank else []


def _reduce(ctx, name: str, x: Value, dims, keepdim: bool) -> Value:
    """Reduce over several dims, one graph reduction per dim."""
    if _ndim(x) == 0:
        return x
    for d in dims:
        if x.shape[d] != 1 or name in ("argmax", "argmin"):
            x = ctx.op(name, x, axis=d, keepdims=True)
    if not keepdim:
        x = _reshape(ctx, x, [s for i, s in enumerate(x.shape) if i not in dims])
    return x


def _sum(ctx, x, dims, keepdim=True):
    return _reduce(ctx, "reduce_sum", x, dims, keepdim)


def _count(x: Value, dims) -> int:
    return math.prod(x.shape[d] for d in dims)


def _div(ctx, a, b, dt):
    return ctx.op("div", _v(ctx, a, dt), _v(ctx, b, dt))


def _mul(ctx, a, b, dt):
    return ctx.op("mul", _v(ctx, a, dt), _v(ctx, b, dt))


def _add(ctx, a, b, dt):
    return ctx.op("add", _v(ctx, a, dt), _v(ctx, b, dt))


def _sub(ctx, a, b, dt):
    return ctx.op("sub", _v(ctx, a, dt), _v(ctx, b, dt))


def _where(ctx, cond, a, b, dt):
    return ctx.op("where", cond, _v(ctx, a, dt), _v(ctx, b, dt))


def _float_in(ctx, x: Value, i: int = 0) -> Value:
    """``x`` cast to the compute dtype of output ``i`` (int inputs of float ops become float)."""
    return ctx.cast(x, _compute(ctx, i))


# ---- elementwise arithmetic -----------------------------------------------------------------
@lowering("aten::add.Tensor", "aten::add.Scalar")
def add(ctx, self, other, alpha=1):
    cdt, _ = _promote(self, other)
    b = _v(ctx, other, cdt)
    if alpha != 1:
        b = ctx.op("mul", b, ctx.scalar(alpha, cdt))
    return ctx.op("add", _v(ctx, self, cdt), b)


@lowering("aten::sub.Tensor", "aten::sub.Scalar")
def sub(ctx, self, other, alpha=1):
    cdt, _ = _promote(self, other)
    if cdt is DType.BOOL:
        raise ctx.fail("subtracting bool tensors is not supported (torch refuses it too)")
    b = _v(ctx, other, cdt)
    if alpha != 1:
        b = ctx.op("mul", b, ctx.scalar(alpha, cdt))
    return ctx.op("sub", _v(ctx, self, cdt), b)


@lowering("aten::rsub.Tensor", "aten::rsub.Scalar")
def rsub(ctx, self, other, alpha=1):
    return sub(ctx, other, self, alpha)


@lowering("aten::mul.Tensor", "aten::mul.Scalar")
def mul(ctx, self, other):
    return _binop(ctx, "mul", self, other)


@lowering("aten::div.Tensor", "aten::div.Scalar", "aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div(ctx, self, other, rounding_mode=None):
    if rounding_mode is None:
        cdt, _ = _promote(self, other, kind="float")
        return ctx.op("div", _v(ctx, self, cdt), _v(ctx, other, cdt))
    cdt, _ = _promote(self, other)
    a, b = _v(ctx, self, cdt), _v(ctx, other, cdt)
    if rounding_mode == "floor":
        return ctx.op("floor_divide", a, b)
    if rounding_mode != "trunc":
        raise ctx.fail(f"rounding_mode {rounding_mode!r} is not 'trunc', 'floor' or None")
    if cdt.is_float:
        return _trunc(ctx, ctx.op("div", a, b))
    # integers: floor division, plus one where the quotient is negative and inexact
    q = ctx.op("floor_divide", a, b)
    inexact = ctx.op("ne", ctx.op("mul", q, b), a)
    neg = ctx.op("ne", ctx.op("lt", a, ctx.scalar(0, cdt)), ctx.op("lt", b, ctx.scalar(0, cdt)))
    return ctx.op("add", q, ctx.cast(ctx.op("logical_and", inexact, neg), cdt))


@lowering("aten::floor_divide.default", "aten::floor_divide.Scalar")
def floor_divide(ctx, self, other):
    return _binop(ctx, "floor_divide", self, other)


@lowering("aten::remainder.Tensor", "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor")
def remainder(ctx, self, other):
    return _binop(ctx, "remainder", self, other)


@lowering("aten::fmod.Tensor", "aten::fmod.Scalar")
def fmod(ctx, self, other):
    """C fmod (sign of the dividend) from remainder (sign of the divisor): they differ by
    the divisor where the remainder is non-zero and its sign is not the dividend's."""
    cdt, _ = _promote(self, other)
    a, b = _v(ctx, self, cdt), _v(ctx, other, cdt)
    r = ctx.op("remainder", a, b)
    zero = ctx.scalar(0, cdt)
    fix = ctx.op("logical_and", ctx.op("ne", r, zero),
                 ctx.op("ne", ctx.op("lt", r, zero), ctx.op("lt", a, zero)))
    return ctx.op("where", fix, ctx.op("sub", r, b), r)


_POW_SPECIAL = {2: lambda c, x: c.op("mul", x, x),
                3: lambda c, x: c.op("mul", c.op("mul", x, x), x),
                0.5: lambda c, x: c.op("sqrt", x),
                -0.5: lambda c, x: c.op("rsqrt", x),
                -1: lambda c, x: c.op("reciprocal", x),
                -2: lambda c, x: c.op("reciprocal", c.op("mul", x, x))}


@lowering("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "aten::pow.Scalar")
def pow_(ctx, self, exponent):
    cdt, _ = _promote(self, exponent)
    if isinstance(self, Value) and not isinstance(exponent, Value):
        if not cdt.is_float and exponent < 0:
            raise ctx.fail("integers to negative integer powers are not allowed")
        x = ctx.cast(self, cdt)
        if exponent == 1:
            return x
        if exponent == 0:
            return _full(ctx, x.shape, 1, cdt)
        special = _POW_SPECIAL.get(exponent)
        if special is not None and (cdt.is_float or exponent in (2, 3)):
            return special(ctx, x)
    return ctx.op("pow", _v(ctx, self, cdt), _v(ctx, exponent, cdt))


@lowering("aten::maximum.default", "aten::max.other")
def maximum(ctx, self, other):
    return _binop(ctx, "maximum", self, other)


@lowering("aten::minimum.default", "aten::min.other")
def minimum(ctx, self, other):
    return _binop(ctx, "minimum", self, other)


@lowering("aten::atan2.default")
def atan2(ctx, self, other):
    return _binop(ctx, "atan2", self, other, kind="float")


@lowering("aten::clamp.default", "aten::clamp.Tensor")
def clamp(ctx, self, min=None, max=None):
    cdt, _ = _promote(self, min, max)
    x = ctx.cast(self, cdt)
    if min is not None and max is not None:
        lo, hi = _v(ctx, min, cdt), _v(ctx, max, cdt)
        if tuple(np.broadcast_shapes(lo.shape, hi.shape, x.shape)) == tuple(x.shape):
            return ctx.op("clamp", x, lo, hi)
    if min is not None:
        x = ctx.op("maximum", x, _v(ctx, min, cdt))
    if max is not None:
        x = ctx.op("minimum", x, _v(ctx, max, cdt))
    return x


@lowering("aten::clamp_min.default", "aten::clamp_min.Tensor")
def clamp_min(ctx, self, min):
    return clamp(ctx, self, min, None)


@lowering("aten::clamp_max.default", "aten::clamp_max.Tensor")
def clamp_max(ctx, self, max):
    return clamp(ctx, self, None, max)


@lowering("aten::where.self", "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::where.Scalar")
def where(ctx, condition, self, other):
    dt = ctx.out()
    return ctx.op("where", ctx.cast(condition, DType.BOOL), _v(ctx, self, dt), _v(ctx, other, dt))


@lowering("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def masked_fill(ctx, self, mask, value):
    return ctx.op("where", ctx.cast(mask, DType.BOOL), _v(ctx, value, self.dtype), self)


@lowering("aten::lerp.Scalar", "aten::lerp.Tensor")
def lerp(ctx, self, end, weight):
    """torch's two-sided form: ``a + w(b-a)`` for |w| < 1/2, else ``b - (b-a)(1-w)``."""
    dt = _compute(ctx)
    a, b, w = ctx.cast(self, dt), ctx.cast(end, dt), _v(ctx, weight, dt)
    d = ctx.op("sub", b, a)
    lo = ctx.op("add", a, ctx.op("mul", w, d))
    hi = ctx.op("sub", b, ctx.op("mul", d, ctx.op("sub", ctx.scalar(1, dt), w)))
    small = ctx.op("lt", ctx.op("abs", w), ctx.scalar(0.5, dt))
    return ctx.op("where", small, lo, hi)


@lowering("aten::addcmul.default")
def addcmul(ctx, self, tensor1, tensor2, value=1):
    dt = _compute(ctx)
    p = ctx.op("mul", ctx.cast(tensor1, dt), ctx.cast(tensor2, dt))
    if value != 1:
        p = ctx.op("mul", ctx.scalar(value, dt), p)
    return ctx.op("add", ctx.cast(self, dt), p)


@lowering("aten::addcdiv.default")
def addcdiv(ctx, self, tensor1, tensor2, value=1):
    dt = _compute(ctx)
    if not dt.is_float:
        raise ctx.fail("addcdiv of integer tensors is not supported (torch refuses it too)")
    q = ctx.op("div", ctx.cast(tensor1, dt), ctx.cast(tensor2, dt))
    if value != 1:
        q = ctx.op("mul", ctx.scalar(value, dt), q)
    return ctx.op("add", ctx.cast(self, dt), q)


# ---- comparisons and logic ----------------------------------------------------------------------
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    def _cmp(ctx, self, other, _name=_name):
        return _binop(ctx, _name, self, other, kind="bool")
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
        cdt, _ = _promote(self, other)
        if cdt.is_float:
            raise ctx.fail(f"{_name} needs integer or bool operands, got {cdt}")
        return ctx.op(_name, _v(ctx, self, cdt), _v(ctx, other, cdt))
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


def _isinf(ctx, x, sign=0):
    if not x.dtype.is_float:
        return _full(ctx, x.shape, False, DType.BOOL)
    if sign > 0:
        return ctx.op("eq", x, ctx.scalar(math.inf, x.dtype))
    if sign < 0:
        return ctx.op("eq", x, ctx.scalar(-math.inf, x.dtype))
    return ctx.op("eq", ctx.op("abs", x), ctx.scalar(math.inf, x.dtype))


@lowering("aten::isinf.default")
def isinf(ctx, self):
    return _isinf(ctx, self)


@lowering("aten::isposinf.default")
def isposinf(ctx, self):
    return _isinf(ctx, self, 1)


@lowering("aten::isneginf.default")
def isneginf(ctx, self):
    return _isinf(ctx, self, -1)


@lowering("aten::nan_to_num.default")
def nan_to_num(ctx, self, nan=None, posinf=None, neginf=None):
    x = self
    if not x.dtype.is_float:
        return x
    fi = np.finfo(x.dtype.numpy) if x.dtype is not DType.BFLOAT16 else torch.finfo(torch.bfloat16)
    x = ctx.op("where", ctx.op("isnan", x), ctx.scalar(0.0 if nan is None else nan, x.dtype), x)
    x = ctx.op("where", _isinf(ctx, x, 1), ctx.scalar(float(fi.max) if posinf is None else posinf, x.dtype), x)
    return ctx.op("where", _isinf(ctx, x, -1), ctx.scalar(float(fi.min) if neginf is None else neginf,
                                                         x.dtype), x)


# ---- unary math -------------------------------------------------------------------------------------
def _unary_float(name):
    def fn(ctx, self):
        return ctx.op(name, _float_in(ctx, self))
    return fn


for _name in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "reciprocal"):
    lowering(f"aten::{_name}.default")(_unary_float(_name))


@lowering("aten::neg.default")
def neg(ctx, self):
    if self.dtype is DType.BOOL:
        raise ctx.fail("negating a bool tensor is not supported (torch refuses it too)")
    return ctx.op("neg", self)


@lowering("aten::abs.default")
def abs_(ctx, self):
    return self if self.dtype is DType.BOOL else ctx.op("abs", self)


@lowering("aten::sign.default", "aten::sgn.default")
def sign(ctx, self):
    return self if self.dtype is DType.BOOL else ctx.op("sign", self)


for _name in ("floor", "ceil"):
    def _rounding(ctx, self, _name=_name):
        return self if not self.dtype.is_float else ctx.op(_name, self)
    lowering(f"aten::{_name}.default")(_rounding)


@lowering("aten::trunc.default", "aten::fix.default")
def trunc(ctx, self):
    return _trunc(ctx, self)


@lowering("aten::frac.default")
def frac(ctx, self):
    return ctx.op("sub", self, _trunc(ctx, self))


@lowering("aten::round.default", "aten::round.decimals")
def round_(ctx, self, decimals=0):
    """Half to even; with ``decimals``, torch's ``nearbyint(x * 10^d) / 10^d``."""
    if not self.dtype.is_float:
        return self
    if decimals == 0:
        return ctx.op("round", self)
    dt = self.dtype
    p = ctx.scalar(10.0 ** abs(decimals), dt)
    if decimals > 0:
        return ctx.op("div", ctx.op("round", ctx.op("mul", self, p)), p)
    return ctx.op("mul", ctx.op("round", ctx.op("div", self, p)), p)


@lowering("aten::expm1.default")
def expm1(ctx, self):
    return _expm1(ctx, _float_in(ctx, self))


@lowering("aten::log1p.default")
def log1p(ctx, self):
    return _log1p(ctx, _float_in(ctx, self))


@lowering("aten::exp2.default")
def exp2(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("exp", ctx.op("mul", x, ctx.scalar(math.log(2.0), x.dtype)))


@lowering("aten::log2.default")
def log2(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("div", ctx.op("log", x), ctx.scalar(math.log(2.0), x.dtype))


@lowering("aten::log10.default")
def log10(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("div", ctx.op("log", x), ctx.scalar(math.log(10.0), x.dtype))


@lowering("aten::tan.default")
def tan(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("div", ctx.op("sin", x), ctx.op("cos", x))


@lowering("aten::atan.default")
def atan(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("atan2", x, ctx.scalar(1, x.dtype))


@lowering("aten::asin.default")
def asin(ctx, self):
    x = _float_in(ctx, self)
    c = ctx.op("sqrt", ctx.op("sub", ctx.scalar(1, x.dtype), ctx.op("mul", x, x)))
    return ctx.op("atan2", x, c)


@lowering("aten::acos.default")
def acos(ctx, self):
    x = _float_in(ctx, self)
    s = ctx.op("sqrt", ctx.op("sub", ctx.scalar(1, x.dtype), ctx.op("mul", x, x)))
    return ctx.op("atan2", s, x)


@lowering("aten::sinh.default")
def sinh(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("mul", ctx.op("sub", _expm1(ctx, x), _expm1(ctx, ctx.op("neg", x))), ctx.scalar(0.5, x.dtype))


@lowering("aten::cosh.default")
def cosh(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("mul", ctx.op("add", ctx.op("exp", x), ctx.op("exp", ctx.op("neg", x))),
                  ctx.scalar(0.5, x.dtype))


# ---- activations -------------------------------------------------------------------------------------
@lowering("aten::relu.default")
def relu(ctx, self):
    if self.dtype.is_float:
        return ctx.op("relu", self)
    if self.dtype is DType.BOOL:
        raise ctx.fail("relu of a bool tensor is not supported (torch refuses it too)")
    return ctx.op("maximum", self, ctx.scalar(0, self.dtype))


@lowering("aten::gelu.default")
def gelu(ctx, self, approximate="none"):
    return ctx.op("gelu", _float_in(ctx, self), approximate=approximate)


@lowering("aten::silu.default")
def silu(ctx, self):
    return ctx.op("silu", _float_in(ctx, self))


@lowering("aten::hardtanh.default")
def hardtanh(ctx, self, min_val=-1, max_val=1):
    return clamp(ctx, self, min_val, max_val)


@lowering("aten::leaky_relu.default")
def leaky_relu(ctx, self, negative_slope=0.01):
    x = _float_in(ctx, self)
    return ctx.op("where", ctx.op("gt", x, ctx.scalar(0, x.dtype)), x,
                  ctx.op("mul", x, ctx.scalar(negative_slope, x.dtype)))


@lowering("aten::elu.default")
def elu(ctx, self, alpha=1, scale=1, input_scale=1):
    x = _float_in(ctx, self)
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
    return _softplus(ctx, _float_in(ctx, self), beta, threshold)


@lowering("aten::mish.default")
def mish(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("mul", x, ctx.op("tanh", _softplus(ctx, x, 1, 20)))


def _relu6ish(ctx, x):
    """min(max(x + 3, 0), 6) / 6"""
    dt = x.dtype
    c = ctx.op("clamp", ctx.op("add", x, ctx.scalar(3, dt)), ctx.scalar(0, dt), ctx.scalar(6, dt))
    return ctx.op("div", c, ctx.scalar(6, dt))


@lowering("aten::hardsigmoid.default")
def hardsigmoid(ctx, self):
    return _relu6ish(ctx, _float_in(ctx, self))


@lowering("aten::hardswish.default")
def hardswish(ctx, self):
    x = _float_in(ctx, self)
    return ctx.op("mul", x, _relu6ish(ctx, x))


@lowering("aten::glu.default")
def glu(ctx, self, dim=-1):
    x = _float_in(ctx, self)
    d = _wrap(dim, _ndim(x))
    a, b = _split(ctx, x, [x.shape[d] // 2] * 2, d)
    return ctx.op("mul", a, ctx.op("sigmoid", b))


# ---- activation backward ------------------------------------------------------------------------------
@lowering("aten::threshold_backward.default")
def threshold_backward(ctx, grad_output, self, threshold):
    dt = _compute(ctx)
    g = ctx.cast(grad_output, dt)
    return ctx.op("where", _binop(ctx, "le", self, threshold, kind="bool"), ctx.scalar(0, dt), g)


@lowering("aten::threshold.default")
def threshold(ctx, self, threshold, value):
    dt = ctx.out()
    return ctx.op("where", _binop(ctx, "le", self, threshold, kind="bool"), _v(ctx, value, dt),
                  ctx.cast(self, dt))


@lowering("aten::sigmoid_backward.default")
def sigmoid_backward(ctx, grad_output, output):
    dt = _compute(ctx)
    y = ctx.cast(output, dt)
    return ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("mul", ctx.op("sub", ctx.scalar(1, dt), y), y))


@lowering("aten::tanh_backward.default")
def tanh_backward(ctx, grad_output, output):
    dt = _compute(ctx)
    y = ctx.cast(output, dt)
    return ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("sub", ctx.scalar(1, dt), ctx.op("mul", y, y)))


@lowering("aten::silu_backward.default")
def silu_backward(ctx, grad_output, self):
    dt = _compute(ctx)
    x = ctx.cast(self, dt)
    s = ctx.op("sigmoid", x)
    inner = ctx.op("add", ctx.scalar(1, dt), ctx.op("mul", x, ctx.op("sub", ctx.scalar(1, dt), s)))
    return ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("mul", s, inner))


@lowering("aten::gelu_backward.default")
def gelu_backward(ctx, grad_output, self, approximate="none"):
    dt = _compute(ctx)
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
    dt = _compute(ctx)
    x = ctx.cast(self, dt)
    out = ctx.op("logical_or", ctx.op("le", x, ctx.scalar(min_val, dt)), ctx.op("ge", x, ctx.scalar(max_val, dt)))
    return ctx.op("where", out, ctx.scalar(0, dt), ctx.cast(grad_output, dt))


@lowering("aten::leaky_relu_backward.default")
def leaky_relu_backward(ctx, grad_output, self, negative_slope, self_is_result):
    dt = _compute(ctx)
    g = ctx.cast(grad_output, dt)
    return ctx.op("where", ctx.op("gt", ctx.cast(self, dt), ctx.scalar(0, dt)), g,
                  ctx.op("mul", g, ctx.scalar(negative_slope, dt)))


@lowering("aten::elu_backward.default")
def elu_backward(ctx, grad_output, alpha, scale, input_scale, is_result, self_or_result):
    dt = _compute(ctx)
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
    dt = _compute(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    bx = ctx.op("mul", x, ctx.scalar(beta, dt))
    z = ctx.op("exp", bx)
    soft = ctx.op("mul", g, ctx.op("div", z, ctx.op("add", z, ctx.scalar(1, dt))))
    return ctx.op("where", ctx.op("gt", bx, ctx.scalar(threshold, dt)), g, soft)


@lowering("aten::hardsigmoid_backward.default")
def hardsigmoid_backward(ctx, grad_output, self):
    dt = _compute(ctx)
    x = ctx.cast(self, dt)
    inside = ctx.op("logical_and", ctx.op("gt", x, ctx.scalar(-3, dt)), ctx.op("lt", x, ctx.scalar(3, dt)))
    return ctx.op("where", inside, ctx.op("div", ctx.cast(grad_output, dt), ctx.scalar(6, dt)), ctx.scalar(0, dt))


@lowering("aten::hardswish_backward.default")
def hardswish_backward(ctx, grad_output, self):
    dt = _compute(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    mid = ctx.op("mul", g, ctx.op("add", ctx.op("div", x, ctx.scalar(3, dt)), ctx.scalar(0.5, dt)))
    r = ctx.op("where", ctx.op("lt", x, ctx.scalar(3, dt)), mid, g)
    return ctx.op("where", ctx.op("le", x, ctx.scalar(-3, dt)), ctx.scalar(0, dt), r)


# ---- softmax -------------------------------------------------------------------------------------------
def _axis_op(ctx, name, x, dim, **attrs):
    """A graph op with an ``axis`` on ``x``; a 0-d ``x`` is treated as shape (1,)."""
    if _ndim(x) == 0:
        return _reshape(ctx, ctx.op(name, _reshape(ctx, x, (1,)), axis=0, **attrs), ())
    return ctx.op(name, x, axis=_wrap(dim, _ndim(x)), **attrs)


@lowering("aten::_softmax.default")
def _softmax(ctx, self, dim, half_to_float=False):
    return _axis_op(ctx, "softmax", _float_in(ctx, self), dim)


@lowering("aten::_log_softmax.default")
def _log_softmax(ctx, self, dim, half_to_float=False):
    return _axis_op(ctx, "log_softmax", _float_in(ctx, self), dim)


@lowering("aten::_softmax_backward_data.default")
def _softmax_backward_data(ctx, grad_output, output, dim, input_dtype):
    dt = _compute(ctx)
    g, y = ctx.cast(grad_output, dt), ctx.cast(output, dt)
    gy = ctx.op("mul", g, y)
    d = _dims(dim, _ndim(y))
    return ctx.op("mul", y, ctx.op("sub", g, _sum(ctx, gy, d)))


@lowering("aten::_log_softmax_backward_data.default")
def _log_softmax_backward_data(ctx, grad_output, output, dim, input_dtype):
    dt = _compute(ctx)
    g, y = ctx.cast(grad_output, dt), ctx.cast(output, dt)
    d = _dims(dim, _ndim(y))
    return ctx.op("sub", g, ctx.op("mul", ctx.op("exp", y), _sum(ctx, g, d)))


# ---- reductions ----------------------------------------------------------------------------------------
@lowering("aten::sum.default", "aten::sum.dim_IntList")
def sum_(ctx, self, dim=None, keepdim=False, dtype=None):
    dt = _compute(ctx)
    return _sum(ctx, ctx.cast(self, dt), _dims(dim, _ndim(self)), keepdim)


@lowering("aten::mean.default", "aten::mean.dim")
def mean(ctx, self, dim=None, keepdim=False, dtype=None):
    dt = _compute(ctx)
    if not dt.is_float:
        raise ctx.fail(f"mean needs a floating-point input or dtype, got {dt} (torch refuses it too)")
    dims = _dims(dim, _ndim(self))
    return _div(ctx, _sum(ctx, ctx.cast(self, dt), dims, keepdim), _count(self, dims), dt)


def _minmax(ctx, name, x, dims, keepdim):
    if x.dtype is DType.BOOL:       # graph reductions take no bool: reduce 0/1 as int32
        return ctx.cast(_reduce(ctx, name, ctx.cast(x, DType.INT32), dims, keepdim), DType.BOOL)
    return _reduce(ctx, name, x, dims, keepdim)


@lowering("aten::amax.default")
def amax(ctx, self, dim=(), keepdim=False):
    return _minmax(ctx, "reduce_max", self, _dims(dim, _ndim(self)), keepdim)


@lowering("aten::amin.default")
def amin(ctx, self, dim=(), keepdim=False):
    return _minmax(ctx, "reduce_min", self, _dims(dim, _ndim(self)), keepdim)


@lowering("aten::max.default")
def max_(ctx, self):
    return _minmax(ctx, "reduce_max", self, _dims(None, _ndim(self)), False)


@lowering("aten::min.default")
def min_(ctx, self):
    return _minmax(ctx, "reduce_min", self, _dims(None, _ndim(self)), False)


def _arg(ctx, name, x, dim, keepdim):
    if x.dtype is DType.BOOL:
        x = ctx.cast(x, DType.INT32)
    if _ndim(x) == 0:
        return _full(ctx, (), 0, DType.INT64)
    if dim is None:
        r = ctx.op(name, _reshape(ctx, x, (-1,)), axis=0, keepdims=False)
        return _reshape(ctx, r, (1,) * _ndim(x)) if keepdim else r
    return ctx.op(name, x, axis=_wrap(dim, _ndim(x)), keepdims=keepdim)


@lowering("aten::argmax.default")
def argmax(ctx, self, dim=None, keepdim=False):
    return _arg(ctx, "argmax", self, dim, keepdim)


@lowering("aten::argmin.default")
def argmin(ctx, self, dim=None, keepdim=False):
    return _arg(ctx, "argmin", self, dim, keepdim)


@lowering("aten::max.dim")
def max_dim(ctx, self, dim, keepdim=False):
    return (_minmax(ctx, "reduce_max", self, _dims(dim, _ndim(self)), keepdim),
            _arg(ctx, "argmax", self, dim, keepdim))


@lowering("aten::min.dim")
def min_dim(ctx, self, dim, keepdim=False):
    return (_minmax(ctx, "reduce_min", self, _dims(dim, _ndim(self)), keepdim),
            _arg(ctx, "argmin", self, dim, keepdim))


@lowering("aten::any.default", "aten::any.dim", "aten::any.dims")
def any_(ctx, self, dim=None, keepdim=False):
    b = ctx.cast(ctx.cast(self, DType.BOOL), DType.INT32)
    return ctx.cast(_reduce(ctx, "reduce_max", b, _dims(dim, _ndim(self)), keepdim), DType.BOOL)


@lowering("aten::all.default", "aten::all.dim", "aten::all.dims")
def all_(ctx, self, dim=None, keepdim=False):
    b = ctx.cast(ctx.cast(self, DType.BOOL), DType.INT32)
    return ctx.cast(_reduce(ctx, "reduce_min", b, _dims(dim, _ndim(self)), keepdim), DType.BOOL)


def _var_mean(ctx, x, dim, correction, keepdim, unbiased=None):
    """(variance, mean) in the compute dtype, torch's correction (default 1; dof clamped at 0)."""
    dt = _opmath(x.dtype) if x.dtype.is_float else DType.FLOAT32
    if not x.dtype.is_float:
        raise ctx.fail(f"var/std need a floating-point input, got {x.dtype} (torch refuses it too)")
    x = ctx.cast(x, dt)
    dims = _dims(dim, _ndim(x))
    corr = (1 if unbiased is None or unbiased else 0) if correction is None else correction
    n = _count(x, dims)
    m = _div(ctx, _sum(ctx, x, dims), n, dt)
    if _ndim(x) and len(dims) == 1 and float(corr).is_integer() and n - corr > 0 and corr >= 0:
        v = ctx.op("var", x, axis=dims[0], keepdims=keepdim, correction=int(corr))
    else:
        d = ctx.op("sub", x, m)
        v = _div(ctx, _sum(ctx, ctx.op("mul", d, d), dims, keepdim), max(0, n - corr), dt)
    if not keepdim:
        m = _reshape(ctx, m, [s for i, s in enumerate(m.shape) if i not in dims])
    return v, m


@lowering("aten::var.default", "aten::var.dim", "aten::var.correction")
def var(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return _var_mean(ctx, self, dim, correction, keepdim, unbiased)[0]


@lowering("aten::std.default", "aten::std.dim", "aten::std.correction")
def std(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return ctx.op("sqrt", _var_mean(ctx, self, dim, correction, keepdim, unbiased)[0])


@lowering("aten::var_mean.default", "aten::var_mean.dim", "aten::var_mean.correction")
def var_mean(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    return _var_mean(ctx, self, dim, correction, keepdim, unbiased)


@lowering("aten::std_mean.default", "aten::std_mean.dim", "aten::std_mean.correction")
def std_mean(ctx, self, dim=None, unbiased=None, keepdim=False, correction=None):
    v, m = _var_mean(ctx, self, dim, correction, keepdim, unbiased)
    return ctx.op("sqrt", v), m


@lowering("aten::logsumexp.default")
def logsumexp(ctx, self, dim, keepdim=False):
    x = _float_in(ctx, self)
    dims = _dims(dim, _ndim(x))
    m = _reduce(ctx, "reduce_max", x, dims, True)
    m = ctx.op("where", _isinf(ctx, m), ctx.scalar(0, x.dtype), m)
    s = _sum(ctx, ctx.op("exp", ctx.op("sub", x, m)), dims, True)
    r = ctx.op("add", ctx.op("log", s), m)
    return r if keepdim else _reshape(ctx, r, ctx.outs[0].shape)


@lowering("aten::prod.default", "aten::prod.dim_int")
def prod(ctx, self, dim=None, keepdim=False, dtype=None):
    dt = _compute(ctx)
    x = ctx.cast(self, dt)
    dims = _dims(dim, _ndim(x))
    if dt is DType.BOOL:
        x, dt = ctx.cast(x, DType.INT64), DType.INT64
    for d in dims:
        x = _halving(ctx, x, d, "mul", 1)
    return x if keepdim else _reshape(ctx, x, ctx.outs[0].shape)


@lowering("aten::cumsum.default")
def cumsum(ctx, self, dim, dtype=None):
    x = ctx.cast(self, _compute(ctx))
    if _ndim(x) == 0:
        return x
    return _scan(ctx, x, _wrap(dim, _ndim(x)), "add", 0)


@lowering("aten::cumprod.default")
def cumprod(ctx, self, dim, dtype=None):
    x = ctx.cast(self, _compute(ctx))
    if _ndim(x) == 0:
        return x
    return _scan(ctx, x, _wrap(dim, _ndim(x)), "mul", 1)


@lowering("aten::linalg_vector_norm.default")
def linalg_vector_norm(ctx, self, ord=2, dim=None, keepdim=False, dtype=None):
    dt = _compute(ctx)
    x = ctx.op("abs", ctx.cast(self, dt))
    dims = _dims(dim, _ndim(x))
    if ord == math.inf:
        return _reduce(ctx, "reduce_max", x, dims, keepdim)
    if ord == -math.inf:
        return _reduce(ctx, "reduce_min", x, dims, keepdim)
    if ord == 0:
        return _sum(ctx, ctx.cast(ctx.op("ne", x, ctx.scalar(0, dt)), dt), dims, keepdim)
    if ord == 1:
        return _sum(ctx, x, dims, keepdim)
    if ord == 2:
        return ctx.op("sqrt", _sum(ctx, ctx.op("mul", x, x), dims, keepdim))
    s = _sum(ctx, ctx.op("pow", x, ctx.scalar(ord, dt)), dims, keepdim)
    return ctx.op("pow", s, ctx.scalar(1.0 / ord, dt))


# ---- creation and copies ------------------------------------------------------------------------------
@lowering("aten::full.default", "aten::new_full.default")
def full(ctx, size, fill_value, dtype=None, self=None):
    return _full(ctx, tuple(size), fill_value, ctx.out())


@lowering("aten::zeros.default", "aten::new_zeros.default")
def zeros(ctx, size, dtype=None, self=None):
    return _full(ctx, tuple(size), 0, ctx.out())


@lowering("aten::ones.default", "aten::new_ones.default")
def ones(ctx, size, dtype=None, self=None):
    return _full(ctx, tuple(size), 1, ctx.out())


@lowering("aten::full_like.default")
def full_like(ctx, self, fill_value, dtype=None):
    return _full(ctx, self.shape, fill_value, ctx.out())


@lowering("aten::zeros_like.default")
def zeros_like(ctx, self, dtype=None):
    return _full(ctx, self.shape, 0, ctx.out())


@lowering("aten::ones_like.default")
def ones_like(ctx, self, dtype=None):
    return _full(ctx, self.shape, 1, ctx.out())


@lowering("aten::fill.Scalar", "aten::fill.Tensor")
def fill(ctx, self, value):
    return _bcast(ctx, _v(ctx, value, self.dtype), self.shape)


@lowering("aten::scalar_tensor.default")
def scalar_tensor(ctx, s, dtype=None):
    return ctx.scalar(s, ctx.out())


@lowering("aten::arange.default")
def arange(ctx, end, start=0, step=1, dtype=None):
    """``start + i*step``, computed in float64 (int64 for integers) as torch's CPU kernel
    accumulates, then cast."""
    n = ctx.outs[0].shape[0]
    dt = ctx.out()
    wide = DType.FLOAT64 if dt.is_float else DType.INT64
    i = ctx.op("iota", shape=(n,), axis=0, dtype=wide.value)
    if step != 1:
        i = ctx.op("mul", i, ctx.scalar(step, wide))
    return ctx.op("add", i, ctx.scalar(start, wide)) if start != 0 else i


@lowering("aten::arange.start", "aten::arange.start_step")
def arange_start(ctx, start, end, step=1, dtype=None):
    return arange(ctx, end, start, step, dtype)


@lowering("aten::_to_copy.default", "aten::clone.default", "aten::alias.default", "aten::detach.default",
          "aten::lift_fresh_copy.default", "aten::lift_fresh.default", "aten::alias_copy.default",
          "aten::detach_copy.default", "aten::contiguous.default", "aten::positive.default")
def identity(ctx, self, dtype=None, memory_format=None):
    """A copy or a dtype conversion: :func:`lower` casts to the output dtype."""
    return self


@lowering("aten::copy.default")
def copy(ctx, self, src, non_blocking=False):
    return _bcast(ctx, ctx.cast(src, self.dtype), self.shape)


# ---- layout --------------------------------------------------------------------------------------------
@lowering("aten::view.default", "aten::_unsafe_view.default", "aten::view_copy.default",
          "aten::_reshape_alias.default")
def view(ctx, self, size, stride=None):
    return _reshape(ctx, self, ctx.outs[0].shape if -1 in tuple(size) else size)


@lowering("aten::reshape.default")
def reshape(ctx, self, shape):
    return view(ctx, self, shape)


@lowering("aten::permute.default", "aten::permute_copy.default")
def permute(ctx, self, dims):
    r = _ndim(self)
    return _permute(ctx, self, [_wrap(d, r) for d in dims])


@lowering("aten::t.default", "aten::t_copy.default", "aten::numpy_T.default")
def t(ctx, self):
    return _permute(ctx, self, tuple(reversed(range(_ndim(self)))))


@lowering("aten::transpose.int", "aten::transpose_copy.int")
def transpose(ctx, self, dim0, dim1):
    r = _ndim(self)
    if r == 0:
        return self
    perm = list(range(r))
    a, b = _wrap(dim0, r), _wrap(dim1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(ctx, self, perm)


@lowering("aten::expand.default", "aten::expand_copy.default")
def expand(ctx, self, size, implicit=False):
    size = list(size)
    lead = len(size) - _ndim(self)
    shape = [s if s != -1 else self.shape[i - lead] for i, s in enumerate(size)]
    return _bcast(ctx, self, shape)


@lowering("aten::squeeze.default", "aten::squeeze.dim", "aten::squeeze.dims",
          "aten::squeeze_copy.default", "aten::squeeze_copy.dim", "aten::squeeze_copy.dims")
def squeeze(ctx, self, dim=None):
    r = _ndim(self)
    dims = set(range(r)) if dim is None else {_wrap(d, r) for d in ([dim] if isinstance(dim, int) else dim)}
    return _reshape(ctx, self, [s for i, s in enumerate(self.shape) if not (i in dims and s == 1)])


@lowering("aten::unsqueeze.default", "aten::unsqueeze_copy.default")
def unsqueeze(ctx, self, dim):
    d = _wrap(dim, _ndim(self) + 1)
    shape = list(self.shape)
    shape.insert(d, 1)
    return _reshape(ctx, self, shape)


def _slice_bounds(n: int, start, end, step) -> tuple[int, int]:
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    return min(max(start, 0), n), min(max(end, 0), n)


def _slice(ctx, x, d, start, end, step=1):
    if start == 0 and end == x.shape[d] and step == 1:
        return x
    r = _ndim(x)
    s, e, st = [0] * r, list(x.shape), [1] * r
    s[d], e[d], st[d] = start, end, step
    return ctx.op("slice", x, start=tuple(s), stop=tuple(e), step=tuple(st))


@lowering("aten::slice.Tensor", "aten::slice_copy.Tensor")
def slice_(ctx, self, dim=0, start=None, end=None, step=1):
    d = _wrap(dim, _ndim(self))
    a, b = _slice_bounds(self.shape[d], start, end, step)
    return _slice(ctx, self, d, a, b, step)


@lowering("aten::narrow.default", "aten::narrow_copy.default")
def narrow(ctx, self, dim, start, length):
    d = _wrap(dim, _ndim(self))
    start = start + self.shape[d] if start < 0 else start
    return _slice(ctx, self, d, start, start + length)


@lowering("aten::select.int", "aten::select_copy.int")
def select(ctx, self, dim, index):
    d = _wrap(dim, _ndim(self))
    i = index + self.shape[d] if index < 0 else index
    out = _slice(ctx, self, d, i, i + 1)
    return _reshape(ctx, out, self.shape[:d] + self.shape[d + 1:])


@lowering("aten::as_strided.default", "aten::as_strided_copy.default")
def as_strided(ctx, self, size, stride, storage_offset=None):
    """Elements ``offset + sum(i_d * stride_d)`` of the input's row-major contiguous elements."""
    off = storage_offset or 0
    idx = np.full(tuple(size), off, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape([-1 if i == d else 1 for i in range(len(size))])
    numel = math.prod(self.shape)
    if idx.size and (idx.min() < 0 or idx.max() >= numel):
        raise ctx.fail(f"as_strided reaches element {int(idx.max())} of an input with {numel} elements; "
                       "fornax lowers as_strided over the input's own contiguous elements")
    flat = _reshape(ctx, self, (numel,))
    out = ctx.op("index_select", flat, ctx.const(idx.reshape(-1), "strided_idx"), axis=0)
    return _reshape(ctx, out, tuple(size))


@lowering("aten::cat.default")
def cat(ctx, tensors, dim=0):
    dt = ctx.out()
    vals = [ctx.cast(t, dt) for t in tensors if t is not None and math.prod(t.shape) > 0]
    if len(vals) == 1:
        return vals[0]
    return _concatenation.concat(ctx, vals, _wrap(dim, _ndim(vals[0])))


@lowering("aten::stack.default")
def stack(ctx, tensors, dim=0):
    d = _wrap(dim, _ndim(tensors[0]) + 1)
    vals = [unsqueeze(ctx, ctx.cast(t, ctx.out()), d) for t in tensors]
    return vals[0] if len(vals) == 1 else _concatenation.concat(ctx, vals, d)


def _split(ctx, x, sizes, d):
    out, start = [], 0
    for s in sizes:
        out.append(_slice(ctx, x, d, start, start + s) if s > 0 else None)
        start += s
    return out


@lowering("aten::split_with_sizes.default", "aten::split_with_sizes_copy.default")
def split_with_sizes(ctx, self, split_sizes, dim=0):
    return _split(ctx, self, list(split_sizes), _wrap(dim, _ndim(self)))


@lowering("aten::split.sizes")
def split_sizes(ctx, self, split_size, dim=0):
    return split_with_sizes(ctx, self, split_size, dim)


@lowering("aten::split.Tensor", "aten::split_copy.Tensor")
def split(ctx, self, split_size, dim=0):
    d = _wrap(dim, _ndim(self))
    n = self.shape[d]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else [n]
    return _split(ctx, self, sizes, d)


@lowering("aten::unbind.int", "aten::unbind_copy.int")
def unbind(ctx, self, dim=0):
    d = _wrap(dim, _ndim(self))
    return [select(ctx, self, d, i) for i in range(self.shape[d])]


@lowering("aten::constant_pad_nd.default")
def constant_pad_nd(ctx, self, pad, value=0):
    """``pad`` pairs run from the last dim backwards; negative amounts crop."""
    x = self
    r = _ndim(x)
    pairs = [(0, 0)] * r
    for i in range(len(pad) // 2):
        d = r - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0 or hi < 0:
            x = _slice(ctx, x, d, max(0, -lo), x.shape[d] - max(0, -hi))
        pairs[d] = (max(0, lo), max(0, hi))
    if all(p == (0, 0) for p in pairs):
        return x
    v = float(value) if x.dtype.is_float else int(value)
    return ctx.op("pad", x, pads=tuple(pairs), value=v)


@lowering("aten::flip.default")
def flip(ctx, self, dims):
    x = self
    for d in {_wrap(d, _ndim(x)) for d in dims}:
        n = x.shape[d]
        if n > 1:
            x = ctx.op("index_select", x, ctx.const(np.arange(n - 1, -1, -1, dtype=np.int64), "flip"), axis=d)
    return x


@lowering("aten::roll.default")
def roll(ctx, self, shifts, dims=()):
    x = self
    if not dims:
        flat = _reshape(ctx, x, (math.prod(x.shape),))
        return _reshape(ctx, roll(ctx, flat, shifts, [0]), x.shape)
    for s, d in zip(shifts, dims):
        d = _wrap(d, _ndim(x))
        n = x.shape[d]
        s %= n
        if s:
            x = ctx.op("concat", _slice(ctx, x, d, n - s, n), _slice(ctx, x, d, 0, n - s), axis=d)
    return x


@lowering("aten::repeat.default")
def repeat(ctx, self, repeats):
    reps = list(repeats)
    shape = [1] * (len(reps) - _ndim(self)) + list(self.shape)
    inter, big = [], []
    for r, s in zip(reps, shape):
        inter += [1, s]
        big += [r, s]
    x = _bcast(ctx, _reshape(ctx, self, inter), big)
    return _reshape(ctx, x, [r * s for r, s in zip(reps, shape)])


def _tri(ctx, x, diagonal, lower):
    r, c = x.shape[-2], x.shape[-1]
    rows, cols = np.arange(r)[:, None], np.arange(c)[None, :]
    mask = (cols - rows <= diagonal) if lower else (cols - rows >= diagonal)
    return ctx.op("where", ctx.const(mask, "tri"), x, ctx.scalar(0, x.dtype))


@lowering("aten::tril.default")
def tril(ctx, self, diagonal=0):
    return _tri(ctx, self, diagonal, True)


@lowering("aten::triu.default")
def triu(ctx, self, diagonal=0):
    return _tri(ctx, self, diagonal, False)


def _slice_scatter(ctx, x, src, d, start, end, step):
    src = ctx.cast(src, x.dtype)
    n = x.shape[d]
    if step == 1:
        parts = [p for p in (_slice(ctx, x, d, 0, start) if start > 0 else None, src,
                             _slice(ctx, x, d, end, n) if end < n else None) if p is not None]
        return parts[0] if len(parts) == 1 else ctx.op("concat", *parts, axis=d)
    idx = np.arange(start, end, step, dtype=np.int64).reshape([-1 if i == d else 1 for i in range(_ndim(x))])
    idx = _bcast(ctx, ctx.const(idx, "slice_idx"), src.shape)
    return ctx.op("scatter", x, idx, src, axis=d, mode="set")


@lowering("aten::slice_scatter.default")
def slice_scatter(ctx, self, src, dim=0, start=None, end=None, step=1):
    d = _wrap(dim, _ndim(self))
    a, b = _slice_bounds(self.shape[d], start, end, step)
    return _slice_scatter(ctx, self, src, d, a, b, step)


@lowering("aten::select_scatter.default")
def select_scatter(ctx, self, src, dim, index):
    d = _wrap(dim, _ndim(self))
    i = index + self.shape[d] if index < 0 else index
    return _slice_scatter(ctx, self, unsqueeze(ctx, src, d), d, i, i + 1, 1)


@lowering("aten::slice_backward.default")
def slice_backward(ctx, grad_output, input_sizes, dim, start, end, step):
    d = _wrap(dim, len(input_sizes))
    a, b = _slice_bounds(input_sizes[d], start, end, step)
    return _slice_scatter(ctx, _full(ctx, tuple(input_sizes), 0, grad_output.dtype), grad_output, d, a, b, step)


@lowering("aten::select_backward.default")
def select_backward(ctx, grad_output, input_sizes, dim, index):
    d = _wrap(dim, len(input_sizes))
    i = index + input_sizes[d] if index < 0 else index
    return _slice_scatter(ctx, _full(ctx, tuple(input_sizes), 0, grad_output.dtype),
                          unsqueeze(ctx, grad_output, d), d, i, i + 1, 1)


# ---- matrix products -----------------------------------------------------------------------------------
def _check_float(ctx, *vals):
    for v in vals:
        if not v.dtype.is_float:
            raise ctx.fail(f"matrix products of {v.dtype} tensors are not lowered (the graph's matmul is "
                           "floating-point only)")


@lowering("aten::mm.default", "aten::bmm.default")
def mm(ctx, self, mat2):
    _check_float(ctx, self, mat2)
    return ctx.op("matmul", self, mat2)


@lowering("aten::mv.default")
def mv(ctx, self, vec):
    _check_float(ctx, self, vec)
    return _reshape(ctx, ctx.op("matmul", self, _reshape(ctx, vec, (vec.shape[0], 1))), (self.shape[0],))


@lowering("aten::vdot.default")
def vdot(ctx, self, other):
    return dot(ctx, self, other)


@lowering("aten::dot.default")
def dot(ctx, self, tensor):
    _check_float(ctx, self, tensor)
    return ctx.op("dot_general", self, tensor, lhs_contracting=(0,), rhs_contracting=(0,))


@lowering("aten::addmm.default")
def addmm(ctx, self, mat1=None, mat2=None, beta=1, alpha=1, batch1=None, batch2=None, vec=None):
    """``beta*self + alpha*(mat1 @ mat2)``; ``self`` is ignored (NaNs too) when beta is 0.
    Half types are computed in float32 and rounded once, as a BLAS GEMM with a float32
    accumulator and epilogue does (cuBLAS/rocBLAS ``gemmEx`` with a float32 compute type)."""
    if batch1 is not None:
        mat1, mat2 = batch1, batch2
    out = mat1.dtype
    acc = _opmath(out) if out.is_float else out
    if acc != out and (alpha != 1 or beta != 0):
        mat1, mat2, vec = (None if v is None else ctx.cast(v, acc) for v in (mat1, mat2, vec))
    p = mv(ctx, mat1, vec) if vec is not None else mm(ctx, mat1, mat2)
    dt = p.dtype
    if alpha != 1:
        p = ctx.op("mul", p, ctx.scalar(alpha, dt))
    if beta != 0:
        b = ctx.cast(self, dt)
        if beta != 1:
            b = ctx.op("mul", b, ctx.scalar(beta, dt))
        p = ctx.op("add", b, p)
    return ctx.cast(p, out)


@lowering("aten::addmv.default")
def addmv(ctx, self, mat, vec, beta=1, alpha=1):
    return addmm(ctx, self, mat, None, beta, alpha, vec=vec)


@lowering("aten::baddbmm.default")
def baddbmm(ctx, self, batch1, batch2, beta=1, alpha=1):
    return addmm(ctx, self, batch1, batch2, beta, alpha)



# ---- convolution ----------------------------------------------------------------------------------------
def _bias_add(ctx, y, bias):
    if bias is None:
        return y
    b = _reshape(ctx, ctx.cast(bias, y.dtype), (1, bias.shape[0]) + (1,) * (_ndim(y) - 2))
    return ctx.op("add", y, b)


@lowering("aten::convolution.default", "aten::convolution_overrideable.default", "aten::_convolution.default")
def convolution(ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                benchmark=None, deterministic=None, cudnn_enabled=None, allow_tf32=None):
    _check_float(ctx, input, weight)
    out = input.dtype
    if _opmath(out) != out:      # half types: accumulate and add the bias in float32, round once
        input, weight = ctx.cast(input, _opmath(out)), ctx.cast(weight, _opmath(out))
    nd = _ndim(input) - 2
    st, pad, dil = _nlist(stride, nd), _nlist(padding, nd), _nlist(dilation, nd)
    if transposed:
        y = ctx.op("conv_transpose", input, weight, stride=st, padding=pad, dilation=dil, groups=groups,
                   output_padding=_nlist(output_padding, nd))
    else:
        y = ctx.op("convolution", input, weight, stride=st, padding=pad, dilation=dil, groups=groups)
    return ctx.cast(_bias_add(ctx, y, bias), out)


def _nlist(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _conv_input_grad(ctx, gy, w, in_spatial, st, pad, dil, groups):
    """The input gradient of a convolution: a transposed convolution sized back to the input."""
    k = w.shape[2:]
    full = [(gy.shape[2 + d] - 1) * st[d] - 2 * pad[d] + dil[d] * (k[d] - 1) + 1 for d in range(len(k))]
    extra = [in_spatial[d] - full[d] for d in range(len(k))]
    if any(e < 0 or e >= max(st[d], dil[d]) for d, e in enumerate(extra)):
        raise ctx.fail(f"no transposed convolution gives back the input size {tuple(in_spatial)}")
    return ctx.op("conv_transpose", gy, w, stride=st, padding=pad, dilation=dil, groups=groups,
                  output_padding=tuple(extra))


def _conv_weight_grad(ctx, x, gy, kernel, st, pad, dil, groups):
    """dL/dw of ``y = conv(x, w)``: a grouped convolution of the input (channels as batch) with
    the output gradient as the weight, stride and dilation swapped, cropped to the kernel."""
    n, c = x.shape[:2]
    cg = c // groups
    sp = x.shape[2:]
    nd = len(sp)
    rest = tuple(range(3, 3 + nd))
    xr = _reshape(ctx, x, (n, groups, cg) + tuple(sp))
    xr = _reshape(ctx, _permute(ctx, xr, (2, 1, 0) + rest), (cg, groups * n) + tuple(sp))
    wr = _permute(ctx, gy, (1, 0) + tuple(range(2, 2 + nd)))                 # (O, N, *out)
    r = ctx.op("convolution", xr, wr, stride=tuple(dil), padding=tuple(pad), dilation=tuple(st), groups=groups)
    if tuple(r.shape[2:]) != tuple(kernel):
        r = ctx.op("slice", r, start=(0,) * (2 + nd), stop=tuple(r.shape[:2]) + tuple(kernel))
    return _permute(ctx, r, (1, 0) + tuple(range(2, 2 + nd)))               # (O, C/G, *k)


@lowering("aten::convolution_backward.default", "aten::convolution_backward_overrideable.default")
def convolution_backward(ctx, grad_output, input, weight, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask, bias_sizes=None):
    _check_float(ctx, grad_output, input, weight)
    nd = _ndim(input) - 2
    st, pad, dil = _nlist(stride, nd), _nlist(padding, nd), _nlist(dilation, nd)
    gi = gw = gb = None
    if transposed:      # y = conv_transpose(x, w) is the adjoint of conv(., w): swap the roles
        if output_mask[0]:
            gi = ctx.op("convolution", grad_output, weight, stride=st, padding=pad, dilation=dil, groups=groups)
        if output_mask[1]:
            gw = _conv_weight_grad(ctx, grad_output, input, weight.shape[2:], st, pad, dil, groups)
    else:
        if output_mask[0]:
            gi = _conv_input_grad(ctx, grad_output, weight, input.shape[2:], st, pad, dil, groups)
        if output_mask[1]:
            gw = _conv_weight_grad(ctx, input, grad_output, weight.shape[2:], st, pad, dil, groups)
    if output_mask[2]:
        g = ctx.cast(grad_output, _opmath(grad_output.dtype))
        gb = _sum(ctx, g, [0] + list(range(2, _ndim(g))), False)
    return gi, gw, gb


# ---- norms ------------------------------------------------------------------------------------------------
def _norm_stats(ctx, x, dims, eps):
    """(x - mean, mean, rstd) over ``dims`` (biased variance), all keepdim."""
    n = _count(x, dims)
    dt = x.dtype
    m = _div(ctx, _sum(ctx, x, dims), n, dt)
    d = ctx.op("sub", x, m)
    v = _div(ctx, _sum(ctx, ctx.op("mul", d, d), dims), n, dt)
    return d, m, ctx.op("rsqrt", ctx.op("add", v, ctx.scalar(eps, dt)))


@lowering("aten::native_layer_norm.default")
def native_layer_norm(ctx, input, normalized_shape, weight, bias, eps):
    dt = _opmath(input.dtype)
    x = ctx.cast(input, dt)
    k = len(normalized_shape)
    dims = list(range(_ndim(x) - k, _ndim(x)))
    d, m, rstd = _norm_stats(ctx, x, dims, eps)
    if k == 1:      # the graph's layer_norm (compiled natively or routed to the library)
        w = ctx.cast(weight, dt) if weight is not None else _full(ctx, x.shape[-1:], 1, dt)
        b = ctx.cast(bias, dt) if bias is not None else _full(ctx, x.shape[-1:], 0, dt)
        out = ctx.op("layer_norm", x, w, b, eps=float(eps))
    else:
        out = ctx.op("mul", d, rstd)
        if weight is not None:
            out = ctx.op("mul", out, ctx.cast(weight, dt))
        if bias is not None:
            out = ctx.op("add", out, ctx.cast(bias, dt))
    return out, m, rstd


def _norm_input_grad(ctx, gxhat, xhat, rstd, dims):
    """dL/dx of xhat = (x - mean) * rstd over ``dims`` given dL/dxhat:
    rstd/n * (n*g - sum(g) - xhat*sum(g*xhat))."""
    dt = gxhat.dtype
    n = _count(gxhat, dims)
    a = ctx.op("sub", ctx.op("mul", gxhat, ctx.scalar(n, dt)), _sum(ctx, gxhat, dims))
    a = ctx.op("sub", a, ctx.op("mul", xhat, _sum(ctx, ctx.op("mul", gxhat, xhat), dims)))
    return ctx.op("mul", a, ctx.op("div", rstd, ctx.scalar(n, dt)))


@lowering("aten::native_layer_norm_backward.default")
def native_layer_norm_backward(ctx, grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    dt = _opmath(input.dtype)
    x, g = ctx.cast(input, dt), ctx.cast(grad_out, dt)
    mean, rstd = ctx.cast(mean, dt), ctx.cast(rstd, dt)
    k = len(normalized_shape)
    r = _ndim(x)
    dims, batch = list(range(r - k, r)), list(range(r - k))
    xhat = ctx.op("mul", ctx.op("sub", x, mean), rstd)
    gi = gw = gb = None
    if output_mask[0]:
        gx = ctx.op("mul", g, ctx.cast(weight, dt)) if weight is not None else g
        gi = _norm_input_grad(ctx, gx, xhat, rstd, dims)
    if output_mask[1] and weight is not None:
        gw = _sum(ctx, ctx.op("mul", g, xhat), batch, False)
    if output_mask[2] and bias is not None:
        gb = _sum(ctx, g, batch, False)
    return gi, gw, gb


@lowering("aten::_fused_rms_norm.default")
def _fused_rms_norm(ctx, input, normalized_shape, weight, eps=None):
    dt = _opmath(input.dtype)
    x = ctx.cast(input, dt)
    eps = float(torch.finfo(DTYPE_TO_TORCH[input.dtype]).eps) if eps is None else float(eps)
    k = len(normalized_shape)
    dims = list(range(_ndim(x) - k, _ndim(x)))
    ms = _div(ctx, _sum(ctx, ctx.op("mul", x, x), dims), _count(x, dims), dt)
    rstd = ctx.op("rsqrt", ctx.op("add", ms, ctx.scalar(eps, dt)))
    if k == 1 and weight is not None:
        out = ctx.op("rms_norm", x, ctx.cast(weight, dt), eps=eps)
    else:
        out = ctx.op("mul", x, rstd)
        if weight is not None:
            out = ctx.op("mul", out, ctx.cast(weight, dt))
    return out, rstd


def _chan(ctx, v, rank, dt):
    """A per-channel (C,) vector shaped (1, C, 1, ...) for an NC... tensor."""
    return _reshape(ctx, ctx.cast(v, dt), (1, v.shape[0]) + (1,) * (rank - 2))


def _bn_apply(ctx, x, mean, rstd, weight, bias):
    r, dt = _ndim(x), x.dtype
    out = ctx.op("mul", ctx.op("sub", x, mean), rstd)
    if weight is not None:
        out = ctx.op("mul", out, _chan(ctx, weight, r, dt))
    if bias is not None:
        out = ctx.op("add", out, _chan(ctx, bias, r, dt))
    return out


def _batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps,
                functional=False):
    dt = _opmath(input.dtype)
    x = ctx.cast(input, dt)
    r = _ndim(x)
    c = x.shape[1]
    dims = [0] + list(range(2, r))
    if not training:
        if running_mean is None or running_var is None:
            raise ctx.fail("batch norm in eval mode needs running statistics")
        m = _chan(ctx, running_mean, r, dt)
        rstd = ctx.op("rsqrt", ctx.op("add", _chan(ctx, running_var, r, dt), ctx.scalar(eps, dt)))
        out = _bn_apply(ctx, x, m, rstd, weight, bias)
        # CPU returns empty save_mean/save_invstd in eval; other devices (and meta) return the
        # running mean and its inverse std: give those, lower() drops them where torch says empty
        res = [out, _reshape(ctx, m, (c,)), _reshape(ctx, rstd, (c,))]
        if functional:
            res += [running_mean, running_var]
        return res
    if running_mean is not None and not functional:
        raise ctx.fail("batch norm in training updates running_mean/running_var in place; lower the "
                       "functional form (_native_batch_norm_legit_functional) instead")
    d, m, rstd = _norm_stats(ctx, x, dims, eps)
    out = _bn_apply(ctx, x, m, rstd, weight, bias)
    res = [out, _reshape(ctx, m, (c,)), _reshape(ctx, rstd, (c,))]
    if functional:
        n = _count(x, dims)
        var = _div(ctx, _sum(ctx, ctx.op("mul", d, d), dims, False), n, dt)
        mom = functools.partial(ctx.scalar, dtype=dt)
        rm, rv = ctx.cast(running_mean, dt), ctx.cast(running_var, dt)
        new_m = ctx.op("add", ctx.op("mul", rm, mom(1 - momentum)), ctx.op("mul", res[1], mom(momentum)))
        unbiased = ctx.op("mul", var, mom(n / max(n - 1, 1)))
        new_v = ctx.op("add", ctx.op("mul", rv, mom(1 - momentum)), ctx.op("mul", unbiased, mom(momentum)))
        res += [new_m, new_v]
    return res


@lowering("aten::native_batch_norm.default", "aten::_native_batch_norm_legit.default")
def native_batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering("aten::_native_batch_norm_legit.no_stats")
def _native_batch_norm_legit_no_stats(ctx, input, weight, bias, training, momentum, eps):
    return _batch_norm(ctx, input, weight, bias, None, None, training, momentum, eps)


@lowering("aten::_native_batch_norm_legit_no_training.default")
def _native_batch_norm_legit_no_training(ctx, input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, False, momentum, eps)


@lowering("aten::_native_batch_norm_legit_functional.default")
def _native_batch_norm_legit_functional(ctx, input, weight, bias, running_mean, running_var, training,
                                        momentum, eps):
    return _batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps,
                       functional=True)


@lowering("aten::native_batch_norm_backward.default")
def native_batch_norm_backward(ctx, grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    dt = _opmath(input.dtype)
    x, g = ctx.cast(input, dt), ctx.cast(grad_out, dt)
    r = _ndim(x)
    dims = [0] + list(range(2, r))
    if train:
        m, rstd = _chan(ctx, save_mean, r, dt), _chan(ctx, save_invstd, r, dt)
    else:
        m = _chan(ctx, running_mean, r, dt)
        rstd = ctx.op("rsqrt", ctx.op("add", _chan(ctx, running_var, r, dt), ctx.scalar(eps, dt)))
    xhat = ctx.op("mul", ctx.op("sub", x, m), rstd)
    gi = gw = gb = None
    if output_mask[0]:
        gx = ctx.op("mul", g, _chan(ctx, weight, r, dt)) if weight is not None else g
        gi = _norm_input_grad(ctx, gx, xhat, rstd, dims) if train else ctx.op("mul", gx, rstd)
    if output_mask[1]:
        gw = _sum(ctx, ctx.op("mul", g, xhat), dims, False)
    if output_mask[2]:
        gb = _sum(ctx, g, dims, False)
    return gi, gw, gb


@lowering("aten::native_group_norm.default")
def native_group_norm(ctx, input, weight, bias, N, C, HxW, group, eps):
    dt = _opmath(input.dtype)
    x = _reshape(ctx, ctx.cast(input, dt), (N, group, C // group * HxW))
    d, m, rstd = _norm_stats(ctx, x, [2], eps)
    out = _reshape(ctx, ctx.op("mul", d, rstd), (N, C, HxW))
    if weight is not None:
        out = ctx.op("mul", out, _reshape(ctx, ctx.cast(weight, dt), (1, C, 1)))
    if bias is not None:
        out = ctx.op("add", out, _reshape(ctx, ctx.cast(bias, dt), (1, C, 1)))
    return _reshape(ctx, out, input.shape), _reshape(ctx, m, (N, group)), _reshape(ctx, rstd, (N, group))


@lowering("aten::native_group_norm_backward.default")
def native_group_norm_backward(ctx, grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    dt = _opmath(input.dtype)
    x = _reshape(ctx, ctx.cast(input, dt), (N, C, HxW))
    g = _reshape(ctx, ctx.cast(grad_out, dt), (N, C, HxW))
    gm = (N, group, C // group * HxW)
    m3, r3 = _reshape(ctx, ctx.cast(mean, dt), (N, group, 1)), _reshape(ctx, ctx.cast(rstd, dt), (N, group, 1))
    xhat = _reshape(ctx, ctx.op("mul", ctx.op("sub", _reshape(ctx, x, gm), m3), r3), (N, C, HxW))
    gi = gw = gb = None
    if output_mask[0]:
        gx = ctx.op("mul", g, _reshape(ctx, ctx.cast(weight, dt), (1, C, 1))) if weight is not None else g
        gi = _norm_input_grad(ctx, _reshape(ctx, gx, gm), _reshape(ctx, xhat, gm), r3, [2])
        gi = _reshape(ctx, gi, input.shape)
    if output_mask[1]:
        gw = _sum(ctx, ctx.op("mul", g, xhat), [0, 2], False)
    if output_mask[2]:
        gb = _sum(ctx, g, [0, 2], False)
    return gi, gw, gb


# ---- dropout ------------------------------------------------------------------------------------------------
@lowering("aten::native_dropout.default")
def native_dropout(ctx, input, p, train):
    if train is False or p == 0:
        return input, _full(ctx, input.shape, True, DType.BOOL)
    if p == 1:
        return _zeros_like(ctx, input), _full(ctx, input.shape, False, DType.BOOL)
    raise ctx.fail(f"dropout with p={p} in training draws random numbers; fornax lowers it only for "
                   "p == 0, p == 1 or eval (the framework's generator owns RNG)")


@lowering("aten::native_dropout_backward.default")
def native_dropout_backward(ctx, grad_output, mask, scale):
    dt = _compute(ctx)
    g = ctx.op("mul", ctx.cast(grad_output, dt), ctx.cast(mask, dt))
    return ctx.op("mul", g, ctx.scalar(scale, dt))


# ---- indexing ------------------------------------------------------------------------------------------------
def _index(ctx, v: Value) -> Value:
    if v.dtype not in (DType.INT64, DType.INT32):
        raise ctx.fail(f"indices must be int64 or int32, got {v.dtype}"
                       + (" (a boolean mask gives a data-dependent shape)" if v.dtype is DType.BOOL else ""))
    return ctx.cast(v, DType.INT64)


def _along(ctx, idx: Value, d: int, shape) -> Value:
    """A 1-D index laid along dim ``d`` and broadcast to ``shape``."""
    return _bcast(ctx, _reshape(ctx, idx, [-1 if i == d else 1 for i in range(len(shape))]), shape)


def _scatter_add_axis(ctx, upd: Value, d: int, idx: Value, n: int) -> Value:
    """A tensor like ``upd`` but ``n`` long in dim ``d``, holding the sums of ``upd`` slices
    at positions ``idx`` (1-D, one per slice of ``upd`` along ``d``)."""
    shape = list(upd.shape)
    shape[d] = n
    return ctx.op("scatter", _full(ctx, shape, 0, upd.dtype), _along(ctx, idx, d, upd.shape), upd, axis=d,
                  mode="add")


@lowering("aten::index_select.default")
def index_select(ctx, self, dim, index):
    idx = _reshape(ctx, _index(ctx, index), (max(1, math.prod(index.shape)),))
    if _ndim(self) == 0:
        return _reshape(ctx, self, ctx.outs[0].shape)
    return _reshape(ctx, ctx.op("index_select", self, idx, axis=_wrap(dim, _ndim(self))), ctx.outs[0].shape)


@lowering("aten::gather.default")
def gather(ctx, self, dim, index, sparse_grad=False):
    if _ndim(self) == 0:
        return _reshape(ctx, self, index.shape)
    return ctx.op("gather", self, _index(ctx, index), axis=_wrap(dim, _ndim(self)))


def _scatter_src(ctx, index, src):
    """``src`` cut to ``index``'s shape (torch uses only that part)."""
    if tuple(src.shape) != tuple(index.shape):
        src = ctx.op("slice", src, start=(0,) * _ndim(src), stop=tuple(index.shape))
    return src


@lowering("aten::scatter.src", "aten::scatter.value", "aten::scatter.reduce", "aten::scatter.value_reduce")
def scatter(ctx, self, dim, index, src=None, value=None, reduce=None):
    if _ndim(self) == 0:                # a 0-d tensor scatters as a 1-element vector
        one = (lambda v: _reshape(ctx, v, (1,)))
        src = one(src) if isinstance(src, Value) else src
        return _reshape(ctx, scatter(ctx, one(self), 0, one(index), src, value, reduce), ())
    upd = _scatter_src(ctx, index, ctx.cast(src, self.dtype)) if src is not None else \
        _full(ctx, index.shape, value, self.dtype)
    d = _wrap(dim, _ndim(self))
    if reduce == "multiply":
        return _scatter_dense(ctx, self, d, _index(ctx, index), upd, "prod", True)
    if reduce not in (None, "add"):
        raise ctx.fail(f"scatter with reduce={reduce!r} is not lowered (torch takes 'add' or 'multiply')")
    return ctx.op("scatter", self, _index(ctx, index), upd, axis=d, mode="add" if reduce == "add" else "set")


@lowering("aten::scatter_add.default")
def scatter_add(ctx, self, dim, index, src):
    return scatter(ctx, self, dim, index, src, reduce="add")


#: (graph op combining two values, its identity) of the scatter reductions done densely
_DENSE_REDUCE = {"prod": ("mul", 1), "amax": ("maximum", -math.inf), "amin": ("minimum", math.inf)}
#: the most elements of the one-hot comparison a dense scatter builds
DENSE_SCATTER_LIMIT = 1 << 22


def _scatter_dense(ctx, self: Value, d: int, idx: Value, upd: Value, reduce: str, include_self: bool) -> Value:
    """A scatter reduction the graph's scatter (add/set only) has no mode for, done densely:
    every update is compared with every position of axis ``d`` (a one-hot of ``idx``), the
    updates are combined per position in log2 rounds, and the result is combined with
    ``self`` (positions nothing scatters to keep ``self``)."""
    n, ishape = self.shape[d], tuple(idx.shape)
    if math.prod(ishape) * n > DENSE_SCATTER_LIMIT:
        raise ctx.fail(f"scatter reduce={reduce!r} compares {math.prod(ishape)} updates with {n} positions; "
                       f"fornax lowers at most {DENSE_SCATTER_LIMIT} pairs")
    if self.dtype is DType.BOOL:
        raise ctx.fail(f"scatter reduce={reduce!r} of a bool tensor is not lowered")
    name, unit = _DENSE_REDUCE[reduce]
    if not self.dtype.is_float and not math.isfinite(unit):
        info = np.iinfo(self.dtype.numpy)
        unit = info.min if unit < 0 else info.max
    r = len(ishape)
    pos = _bcast(ctx, _reshape(ctx, ctx.const(np.arange(n, dtype=np.int64), "pos"), (1,) * r + (n,)), ishape + (n,))
    hit = ctx.op("eq", _bcast(ctx, _reshape(ctx, idx, ishape + (1,)), ishape + (n,)), pos)
    vals = ctx.op("where", hit, _bcast(ctx, _reshape(ctx, upd, ishape + (1,)), ishape + (n,)),
                  ctx.scalar(unit, self.dtype))
    any_hit = ctx.cast(hit, DType.INT64)
    vals = _halving(ctx, vals, d, name, unit)                 # (.., 1 at d, .., n)
    any_hit = _halving(ctx, any_hit, d, "maximum", 0)
    rest = ishape[:d] + ishape[d + 1:]
    perm = list(range(d)) + [r - 1] + list(range(d, r - 1))  # the positions axis back at d

    def place(v, fill):
        v = _permute(ctx, _reshape(ctx, v, rest + (n,)), perm)
        pads = tuple((0, self.shape[i] - v.shape[i]) for i in range(r))
        return ctx.op("pad", v, pads=pads, value=fill) if any(p for _, p in pads) else v
    vals, any_hit = place(vals, unit), ctx.op("ne", place(any_hit, 0), ctx.scalar(0, DType.INT64))
    if include_self:
        return ctx.op(name, self, vals)
    return ctx.op("where", any_hit, vals, self)


@lowering("aten::scatter_reduce.two")
def scatter_reduce(ctx, self, dim, index, src, reduce, include_self=True):
    if _ndim(self) == 0:
        one = (lambda v: _reshape(ctx, v, (1,)))
        return _reshape(ctx, scatter_reduce(ctx, one(self), 0, one(index), one(src), reduce, include_self), ())
    d = _wrap(dim, _ndim(self))
    idx = _index(ctx, index)
    upd = _scatter_src(ctx, index, ctx.cast(src, self.dtype))
    if reduce in _DENSE_REDUCE:
        return _scatter_dense(ctx, self, d, idx, upd, reduce, include_self)
    if reduce == "mean":
        if not self.dtype.is_float:
            raise ctx.fail("scatter_reduce mean of integers (floor division) is not lowered")
        total = scatter_reduce(ctx, self, d, index, src, "sum", include_self)
        ones = _full(ctx, index.shape, 1, self.dtype)
        count = ctx.op("scatter", _full(ctx, self.shape, 1 if include_self else 0, self.dtype), idx, ones,
                       axis=d, mode="add")
        count = ctx.op("where", ctx.op("eq", count, ctx.scalar(0, self.dtype)), ctx.scalar(1, self.dtype), count)
        return ctx.op("div", total, count)
    if reduce != "sum":
        raise ctx.fail(f"scatter_reduce with reduce={reduce!r} is not lowered")
    base = self
    if not include_self:
        hit = ctx.op("scatter", _full(ctx, self.shape, False, DType.BOOL), idx,
                     _full(ctx, index.shape, True, DType.BOOL), axis=d, mode="set")
        base = ctx.op("where", hit, ctx.scalar(0, self.dtype), self)
    return ctx.op("scatter", base, idx, upd, axis=d, mode="add")


@lowering("aten::index_add.default")
def index_add(ctx, self, dim, index, source, alpha=1):
    d = _wrap(dim, _ndim(self))
    upd = ctx.cast(source, self.dtype)
    if alpha != 1:
        upd = ctx.op("mul", upd, ctx.scalar(alpha, self.dtype))
    lin = _reshape(ctx, _index(ctx, index), (-1,))
    if _ndim(self) > 0 and _scatter.applies(lin, self):     # a long index list: sort, don't walk
        a, k, z = math.prod(self.shape[:d]), self.shape[d], math.prod(self.shape[d + 1:])
        out = _scatter.rows(ctx, _reshape(ctx, self, (a, k, z)), lin,
                            _reshape(ctx, upd, (a, lin.shape[0], z)), True)
        return _reshape(ctx, out, self.shape)
    idx = _along(ctx, lin, d, upd.shape)
    return ctx.op("scatter", self, idx, upd, axis=d, mode="add")


def _advanced(ctx, x: Value, indices):
    """Advanced indexing laid out as one axis: x viewed as (A, K, Z) where K merges the
    indexed dims (moved to the front when they are not adjacent, as torch does), the linear
    index into K (1-D), and the shapes (before, index-broadcast, after, permuted x)."""
    r = _ndim(x)
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    if not pos:
        raise ctx.fail("indexing with no index tensors")
    idxs = [_index(ctx, indices[i]) for i in pos]
    bshape = tuple(np.broadcast_shapes(*(tuple(v.shape) for v in idxs)))
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    perm = list(range(r)) if adjacent else pos + [d for d in range(r) if d not in pos]
    first = pos[0] if adjacent else 0
    xp = _permute(ctx, x, perm)
    kdims = [x.shape[d] for d in pos]
    before, after = xp.shape[:first], xp.shape[first + len(pos):]
    lin = None
    for j, (v, n) in enumerate(zip(idxs, kdims)):
        v = _bcast(ctx, v, bshape)
        v = ctx.op("where", ctx.op("lt", v, ctx.scalar(0, DType.INT64)), ctx.op("add", v, ctx.scalar(n, DType.INT64)), v)
        stride = math.prod(kdims[j + 1:])
        if stride != 1:
            v = ctx.op("mul", v, ctx.scalar(stride, DType.INT64))
        lin = v if lin is None else ctx.op("add", lin, v)
    lin = _reshape(ctx, lin, (max(1, math.prod(bshape)),))
    xr = _reshape(ctx, xp, (math.prod(before), math.prod(kdims), math.prod(after)))
    return xr, lin, tuple(before), bshape, tuple(after), xp, perm


@lowering("aten::index.Tensor", "aten::_unsafe_index.Tensor", "aten::index.Tensor_hacked_twin",
          "aten::_unsafe_index.Tensor_hacked_twin")
def index(ctx, self, indices):
    xr, lin, before, bshape, after, _, _ = _advanced(ctx, self, indices)
    return _reshape(ctx, ctx.op("index_select", xr, lin, axis=1), before + bshape + after)


@lowering("aten::index_put.default", "aten::_unsafe_index_put.default", "aten::index_put.hacked_twin",
          "aten::_index_put_impl.default")
def index_put(ctx, self, indices, values, accumulate=False, unsafe=False):
    if accumulate and self.dtype is DType.BOOL:
        raise ctx.fail("accumulating index_put into a bool tensor is not lowered")
    if any(ix is not None and ix.dtype is DType.BOOL for ix in indices):
        return _masked_put(ctx, self, indices, values, accumulate)
    xr, lin, before, bshape, after, xp, perm = _advanced(ctx, self, indices)
    vals = _bcast(ctx, ctx.cast(values, self.dtype), before + bshape + after)
    vals = _reshape(ctx, vals, (xr.shape[0], lin.shape[0], xr.shape[2]))
    if _scatter.applies(lin, xr):          # a long update list: sort it instead of walking it
        out = _scatter.rows(ctx, xr, lin, vals, accumulate)
    else:
        out = ctx.op("scatter", xr, _along(ctx, lin, 1, vals.shape), vals, axis=1, mode="add" if accumulate else "set")
    inv = [perm.index(d) for d in range(len(perm))]
    return _permute(ctx, _reshape(ctx, out, xp.shape), inv)


def _masked_put(ctx, self, indices, values, accumulate):
    """``self[mask] = values`` (or ``+=``) with one boolean mask: a ``where`` over the mask
    when ``values`` is the same for every selected element (size 1 along the selected
    axis), which needs no count of the selected elements."""
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    mask = indices[pos[0]]
    k, m = pos[0], _ndim(indices[pos[0]])
    if len(pos) != 1 or tuple(mask.shape) != tuple(self.shape[k:k + m]):
        raise ctx.fail("a boolean mask index mixed with other indices gives a data-dependent shape")
    before, after = tuple(self.shape[:k]), tuple(self.shape[k + m:])
    vshape = tuple(values.shape)
    if len(vshape) > len(after) + 1 + len(before) or \
            (len(vshape) > len(after) and vshape[len(vshape) - len(after) - 1] != 1):
        raise ctx.fail("values that differ per selected element give a data-dependent shape")
    lead = vshape[:max(0, len(vshape) - len(after) - 1)]
    vals = _reshape(ctx, ctx.cast(values, self.dtype), lead + (1,) * m + vshape[len(vshape) - min(len(vshape),
                                                                                                len(after)):])
    vals = _bcast(ctx, vals, self.shape)
    cond = _bcast(ctx, _reshape(ctx, mask, (1,) * k + tuple(mask.shape) + (1,) * len(after)), self.shape)
    if accumulate:
        return ctx.op("add", self, ctx.op("where", cond, vals, _zeros_like(ctx, vals)))
    return ctx.op("where", cond, vals, self)


@lowering("aten::embedding.default")
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    idx = _reshape(ctx, _index(ctx, indices), (max(1, math.prod(indices.shape)),))
    rows = ctx.op("index_select", weight, idx, axis=0)
    return _reshape(ctx, rows, tuple(indices.shape) + tuple(weight.shape[1:]))


@lowering("aten::embedding_dense_backward.default")
def embedding_dense_backward(ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    dt = _opmath(grad_output.dtype)
    m = max(1, math.prod(indices.shape))
    idx = _reshape(ctx, _index(ctx, indices), (m,))
    g = _reshape(ctx, ctx.cast(grad_output, dt), (m, grad_output.shape[-1]))
    if padding_idx >= 0:
        pad = _reshape(ctx, ctx.op("eq", idx, ctx.scalar(padding_idx, DType.INT64)), (m, 1))
        g = ctx.op("where", pad, ctx.scalar(0, dt), g)
    if scale_grad_by_freq:
        counts = _scatter_add_axis(ctx, _full(ctx, (m,), 1, dt), 0, idx, num_weights)
        g = ctx.op("div", g, _reshape(ctx, ctx.op("index_select", counts, idx, axis=0), (m, 1)))
    return _scatter_add_axis(ctx, g, 0, idx, num_weights)


# ---- losses -------------------------------------------------------------------------------------------------------
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_parts(ctx, self, target, weight, ignore_index):
    """(x with a batch dim, class axis, target, per-element weight (0 where ignored), valid mask)."""
    dt = _opmath(self.dtype)
    x = ctx.cast(self, dt)
    t = _index(ctx, target)
    if _ndim(x) == 1:
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
    all_dims = list(range(_ndim(t)))
    total = _sum(ctx, w, all_dims, False)
    s = _sum(ctx, loss, all_dims, False)
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
    s = _sum(ctx, loss, list(range(_ndim(loss))), False)
    return _div(ctx, s, math.prod(loss.shape), loss.dtype) if red == "mean" else s


@lowering("aten::mse_loss.default")
def mse_loss(ctx, self, target, reduction=1):
    dt = _compute(ctx)
    d = ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))
    return _reduce_loss(ctx, ctx.op("mul", d, d), reduction)


@lowering("aten::mse_loss_backward.default")
def mse_loss_backward(ctx, grad_output, self, target, reduction):
    dt = _compute(ctx)
    d = ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))
    norm = 2.0 / math.prod(self.shape) if _REDUCTIONS[reduction] == "mean" else 2.0
    return ctx.op("mul", ctx.op("mul", ctx.scalar(norm, dt), d), ctx.cast(grad_output, dt))


@lowering("aten::binary_cross_entropy.default")
def binary_cross_entropy(ctx, self, target, weight=None, reduction=1):
    dt = _compute(ctx)
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
    dt = _compute(ctx)
    x, y = ctx.cast(self, dt), ctx.cast(target, dt)
    s = functools.partial(ctx.scalar, dtype=dt)
    denom = ctx.op("maximum", ctx.op("mul", ctx.op("sub", s(1), x), x), s(1e-12))
    gi = ctx.op("div", ctx.op("mul", ctx.cast(grad_output, dt), ctx.op("sub", x, y)), denom)
    if weight is not None:
        gi = ctx.op("mul", gi, ctx.cast(weight, dt))
    if _REDUCTIONS[reduction] == "mean":
        gi = ctx.op("div", gi, s(math.prod(self.shape)))
    return gi


# ---- pooling and resampling ------------------------------------------------------------------------------------------
def _pool_args(kernel_size, stride, padding, dilation=1):
    k = _nlist(kernel_size, 2)
    return k, _nlist(stride, 2) if stride else k, _nlist(padding, 2), _nlist(dilation, 2)


def _batched(ctx, x):
    """An (N, C, H, W) view of a 3-D or 4-D pooling input."""
    return _reshape(ctx, x, (1,) + tuple(x.shape)) if _ndim(x) == 3 else x


@lowering("aten::max_pool2d_with_indices.default")
def max_pool2d_with_indices(ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The max over kernel taps of strided slices of the -inf padded input; ties keep the first
    tap and NaN wins (torch's ``val > max || isnan(val)``)."""
    if not self.dtype.is_float:
        raise ctx.fail(f"max_pool2d of {self.dtype} is not lowered")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pool_args(kernel_size, stride, padding, dilation)
    x = _batched(ctx, self)
    n, c, h, w = x.shape
    ho, wo = ctx.outs[0].shape[-2:]
    hi_h = max(0, (ho - 1) * sh + (kh - 1) * dh + 1 - ph - h)
    hi_w = max(0, (wo - 1) * sw + (kw - 1) * dw + 1 - pw - w)
    xp = ctx.op("pad", x, pads=((0, 0), (0, 0), (ph, hi_h), (pw, hi_w)), value=-math.inf)
    oh, ow = np.arange(ho)[:, None], np.arange(wo)[None, :]
    hs, ws = oh * sh - ph, ow * sw - pw
    hs0 = np.where(hs < 0, hs + ((-hs + dh - 1) // dh) * dh, hs)
    ws0 = np.where(ws < 0, ws + ((-ws + dw - 1) // dw) * dw, ws)
    best, bidx = ctx.scalar(-math.inf, x.dtype), ctx.const((hs0 * w + ws0).astype(np.int64), "pool_idx")
    for i in range(kh):
        for j in range(kw):
            v = ctx.op("slice", xp, start=(0, 0, i * dh, j * dw),
                       stop=(n, c, i * dh + (ho - 1) * sh + 1, j * dw + (wo - 1) * sw + 1), step=(1, 1, sh, sw))
            tap = ctx.const(((hs + i * dh) * w + ws + j * dw).astype(np.int64), "tap_idx")
            upd = ctx.op("logical_or", ctx.op("gt", v, best), ctx.op("isnan", v))
            best, bidx = ctx.op("where", upd, v, best), ctx.op("where", upd, tap, bidx)
    return _reshape(ctx, best, ctx.outs[0].shape), _reshape(ctx, bidx, ctx.outs[1].shape)


@lowering("aten::max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(ctx, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    dt = _opmath(grad_output.dtype)
    lead = math.prod(self.shape[:-2])
    g = _reshape(ctx, ctx.cast(grad_output, dt), (lead, math.prod(grad_output.shape[-2:])))
    idx = _reshape(ctx, _index(ctx, indices), g.shape)
    gi = ctx.op("scatter", _full(ctx, (lead, math.prod(self.shape[-2:])), 0, dt), idx, g, axis=1, mode="add")
    return _reshape(ctx, gi, self.shape)


def _avg_divisor(h, w, ho, wo, k, s, p, count_include_pad, divisor_override):
    """torch's per-output divisor of avg_pool2d (AvgPoolKernel.cpp)."""
    if divisor_override:
        return np.full((ho, wo), float(divisor_override))
    out = np.empty((ho, wo))
    for a in range(ho):
        h0 = a * s[0] - p[0]
        h1 = min(h0 + k[0], h + p[0])
        for b in range(wo):
            w0 = b * s[1] - p[1]
            w1 = min(w0 + k[1], w + p[1])
            if count_include_pad:
                out[a, b] = (h1 - h0) * (w1 - w0)
            else:
                out[a, b] = (min(h1, h) - max(h0, 0)) * (min(w1, w) - max(w0, 0))
    return out


def _ones_kernel(ctx, c, k, dt):
    return _full(ctx, (c, 1) + tuple(k), 1, dt)


@lowering("aten::avg_pool2d.default")
def avg_pool2d(ctx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    k, s, p, _ = _pool_args(kernel_size, stride, padding)
    dt = _compute(ctx)
    x = ctx.cast(_batched(ctx, self), dt)
    n, c, h, w = x.shape
    ho, wo = ctx.outs[0].shape[-2:]
    hi = [max(0, (o - 1) * s[d] + k[d] - p[d] - size) for d, (o, size) in enumerate(((ho, h), (wo, w)))]
    y = ctx.op("convolution", x, _ones_kernel(ctx, c, k, dt), stride=s, padding=((p[0], hi[0]), (p[1], hi[1])),
               groups=c)
    if tuple(y.shape[2:]) != (ho, wo):
        y = ctx.op("slice", y, start=(0, 0, 0, 0), stop=(n, c, ho, wo))
    div = _avg_divisor(h, w, ho, wo, k, s, p, count_include_pad, divisor_override)
    return _reshape(ctx, ctx.op("div", y, ctx.const(div.astype(dt.numpy), "divisor")), ctx.outs[0].shape)


@lowering("aten::avg_pool2d_backward.default")
def avg_pool2d_backward(ctx, grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    k, s, p, _ = _pool_args(kernel_size, stride, padding)
    dt = _compute(ctx)
    g = ctx.cast(_batched(ctx, grad_output), dt)
    n, c, ho, wo = g.shape
    h, w = self.shape[-2:]
    div = _avg_divisor(h, w, ho, wo, k, s, p, count_include_pad, divisor_override)
    g = ctx.op("div", g, ctx.const(div.astype(dt.numpy), "divisor"))
    full = ctx.op("conv_transpose", g, _ones_kernel(ctx, c, k, dt), stride=s, groups=c)  # input coords - p
    # crop the padding off (and zero-fill rows no window reached)
    out = full
    for d, (size, pd) in enumerate(((h, p[0]), (w, p[1]))):
        ax = 2 + d
        have = out.shape[ax]
        out = _slice(ctx, out, ax, pd, min(have, pd + size))
        if out.shape[ax] < size:
            pads = [(0, 0)] * 4
            pads[ax] = (0, size - out.shape[ax])
            out = ctx.op("pad", out, pads=tuple(pads), value=0.0)
    return _reshape(ctx, out, self.shape)


def _adaptive_matrix(n_in, n_out):
    """(n_out, n_in) averaging matrix of adaptive pooling windows [floor(i*n/o), ceil((i+1)*n/o))."""
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        a, b = (i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _separable(ctx, x, mh, mw):
    """``mh @ x @ mw.T`` over the last two dims of x (``mh``/``mw`` numpy matrices)."""
    r = _ndim(x)
    dt = x.dtype
    y = ctx.op("dot_general", x, ctx.const(mh.astype(dt.numpy), "rows"), lhs_contracting=(r - 2,),
               rhs_contracting=(1,))                                          # (..., W, Ho)
    return ctx.op("dot_general", y, ctx.const(mw.astype(dt.numpy), "cols"), lhs_contracting=(r - 2,),
                  rhs_contracting=(1,))                                       # (..., Ho, Wo)


@lowering("aten::_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(ctx, self, output_size):
    """Equal windows (the input divides evenly): a reshape and two sums; otherwise averaging
    matrices (an inf or NaN there also reaches the other outputs of its row, 0*inf)."""
    dt = _compute(ctx)
    x = ctx.cast(self, dt)
    h, w = x.shape[-2:]
    oh, ow = output_size
    lead = tuple(x.shape[:-2])
    if h % oh == 0 and w % ow == 0:
        x6 = _reshape(ctx, x, lead + (oh, h // oh, ow, w // ow))
        r = len(lead)
        s = _sum(ctx, x6, [r + 1, r + 3], False)
        return _div(ctx, s, (h // oh) * (w // ow), dt)
    return _separable(ctx, x, _adaptive_matrix(h, oh), _adaptive_matrix(w, ow))


@lowering("aten::_adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool2d_backward(ctx, grad_output, self):
    dt = _compute(ctx)
    g = ctx.cast(grad_output, dt)
    h, w = self.shape[-2:]
    oh, ow = g.shape[-2:]
    return _separable(ctx, g, _adaptive_matrix(h, oh).T, _adaptive_matrix(w, ow).T)


def _nearest_index(n_in, n_out, scale):
    """torch's nearest source index (UpSample.h: float32 arithmetic)."""
    if n_out == n_in:
        return np.arange(n_out)
    if n_out == 2 * n_in:
        return np.arange(n_out) >> 1
    sc = np.float32(1.0 / scale) if scale else np.float32(n_in) / np.float32(n_out)
    return np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * sc).astype(np.int64), n_in - 1)


def _resample_size(input_shape, output_size, scale_factors):
    if output_size is not None:
        return tuple(output_size), (None, None)
    return tuple(int(math.floor(n * s)) for n, s in zip(input_shape[-2:], scale_factors)), tuple(scale_factors)


@lowering("aten::upsample_nearest2d.default")
def upsample_nearest2d(ctx, self, output_size, scales_h=None, scales_w=None):
    x = self
    for d, (n_out, sc) in enumerate(zip(output_size, (scales_h, scales_w))):
        ax = _ndim(x) - 2 + d
        idx = _nearest_index(x.shape[ax], n_out, sc)
        if not np.array_equal(idx, np.arange(x.shape[ax])):
            x = ctx.op("index_select", x, ctx.const(idx, "nearest"), axis=ax)
    return x


@lowering("aten::upsample_nearest2d.vec")
def upsample_nearest2d_vec(ctx, input, output_size, scale_factors):
    size, scales = _resample_size(input.shape, output_size, scale_factors)
    return upsample_nearest2d(ctx, input, size, *scales)


@lowering("aten::upsample_nearest2d_backward.default")
def upsample_nearest2d_backward(ctx, grad_output, output_size, input_size, scales_h=None, scales_w=None):
    g = ctx.cast(grad_output, _compute(ctx))
    for d, (n_out, sc) in enumerate(zip(output_size, (scales_h, scales_w))):
        ax = _ndim(g) - 2 + d
        n_in = input_size[-2 + d]
        g = _scatter_add_axis(ctx, g, ax, ctx.const(_nearest_index(n_in, n_out, sc), "nearest"), n_in)
    return g


def _linear_matrix(n_in, n_out, align_corners, scale):
    """(n_out, n_in) linear interpolation weights, torch's source index rule (UpSample.h)."""
    if align_corners:
        sc = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        sc = 1.0 / scale if scale else n_in / n_out
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        src = i * sc if align_corners else max((i + 0.5) * sc - 0.5, 0.0)
        i0 = min(int(math.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        lam = src - i0
        m[i, i0] += 1.0 - lam
        m[i, i1] += lam
    return m


@lowering("aten::upsample_bilinear2d.default")
def upsample_bilinear2d(ctx, self, output_size, align_corners, scales_h=None, scales_w=None):
    """Separable interpolation matrices (an inf or NaN also reaches the other outputs of its
    row, 0*inf)."""
    x = ctx.cast(self, _compute(ctx))
    h, w = x.shape[-2:]
    return _separable(ctx, x, _linear_matrix(h, output_size[0], align_corners, scales_h),
                      _linear_matrix(w, output_size[1], align_corners, scales_w))


@lowering("aten::upsample_bilinear2d.vec")
def upsample_bilinear2d_vec(ctx, input, output_size, align_corners, scale_factors):
    size, scales = _resample_size(input.shape, output_size, scale_factors)
    return upsample_bilinear2d(ctx, input, size, align_corners, *scales)


@lowering("aten::upsample_bilinear2d_backward.default")
def upsample_bilinear2d_backward(ctx, grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    g = ctx.cast(grad_output, _compute(ctx))
    h, w = input_size[-2:]
    return _separable(ctx, g, _linear_matrix(h, output_size[0], align_corners, scales_h).T,
                      _linear_matrix(w, output_size[1], align_corners, scales_w).T)


def _pad_index(n, lo, hi, mode):
    i = np.arange(-lo, n + hi)
    if mode == "reflect":
        i = np.abs(i)
        i = np.where(i >= n, 2 * (n - 1) - i, i)
    else:
        i = np.clip(i, 0, n - 1)
    return i.astype(np.int64)


def _index_pad(ctx, x, padding, mode):
    for j in range(len(padding) // 2):
        ax = _ndim(x) - 1 - j
        lo, hi = padding[2 * j], padding[2 * j + 1]
        if lo or hi:
            x = ctx.op("index_select", x, ctx.const(_pad_index(x.shape[ax], lo, hi, mode), "pad_idx"), axis=ax)
    return x


def _index_pad_backward(ctx, g, self, padding, mode):
    g = ctx.cast(g, _opmath(g.dtype))
    for j in range(len(padding) // 2):
        ax = _ndim(g) - 1 - j
        lo, hi = padding[2 * j], padding[2 * j + 1]
        if lo or hi:
            n = self.shape[ax]
            g = _scatter_add_axis(ctx, g, ax, ctx.const(_pad_index(n, lo, hi, mode), "pad_idx"), n)
    return g


for _nd in (1, 2, 3):
    for _mode, _aten in (("reflect", "reflection"), ("edge", "replication")):
        def _pad_fwd(ctx, self, padding, _mode=_mode):
            return _index_pad(ctx, self, padding, _mode)

        def _pad_bwd(ctx, grad_output, self, padding, _mode=_mode):
            return _index_pad_backward(ctx, grad_output, self, padding, _mode)
        lowering(f"aten::{_aten}_pad{_nd}d.default")(_pad_fwd)
        lowering(f"aten::{_aten}_pad{_nd}d_backward.default")(_pad_bwd)


# ---- attention ----------------------------------------------------------------------------------------------------------
def _bmm(ctx, a, b, ca, cb):
    """Contract dim ``ca`` of a with ``cb`` of b, batching over every leading dim but the last two."""
    r = _ndim(a)
    batch = tuple(range(r - 2))
    return ctx.op("dot_general", a, b, lhs_contracting=(ca,), rhs_contracting=(cb,), lhs_batch=batch,
                  rhs_batch=batch)


def _attn_scores(ctx, q, k, is_causal, attn_mask, scale):
    r = _ndim(q)
    s = ctx.op("mul", _bmm(ctx, q, k, r - 1, r - 1), ctx.scalar(scale, q.dtype))      # (..., L, S)
    L, S = s.shape[-2:]
    if is_causal:
        s = ctx.op("where", ctx.const(np.tril(np.ones((L, S), dtype=bool)), "causal"), s,
                   ctx.scalar(-math.inf, q.dtype))
    if attn_mask is not None:
        if attn_mask.dtype is DType.BOOL:
            s = ctx.op("where", attn_mask, s, ctx.scalar(-math.inf, q.dtype))
        else:
            s = ctx.op("add", s, ctx.cast(attn_mask, q.dtype))
    return s


def _attn_setup(ctx, query, key, value, dropout_p, scale):
    if dropout_p:
        raise ctx.fail(f"attention dropout (p={dropout_p}) draws random numbers; not lowered")
    if tuple(query.shape[:-2]) != tuple(key.shape[:-2]) or tuple(key.shape[:-2]) != tuple(value.shape[:-2]):
        raise ctx.fail(f"attention with differing batch/head dims (grouped-query: {query.shape}, {key.shape}, "
                       f"{value.shape}) is not lowered")
    dt = _opmath(query.dtype)
    q, k, v = (ctx.cast(t, dt) for t in (query, key, value))
    return q, k, v, (1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale))


@lowering("aten::_scaled_dot_product_flash_attention_for_cpu.default")
def sdpa_flash_cpu(ctx, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """The output through the graph's ``attention`` op when there is no explicit mask; the
    log-sum-exp of the scaled scores beside it (dead code when nothing uses it)."""
    q, k, v, sc = _attn_setup(ctx, query, key, value, dropout_p, scale)
    s = _attn_scores(ctx, q, k, is_causal, attn_mask, sc)
    r = _ndim(s)
    m = ctx.op("reduce_max", s, axis=r - 1, keepdims=True)
    m0 = ctx.op("where", _isinf(ctx, m), ctx.scalar(0, q.dtype), m)
    lse = ctx.op("add", ctx.op("log", _sum(ctx, ctx.op("exp", ctx.op("sub", s, m0)), [r - 1])), m0)
    if attn_mask is None:
        out = ctx.op("attention", q, k, v, causal=bool(is_causal), scale=sc)
    else:
        out = _bmm(ctx, ctx.op("softmax", s, axis=r - 1), v, r - 1, r - 2)
    return out, _reshape(ctx, lse, s.shape[:-1])


@lowering("aten::_scaled_dot_product_flash_attention_for_cpu_backward.default")
def sdpa_flash_cpu_backward(ctx, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                            attn_mask=None, scale=None):
    q, k, v, sc = _attn_setup(ctx, query, key, value, dropout_p, scale)
    if tuple(logsumexp.shape) != tuple(query.shape[:-1]):
        raise ctx.fail(f"logsumexp has shape {tuple(logsumexp.shape)}, the forward gives {tuple(query.shape[:-1])} "
                       "(the core ATen decomposition of the CPU flash attention forward passes a different "
                       "tensor to this backward; keep the forward op undecomposed)")
    dt = q.dtype
    do, o = ctx.cast(grad_out, dt), ctx.cast(out, dt)
    s = _attn_scores(ctx, q, k, is_causal, attn_mask, sc)
    r = _ndim(s)
    p = ctx.op("exp", ctx.op("sub", s, unsqueeze(ctx, ctx.cast(logsumexp, dt), r - 1)))   # (..., L, S)
    dv = _bmm(ctx, p, do, r - 2, r - 2)                                                     # (..., S, Ev)
    dp = _bmm(ctx, do, v, r - 1, r - 1)                                                     # (..., L, S)
    delta = _sum(ctx, ctx.op("mul", do, o), [r - 1])
    ds = ctx.op("mul", ctx.op("mul", p, ctx.op("sub", dp, delta)), ctx.scalar(sc, dt))
    dq = _bmm(ctx, ds, k, r - 1, r - 2)                                                     # (..., L, E)
    dk = _bmm(ctx, ds, q, r - 2, r - 2)                                                     # (..., S, E)
    return dq, dk, dv


# ---- more math, norms and indexing helpers ------------------------------------------------------------------------------
@lowering("aten::asinh.default")
def asinh(ctx, self):
    """sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))"""
    x = _float_in(ctx, self)
    one = ctx.scalar(1, x.dtype)
    a = ctx.op("abs", x)
    x2 = ctx.op("mul", x, x)
    t = ctx.op("add", a, ctx.op("div", x2, ctx.op("add", one, ctx.op("sqrt", ctx.op("add", one, x2)))))
    return ctx.op("mul", ctx.op("sign", x), _log1p(ctx, t))


@lowering("aten::acosh.default")
def acosh(ctx, self):
    """log1p((x - 1) + sqrt((x - 1)(x + 1)))"""
    x = _float_in(ctx, self)
    one = ctx.scalar(1, x.dtype)
    xm = ctx.op("sub", x, one)
    return _log1p(ctx, ctx.op("add", xm, ctx.op("sqrt", ctx.op("mul", xm, ctx.op("add", x, one)))))


@lowering("aten::atanh.default")
def atanh(ctx, self):
    """sign(x) * 0.5 * log1p(2|x| / (1 - |x|)), on |x| as libm's atanh does: for x near -1
    the argument of log1p would sit near -1, where its rounding error is amplified."""
    x = _float_in(ctx, self)
    dt = x.dtype
    a = ctx.op("abs", x)
    q = ctx.op("div", ctx.op("mul", a, ctx.scalar(2, dt)), ctx.op("sub", ctx.scalar(1, dt), a))
    r = ctx.op("mul", _log1p(ctx, q), ctx.scalar(0.5, dt))
    r = ctx.op("where", ctx.op("lt", x, ctx.scalar(0, dt)), ctx.op("neg", r), r)
    return ctx.op("where", ctx.op("eq", x, ctx.scalar(0, dt)), x, r)        # atanh(-0) is -0


@lowering("aten::logit.default")
def logit(ctx, self, eps=None):
    x = _float_in(ctx, self)
    dt = x.dtype
    if eps is not None:
        x = ctx.op("clamp", x, ctx.scalar(eps, dt), ctx.scalar(1 - eps, dt))
    return ctx.op("log", ctx.op("div", x, ctx.op("sub", ctx.scalar(1, dt), x)))


@lowering("aten::hypot.default")
def hypot(ctx, self, other):
    cdt, _ = _promote(self, other, kind="float")
    a, b = ctx.cast(self, cdt), ctx.cast(other, cdt)
    return ctx.op("sqrt", ctx.op("add", ctx.op("mul", a, a), ctx.op("mul", b, b)))


@lowering("aten::logaddexp.default")
def logaddexp(ctx, self, other):
    """max + log1p(exp(-|a - b|)); equal infinities give that infinity."""
    cdt, _ = _promote(self, other, kind="float")
    a, b = ctx.cast(self, cdt), ctx.cast(other, cdt)
    m = ctx.op("maximum", a, b)
    r = ctx.op("add", m, _log1p(ctx, ctx.op("exp", ctx.op("neg", ctx.op("abs", ctx.op("sub", a, b))))))
    return ctx.op("where", ctx.op("logical_and", _isinf(ctx, a), ctx.op("eq", a, b)), a, r)


@lowering("aten::xlogy.Tensor", "aten::xlogy.Scalar_Other", "aten::xlogy.Scalar_Self")
def xlogy(ctx, self, other):
    cdt, _ = _promote(self, other, kind="float")
    x, y = _v(ctx, self, cdt), _v(ctx, other, cdt)
    r = ctx.op("where", ctx.op("eq", x, ctx.scalar(0, cdt)), ctx.scalar(0, cdt), ctx.op("mul", x, ctx.op("log", y)))
    return ctx.op("where", ctx.op("isnan", y), y, r)


@lowering("aten::norm.Scalar", "aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype",
          "aten::norm.ScalarOpt_dtype")
def norm(ctx, self, p=2, dim=None, keepdim=False, dtype=None):
    return linalg_vector_norm(ctx, self, 2 if p is None else p, dim, keepdim, dtype)


@lowering("aten::_safe_softmax.default")
def _safe_softmax(ctx, self, dim, dtype=None):
    """softmax, but 0 (not NaN) along rows that are all -inf (the SDPA math path's masking)."""
    x = _float_in(ctx, self)
    y = _axis_op(ctx, "softmax", x, dim)
    if _ndim(x) == 0:
        return y
    d = _wrap(dim, _ndim(x))
    dead = _reduce(ctx, "reduce_max", ctx.cast(ctx.op("ne", x, ctx.scalar(-math.inf, x.dtype)), DType.INT32),
                   [d], True)
    return ctx.op("where", ctx.op("eq", dead, ctx.scalar(0, DType.INT32)), ctx.scalar(0, x.dtype), y)


def _diag_index(shape, offset, d1, d2):
    """(the tensor's dims with d1, d2 moved last, flat diagonal indices into the last two)."""
    n, m = shape[d1], shape[d2]
    i = np.arange(max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m)))
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    return rows * m + cols


@lowering("aten::diagonal.default", "aten::diagonal_copy.default")
def diagonal(ctx, self, offset=0, dim1=0, dim2=1):
    r = _ndim(self)
    d1, d2 = _wrap(dim1, r), _wrap(dim2, r)
    rest = [d for d in range(r) if d not in (d1, d2)]
    x = _permute(ctx, self, rest + [d1, d2])
    lead = tuple(self.shape[d] for d in rest)
    flat = _reshape(ctx, x, lead + (self.shape[d1] * self.shape[d2],))
    idx = _diag_index(self.shape, offset, d1, d2)
    return ctx.op("index_select", flat, ctx.const(idx.astype(np.int64), "diag"), axis=len(lead))


@lowering("aten::diagonal_backward.default")
def diagonal_backward(ctx, grad_output, input_sizes, offset, dim1, dim2):
    r = len(input_sizes)
    d1, d2 = _wrap(dim1, r), _wrap(dim2, r)
    rest = [d for d in range(r) if d not in (d1, d2)]
    idx = ctx.const(_diag_index(tuple(input_sizes), offset, d1, d2).astype(np.int64), "diag")
    flat = _scatter_add_axis(ctx, ctx.cast(grad_output, _compute(ctx)), len(rest), idx,
                             input_sizes[d1] * input_sizes[d2])
    x = _reshape(ctx, flat, tuple(input_sizes[d] for d in rest) + (input_sizes[d1], input_sizes[d2]))
    perm = rest + [d1, d2]
    return _permute(ctx, x, [perm.index(d) for d in range(r)])


@lowering("aten::_unsafe_masked_index.default")
def _unsafe_masked_index(ctx, self, mask, indices, fill):
    return ctx.op("where", ctx.cast(mask, DType.BOOL), index(ctx, self, indices), _v(ctx, fill, self.dtype))


@lowering("aten::_unsafe_masked_index_put_accumulate.default")
def _unsafe_masked_index_put_accumulate(ctx, self, mask, indices, values):
    vals = ctx.op("where", ctx.cast(mask, DType.BOOL), ctx.cast(values, self.dtype), ctx.scalar(0, self.dtype))
    return index_put(ctx, self, indices, vals, True)


def _pool1d(fn):
    """A 1-d pooling as its 2-d form over a height of one."""
    def run(ctx, self, *args):
        x = unsqueeze(ctx, self, -2)
        sub = LowerCtx(ctx.g, [OutMeta(ctx.outs[0].shape[:-1] + (1,) + ctx.outs[0].shape[-1:], ctx.outs[0].dtype)],
                       ctx._consts)
        sub.where = ctx.where
        return squeeze(ctx, fn(sub, x, *args), _ndim(x) - 2)
    return run


@lowering("aten::avg_pool1d.default")
def avg_pool1d(ctx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    k, s, p = _nlist(kernel_size, 1), _nlist(stride, 1) if stride else _nlist(kernel_size, 1), _nlist(padding, 1)
    return _pool1d(avg_pool2d)(ctx, self, [1, k[0]], [1, s[0]], [0, p[0]], ceil_mode, count_include_pad, None)


@lowering("aten::adaptive_avg_pool1d.default")
def adaptive_avg_pool1d(ctx, self, output_size):
    return _pool1d(_adaptive_avg_pool2d)(ctx, self, [1, _nlist(output_size, 1)[0]])


# ---- more activations and losses ------------------------------------------------------------------------------------------
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@lowering("aten::celu.default")
def celu(ctx, self, alpha=1.0):
    return elu(ctx, self, alpha, 1, 1.0 / alpha)


@lowering("aten::selu.default")
def selu(ctx, self):
    return elu(ctx, self, _SELU_ALPHA, _SELU_SCALE, 1)


@lowering("aten::_prelu_kernel.default")
def _prelu_kernel(ctx, self, weight):
    dt = _compute(ctx)
    x = ctx.cast(self, dt)
    return ctx.op("where", ctx.op("gt", x, ctx.scalar(0, dt)), x, ctx.op("mul", ctx.cast(weight, dt), x))


@lowering("aten::_prelu_kernel_backward.default")
def _prelu_kernel_backward(ctx, grad_output, self, weight):
    dt = _compute(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    pos_ = ctx.op("gt", x, ctx.scalar(0, dt))
    gi = ctx.op("where", pos_, g, ctx.op("mul", ctx.cast(weight, dt), g))
    gw = ctx.op("where", pos_, ctx.scalar(0, dt), ctx.op("mul", x, g))
    return gi, gw


@lowering("aten::glu_backward.default")
def glu_backward(ctx, grad_output, self, dim):
    dt = _compute(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    d = _wrap(dim, _ndim(x))
    a, b = _split(ctx, x, [x.shape[d] // 2] * 2, d)
    s = ctx.op("sigmoid", b)
    ga = ctx.op("mul", g, s)
    gb = ctx.op("mul", ctx.op("mul", ga, a), ctx.op("sub", ctx.scalar(1, dt), s))
    return ctx.op("concat", ga, gb, axis=d)


@lowering("aten::mish_backward.default")
def mish_backward(ctx, grad_output, self):
    dt = _compute(ctx)
    x, g = ctx.cast(self, dt), ctx.cast(grad_output, dt)
    t = ctx.op("tanh", _softplus(ctx, x, 1, 20))
    s = ctx.op("sigmoid", x)
    d = ctx.op("mul", ctx.op("mul", x, s), ctx.op("sub", ctx.scalar(1, dt), ctx.op("mul", t, t)))
    return ctx.op("mul", g, ctx.op("add", t, d))


@lowering("aten::binary_cross_entropy_with_logits.default")
def binary_cross_entropy_with_logits(ctx, self, target, weight=None, pos_weight=None, reduction=1):
    """(1 - y) x + w_pos (log1p(exp(-|x|)) + max(-x, 0)), w_pos = (pos_weight - 1) y + 1."""
    dt = _compute(ctx)
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
    dt = _compute(ctx)
    d = ctx.op("abs", ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt)))
    s = functools.partial(ctx.scalar, dtype=dt)
    quad = ctx.op("mul", ctx.op("mul", d, d), s(0.5))
    lin = ctx.op("mul", ctx.op("sub", d, s(0.5 * delta)), s(delta))
    return _reduce_loss(ctx, ctx.op("where", ctx.op("lt", d, s(delta)), quad, lin), reduction)


@lowering("aten::huber_loss_backward.default")
def huber_loss_backward(ctx, grad_output, self, target, reduction, delta):
    dt = _compute(ctx)
    x = ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))
    c = ctx.op("clamp", x, ctx.scalar(-delta, dt), ctx.scalar(delta, dt))
    return ctx.op("mul", ctx.op("mul", c, ctx.scalar(_loss_norm(self, reduction), dt)), ctx.cast(grad_output, dt))


@lowering("aten::smooth_l1_loss.default")
def smooth_l1_loss(ctx, self, target, reduction=1, beta=1.0):
    dt = _compute(ctx)
    d = ctx.op("abs", ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt)))
    if beta == 0:
        return _reduce_loss(ctx, d, reduction)
    s = functools.partial(ctx.scalar, dtype=dt)
    quad = ctx.op("div", ctx.op("mul", ctx.op("mul", d, d), s(0.5)), s(beta))
    return _reduce_loss(ctx, ctx.op("where", ctx.op("lt", d, s(beta)), quad, ctx.op("sub", d, s(0.5 * beta))),
                        reduction)


@lowering("aten::smooth_l1_loss_backward.default")
def smooth_l1_loss_backward(ctx, grad_output, self, target, reduction, beta):
    dt = _compute(ctx)
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
    dt = _compute(ctx)
    return _reduce_loss(ctx, ctx.op("abs", ctx.op("sub", ctx.cast(self, dt), ctx.cast(target, dt))), reduction)


@lowering("aten::unsafe_split.Tensor")
def unsafe_split(ctx, self, split_size, dim=0):
    return split(ctx, self, split_size, dim)


@lowering("aten::unsafe_split_with_sizes.default")
def unsafe_split_with_sizes(ctx, self, split_sizes, dim=0):
    return split_with_sizes(ctx, self, split_sizes, dim)


# ---- selection: topk by repeated arg-extremes (k <= 64), sort by a bitonic network ---------------------------------
def _select(ctx, self, k, dim, largest):
    if _ndim(self) == 0:
        return self, _full(ctx, (), 0, DType.INT64)
    return top_k(ctx, self, k, _wrap(dim, _ndim(self)), largest)


@lowering("aten::topk.default")
def topk(ctx, self, k, dim=-1, largest=True, sorted=True):
    """Values as torch's; among equal values the lower index comes first (torch's CPU topk
    leaves equal values in whatever order its partial sort gives).  Up to 64 elements by
    selection rounds, more by a sort."""
    return _select(ctx, self, k, dim, largest)


@lowering("aten::sort.default", "aten::sort.stable")
def sort(ctx, self, dim=-1, descending=False, stable=None):
    if _ndim(self) == 0:
        return _select(ctx, self, 1, dim, descending)
    return bitonic_sort(ctx, self, _wrap(dim, _ndim(self)), descending)


# ---- foreach (optimizers): one lowering per list element --------------------------------------------------------------
def _each(ctx, n, fn):
    return [fn(ctx.for_output(i), i) for i in range(n)]


def _pick(x, i):
    return x[i] if isinstance(x, (list, tuple)) else x


for _name in ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "exp", "expm1", "floor", "frac", "log",
              "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh",
              "sqrt", "tan", "tanh", "trunc", "clone"):
    def _fe_unary(ctx, self, _base=f"aten::{_name}.default"):
        fn = _TABLE[_base]
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
                dt = _compute(c)
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
    return [_zeros_like(ctx, t) for t in self]


@lowering("aten::_foreach_copy.default")
def _foreach_copy(ctx, self, src, non_blocking=False):
    return [copy(ctx, a, b) for a, b in zip(self, src)]


@lowering("aten::zero.default")
def zero(ctx, self):
    return _zeros_like(ctx, self)


def _register_inplace() -> None:
    """``aten::add_.Tensor`` etc. share their functional op's lowering: the result is the new
    value of the mutated argument(s), which the caller writes back."""
    views = {"as_strided", "squeeze", "unsqueeze", "t", "transpose", "detach"}   # metadata, not data
    for key in list(_TABLE):
        name, ov = key.removeprefix("aten::").split(".")
        if name in views:
            continue
        try:
            packet = getattr(torch.ops.aten, name + "_")
        except (AttributeError, RuntimeError):
            continue
        if ov in packet.overloads():
            _TABLE.setdefault(f"aten::{name}_.{ov}", _TABLE[key])


_register_inplace()
_TABLE["aten::pow_.Tensor"] = pow_
from . import histc_lowering  # noqa: E402,F401  (registers aten::histc of integers)
from . import concatenation as _concatenation  # noqa: E402
from . import scatter as _scatter  # noqa: E402

#: the overload names of every lowered op
LOWERED_OPS: frozenset[str] = frozenset(_TABLE)
