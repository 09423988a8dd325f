"""Small helpers shared by the tests: a hand-written ISA kernel, graph-error checks, a free
port for a torchrun rendezvous, a family's library on a tiny device."""

from __future__ import annotations

import socket

import numpy as np

from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import BUILTIN_FAMILIES, get_vendor

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


class LibraryDevice:
    """A family's library on a fresh tiny device (``meta``: shape-only), with upload and
    download helpers: what the library-routine tests drive."""

    def __init__(self, vendor: str, meta: bool = False):
        drv = get_vendor(vendor).driver([Device(load_spec("tiny"), meta=meta)])
        self.vendor = vendor
        self.rt = get_vendor(vendor).runtime(drv)
        self.lib = get_vendor(vendor).library(self.rt)

    def put(self, a: np.ndarray) -> int:
        p = self.rt.malloc(max(a.nbytes, 1))
        self.rt.memcpy_h2d(p, np.ascontiguousarray(a))
        return p

    def empty(self, shape, dtype) -> int:
        return self.rt.malloc(int(np.prod(shape)) * np.dtype(dtype).itemsize)

    def get(self, p: int, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        self.rt.memcpy_d2h(out, p)
        return out


_LIBRARY_DEVICES: dict[str, LibraryDevice] = {}


def library_device(vendor: str) -> LibraryDevice:
    """One shared :class:`LibraryDevice` per family (for tests that do not care about state)."""
    if vendor not in _LIBRARY_DEVICES:
        _LIBRARY_DEVICES[vendor] = LibraryDevice(vendor)
    return _LIBRARY_DEVICES[vendor]
