"""The eager dispatch cache: an op seen before with the same signature goes straight to its launch.

The first call of an ATen op with given argument types, shapes, strides and dtypes takes the
whole route of :func:`.eager.dispatch` (validation, placement of CPU scalars, the family's
rules, lowering, compilation, the plan cache).  When it ran natively with its arguments as
given, the call leaves a :class:`Launch` here, keyed by that signature: a later call with
the same signature allocates its outputs and launches the resident plan directly, as
PyTorch's own dispatcher jumps to a registered kernel.  Everything that decides the route
depends only on what the key holds (the op, each tensor's shape, strides and dtype, and
every other argument's exact value), so the cached call does what the full route would.

Calls the cache does not take: any argument that is not a fornax tensor or a plain value
(CPU tensors, lists of tensors, devices, flagged conj/neg views), ops whose checks read
the data (advanced indexing) or warn each call (``var``/``std``), and every call while the
profiler runs.  The cache belongs to a session: a new stack starts empty, a device reset or
an eviction from the plan cache clears it, and it holds at most :data:`MAX_ENTRIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import hazards
from . import tensors as T
from .streams import current_runtime_stream

#: cached launches one session keeps (the table is cleared when it outgrows this)
MAX_ENTRIES = 4096
_Tensor = torch.Tensor


def _part(x: Any) -> Any:
    """The key of one argument, or None when the cache does not take it."""
    if isinstance(x, _Tensor):
        if x.is_cpu or x.is_meta or x.is_conj() or x.is_neg():
            return None
        return (x.shape, x.stride(), x.dtype)
    t = type(x)
    if t is int or t is bool or x is None:
        return (t, x)
    if t is float:
        return (t, repr(x))            # -0.0 and 0.0 differ; so do nan payloads' reprs
    if t is list or t is tuple:
        if all(type(v) is int for v in x):
            return (t, tuple(x))
        return None
    if isinstance(x, (torch.dtype, torch.memory_format, torch.layout)):
        return (t, x)
    return None


def key(op: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The cache key of a call, or None when the cache does not take it."""
    parts: list[Any] = [op]
    for a in args:
        p = _part(a)
        if p is None:
            return None
        parts.append(p)
    for name, v in kwargs.items():
        p = _part(v)
        if p is None:
            return None
        parts.append((name, p))
    return tuple(parts)


class Launch:
    """A native op's cached launch: allocate its outputs, launch its resident plan.  With
    ``into``, an in-place op's: the plan of its functional form writes its first argument
    (a contiguous tensor of the result's shape and dtype, as the key vouches), which the
    call returns."""

    __slots__ = ("name", "plan", "outs", "structure", "present", "materialize", "into")

    def __init__(self, name: str, plan: Any, outs: list, structure: Any, present: tuple,
                 materialize: Callable[..., int], into: bool = False):
        self.name, self.plan, self.structure, self.present = name, plan, structure, present
        self.into = into
        # per output: (shape, contiguous strides, bytes, dtype), or None (torch returns none)
        self.outs = [None if m is None else
                     (m.shape, T.contiguous_strides(m.shape),
                      T.span_elements(m.shape, T.contiguous_strides(m.shape)) * m.dtype.itemsize,
                      m.dtype) for m in outs]
        self.materialize = materialize

    def __call__(self, session: Any, args: tuple, kwargs: dict) -> Any:
        if session.deferred:
            hazards.before_use(session, args, kwargs)
        stream = current_runtime_stream(session)
        if self.into:                   # the plan's one output is the op's first argument
            outs = [args[0]]
        else:
            outs = [None if m is None else T.empty_contiguous(*m, session, stream) for m in self.outs]
        if self.plan is not None:
            temps: list[_Tensor] = []
            materialize = self.materialize
            ptrs = [materialize(session, x, temps, stream)
                    for x in (*args, *kwargs.values()) if isinstance(x, _Tensor)]
            self.plan(ptrs, [T.address(outs[k], session) for k in self.present], stream)
            del temps
        session.stats.record(self.name, "native")
        if self.into or self.structure is None:
            return outs[0]
        return tuple(outs)


def install(session: Any, cache_key: tuple, launch: Launch) -> None:
    table = session.fast
    if len(table) >= MAX_ENTRIES:
        table.clear()
    table[cache_key] = launch
