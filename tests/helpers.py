"""Small helpers shared by the tests: a hand-written ISA kernel, graph-error checks, a free
port for a torchrun rendezvous."""

from __future__ import annotations

import socket

from fornax.sim import isa
from fornax.stack import BUILTIN_FAMILIES

#: the built-in families every per-family test runs on (the one registry is fornax.stack)
FAMILIES = BUILTIN_FAMILIES


def scale_program(name: str = "triple", factor: float = 3.0, n: int = 64, **meta) -> isa.Program:
    """dst[i] = src[i] * factor for i < n (one work-group of 64 lanes); ``meta`` adds program
    metadata (registers, shared_memory, ...)."""
    return isa.verify(isa.Program(name, (isa.Param("src", "ptr", "float32"),
                                         isa.Param("dst", "ptr", "float32")), (
        isa.Arange("%i", n),
        isa.Load("%v", "src", "%i"),
        isa.Const("%f", factor, "float32"),
        isa.Binary("%w", "mul", "%v", "%f"),
        isa.Store("dst", "%i", "%w"),
    ), {"group_size": 64, **meta}))


def expect_graph_error(fn, *fragments: str):
    """``fn`` must raise a GraphError whose message holds every fragment; returns the error."""
    import pytest

    from fornax.layers.errors import GraphError

    with pytest.raises(GraphError) as info:
        fn()
    msg = str(info.value)
    for f in fragments:
        assert f in msg, msg
    return info.value


def free_port() -> int:
    """A TCP port nobody listens on now (for a torchrun rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
