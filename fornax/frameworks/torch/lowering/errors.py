"""The refusal a lowering raises: :class:`NotLowerable`."""

from __future__ import annotations

from fornax.layers.errors import NotSupportedError


class NotLowerable(NotSupportedError):
    """An ATen op (or this combination of its arguments) has no graph lowering.

    ``str(exc)`` is the reason, starting with the overload name, e.g.
    ``"aten::add.Tensor: complex64 has no fornax dtype"``.  Callers fall back
    (eager: CPU; graph path: split the graph or refuse the compile)."""

    kind = "not_lowerable"

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
