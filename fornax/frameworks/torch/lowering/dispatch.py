"""Lowering one ATen call through the table: :func:`lower` binds the arguments by schema
name (:data:`IGNORED_KWARGS` dropped, defaults filled in), calls the registered lowering,
turns any failure into :class:`~.errors.NotLowerable`, and checks and casts every output
against torch's own description of it; :func:`resolve` turns an overload name back into
its OpOverload."""

from __future__ import annotations

import math

import torch

from fornax.layers.errors import GraphError
from fornax.layers.graph import Value

from .context import LowerCtx
from .dtypes import graph_dtype
from .errors import NotLowerable
from .table import TABLE, op_key


IGNORED_KWARGS = frozenset({"device", "layout", "pin_memory", "memory_format", "non_blocking"})


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
        if a.name in IGNORED_KWARGS:
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
        op = resolve(op)
    where = op_key(op)
    ctx.where = where
    if ctx.outs and all(o is None or math.prod(o.shape) == 0 for o in ctx.outs):
        return [None] * len(ctx.outs)          # nothing to compute
    fn = TABLE.get(where)
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


def resolve(name: str):
    """The OpOverload of an overload name (``"aten::add.Tensor"``)."""
    try:
        ns, rest = name.split("::")
        packet, overload = rest.split(".")
        return getattr(getattr(getattr(torch.ops, ns), packet), overload)
    except (ValueError, AttributeError, RuntimeError):
        raise NotLowerable(f"{name}: not an ATen overload name (expected e.g. 'aten::add.Tensor')") from None
