"""Lifted scalars: float arguments of eager ops read from device memory instead of compiled in.

An eager op's one-op plan is cached by its signature, which holds every Python float
argument's value: compiling the value in is right for a scale that stays put (GELU's 0.5),
but an optimizer passes new ones every step (AdamW's step size and bias corrections), and
each new value was a new compile.  So once a signature has been called with a second set of
float values, its calls lower with each float as :class:`~.lowering.context.Lifted`: where a
lowering makes it a scalar operand (:meth:`LowerCtx.scalar`), the graph takes a 0-d input
instead of a constant, and the plan is cached by the graph itself (its text, constants and
attributes), which is the same for every value.  A call uploads its values (one 4-byte
host-to-device copy each, as a kernel argument would travel) and launches that plan.

A lowering that does anything else with the value (compares it, computes with it) sees the
plain number; whatever follows from that is in the graph, so it keys its own plan and the
result is always the one the value's own compile gives.  A signature whose graph keeps
changing with the value stops lifting after :data:`PLANS_PER_SIGNATURE` plans.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...layers.graph import DType, Graph
from . import tensors as T
from .lowering import DTYPE_TO_TORCH
from .lowering.context import Lifted
from .session import Session

#: lifted plans one signature may have (graphs that differ with the value) before it stops lifting
PLANS_PER_SIGNATURE = 8


def _floats(args: Any, kwargs: Any) -> list[float]:
    return [x for x in tree_flatten((args, kwargs))[0] if type(x) is float]


def abstract(key: Any) -> Any:
    """A plan-cache signature (see ``eager._signature``) with every float's value left out."""
    if type(key) is tuple:
        if len(key) == 2 and type(key[0]) is str and key[0] == "f":
            return ("f",)
        return tuple([abstract(k) for k in key])
    return key


def varying(session: Session, key: tuple, args: Any, kwargs: Any) -> bool:
    """Whether a call whose signature ``key`` missed the plan cache should lift its floats:
    calls of this signature (floats aside) came with other float values before."""
    floats = _floats(args, kwargs)
    if not floats:
        return False
    seen_key = ("lifted-values", abstract(key))
    values = tuple(repr(v) for v in floats)
    seen = session.plans.get(seen_key)
    if seen is None:
        session.plans[seen_key] = values
        return False
    return bool(seen != values)


def marked(args: Any, kwargs: Any) -> tuple[Any, Any, list[Any]]:
    """``args``/``kwargs`` with every float a :class:`Lifted` that knows its position in the
    flattened arguments, and those flattened arguments (a Lifted's ``slot`` indexes them)."""
    flat, spec = tree_flatten((args, kwargs))
    largs, lkwargs = tree_unflatten([Lifted(x, i) if type(x) is float else x for i, x in enumerate(flat)],
                                    spec)
    return largs, lkwargs, flat


def plan_key(key: tuple, g: Graph) -> tuple:
    """What a lifted plan is cached by: the signature without float values and the graph
    itself, constants' bytes and array attributes included (what the compile depends on)."""
    consts = tuple((c.const.dtype.str, c.const.shape, c.const.tobytes()) for c in g.constants
                   if c.const is not None)
    arrays = tuple((i, k, v.dtype.str, v.shape, v.tobytes()) for i, node in enumerate(g.nodes)
                   for k, v in sorted(node.attrs.items()) if isinstance(v, np.ndarray))
    return ("lifted-plan", abstract(key), str(g), consts, arrays)


def room(session: Session, key: tuple) -> bool:
    """Count a new lifted plan for ``key``'s signature; False once it has had its share."""
    count_key = ("lifted-plans", abstract(key))
    count = session.plans.get(count_key, 0)
    if count >= PLANS_PER_SIGNATURE:
        return False
    session.plans[count_key] = count + 1
    return True


def upload(session: Session, value: float, dt: DType, temps: list, stream: Any) -> int:
    """A 0-d device buffer holding ``value`` as ``dt`` (converted as a compiled constant is),
    kept alive in ``temps``; its address."""
    t = T.staged(np.array(float(value)).astype(dt.numpy), (), DTYPE_TO_TORCH[dt], session, stream)
    temps.append(t)
    return T.address(t, session)


__all__ = ["Lifted", "PLANS_PER_SIGNATURE", "abstract", "marked", "plan_key", "room", "upload", "varying"]
