"""A MAX-style graph evaluated on the host in float64: the reference a run is checked
against (fornax's op table's reference implementations; a custom op's own reference)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...layers.ops import OPS
from .graph import Graph


def evaluate(graph: Graph, *arrays: Any) -> list[np.ndarray]:
    """The graph's outputs for host ``arrays``, computed in float64 (integers stay integers)."""
    def wide(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a
    env: dict[int, np.ndarray] = {v.id: wide(np.asarray(a)) for v, a in zip(graph.inputs, arrays)}
    with np.errstate(all="ignore"):
        for n in graph.nodes:
            if n.op == "constant":
                assert n.const is not None
                env[n.outputs[0].id] = wide(n.const)
            elif n.custom is not None:
                outs = n.custom.reference(*(env[v.id] for v in n.inputs))
                for v, o in zip(n.outputs, outs):
                    env[v.id] = wide(np.asarray(o))
            else:
                env[n.outputs[0].id] = np.asarray(OPS[n.op].reference(*(env[v.id] for v in n.inputs), **n.attrs))
    return [env[v.id] for v in graph.outputs]
