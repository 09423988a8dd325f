"""The registration table: the one dict from ATen overload name to lowering function.

Family modules register into :data:`TABLE` with the :func:`lowering` decorator (a name
registered twice is an error); :func:`lookup` reads it; :func:`register_inplace` gives each
in-place overload (``aten::add_.Tensor``) its functional op's lowering once every family
has registered (the package ``__init__`` calls it).  Keys are
``str(op._schema.name) + "." + op._overloadname`` (:func:`op_key`)."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch

#: a lowering: ``fn(ctx, **arguments by schema name)`` -> a Value, None, or one per output
Lowering = Callable[..., Any]
_L = TypeVar("_L", bound=Lowering)


# ---- the table -----------------------------------------------------------------------------------
TABLE: dict[str, Lowering] = {}


def op_key(op: Any) -> str:
    """``"aten::add.Tensor"`` / ``"aten::relu.default"`` for an OpOverload."""
    return f"{op._schema.name}.{op._overloadname}"


def lowering(*names: str) -> Callable[[_L], _L]:
    """Register the decorated function as the lowering of each named overload."""
    def deco(fn: _L) -> _L:
        for n in names:
            if n in TABLE:
                raise ValueError(f"two lowerings for {n}")
            TABLE[n] = fn
        return fn
    return deco


def lookup(op: Any) -> Lowering | None:
    """The lowering of an OpOverload (or overload name), or None."""
    return TABLE.get(op if isinstance(op, str) else op_key(op))


# ---- in-place overloads share their functional op's lowering -------------------------------------
def register_inplace() -> None:
    """``aten::add_.Tensor`` etc. share their functional op's lowering: the result is the new
    value of the mutated argument(s), which the caller writes back."""
    views = {"as_strided", "squeeze", "unsqueeze", "t", "transpose", "detach"}   # metadata, not data
    for key in list(TABLE):
        name, ov = key.removeprefix("aten::").split(".")
        if name in views:
            continue
        try:
            packet = getattr(torch.ops.aten, name + "_")
        except (AttributeError, RuntimeError):
            continue
        if ov in packet.overloads():
            TABLE.setdefault(f"aten::{name}_.{ov}", TABLE[key])
