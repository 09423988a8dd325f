"""A graph of one ATen op call, for the eager path and tests: :func:`output_metas` asks
torch (on meta tensors) what the outputs are, :func:`single_op_graph` makes every tensor
argument a graph input and lowers the call."""

from __future__ import annotations

import torch

from fornax.layers.graph import Graph, Value

from .context import LowerCtx, OutMeta
from .dispatch import lower
from .dtypes import graph_dtype
from .errors import NotLowerable
from .table import op_key


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
    outs: list[OutMeta | None] = []
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
