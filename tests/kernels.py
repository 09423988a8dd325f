"""Small hand-written ISA kernels shared by the tests."""

from __future__ import annotations

from fornax.sim import isa


def scale_program(name: str = "triple", factor: float = 3.0, n: int = 64) -> isa.Program:
    """dst[i] = src[i] * factor for i < n (one work-group of 64 lanes)."""
    return isa.verify(isa.Program(name, (isa.Param("src", "ptr", "float32"),
                                         isa.Param("dst", "ptr", "float32")), (
        isa.Arange("%i", n),
        isa.Load("%v", "src", "%i"),
        isa.Const("%f", factor, "float32"),
        isa.Binary("%w", "mul", "%v", "%f"),
        isa.Store("dst", "%i", "%w"),
    ), {"group_size": 64}))
