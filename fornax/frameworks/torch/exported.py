"""``torch.export`` on the fornax stack: :func:`export` decomposes an exported program to core
ATen and lowers it into fornax graphs (a :class:`~.graph.Program`); :class:`Exported` calls
it like the module, with the program's parameters, buffers and constants bound."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...layers.errors import InvalidArgumentError, NotSupportedError
from ...layers.graph import Graph
from . import hazards
from . import tensors as T
from .graph import Program, _next_name, _safe, decompositions
from .session import current


class Exported:
    """A ``torch.export`` program lowered to fornax graphs; call it like the module.

    ``.graph`` is the fornax graph (when it lowered whole), ``.program`` the
    :class:`Program` (``.graphs``, ``.fallbacks``, ``str()``), ``.exported`` PyTorch's
    ``ExportedProgram`` after the core ATen decompositions."""

    def __init__(self, ep, name: str):
        self.exported = ep
        self.program = Program(ep.graph_module, name)
        self.state = {k: v.detach() for k, v in ep.state_dict.items()}
        self.constants = dict(ep.constants)
        self._on_device: dict = {}

    @property
    def graph(self) -> Graph | None:
        return self.program.graph

    @property
    def graphs(self) -> list[Graph]:
        return self.program.graphs

    def __str__(self) -> str:
        return str(self.program)

    def _lifted(self, target: str, table: dict, device: bool):
        t = table[target]
        if not device or not isinstance(t, torch.Tensor) or T.is_fornax(t):
            return t
        key = (current().id, target)
        if key not in self._on_device:
            self._on_device[key] = T.to_device(t.detach())
        return self._on_device[key]

    def __call__(self, *args, **kwargs):
        from torch.export.graph_signature import InputKind, OutputKind

        ep = self.exported
        flat, spec = tree_flatten((args, kwargs))
        if spec != ep.call_spec.in_spec:
            raise InvalidArgumentError(
                f"the exported program takes inputs shaped like {ep.call_spec.in_spec}, got {spec}",
                seam="framework", op=self.program.name,
                hint="call it with the same argument structure as the example passed to export()")
        device = any(T.is_fornax(a) for a in flat)
        if device:
            hazards.before_use(current(), flat)
        user = iter(flat)
        feeds = []
        for s in ep.graph_signature.input_specs:
            if s.kind == InputKind.USER_INPUT:
                feeds.append(next(user))
            elif s.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                feeds.append(self._lifted(s.target, self.state, device))
            elif s.kind == InputKind.CONSTANT_TENSOR:
                feeds.append(self._lifted(s.target, self.constants, device))
            else:
                raise NotSupportedError(f"exported input {s.arg.name} of kind {s.kind.name} is not "
                                        "supported by the fornax export path", seam="framework",
                                        op=self.program.name)
        outs = self.program(*feeds)
        user_outs = []
        for s, o in zip(ep.graph_signature.output_specs, outs):
            if s.kind == OutputKind.USER_OUTPUT:
                user_outs.append(o)
            elif s.kind == OutputKind.BUFFER_MUTATION:
                self.state[s.target] = o.cpu() if not T.is_fornax(self.state[s.target]) else o
                self._on_device.pop((current().id, s.target), None)
            elif s.kind == OutputKind.USER_INPUT_MUTATION:
                target = flat[[i.arg.name for i in ep.graph_signature.input_specs
                               if i.kind == InputKind.USER_INPUT].index(s.target)]
                target.copy_(o)
        return tree_unflatten(user_outs, ep.call_spec.out_spec)


def export(model, args, kwargs=None, *, name: str | None = None) -> Exported:
    """``torch.export.export(model, args)`` decomposed to core ATen and lowered to fornax graphs.

    Returns an :class:`Exported`: call it with inputs shaped like ``args`` / ``kwargs``
    (CPU or ``fornax`` tensors; outputs come back on the same device), print it or its
    ``.graph`` to see the fornax graph.  Nodes without a lowering run with PyTorch on the
    CPU (``.program.fallbacks``)."""
    ep = torch.export.export(model, tuple(args), kwargs=dict(kwargs) if kwargs else None)
    ep = ep.run_decompositions(decompositions())
    label = name or type(model).__name__.lower()
    return Exported(ep, _next_name(f"export_{_safe(label)}_"))


__all__ = ["Exported", "export"]
