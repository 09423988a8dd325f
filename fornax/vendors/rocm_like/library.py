"""rocm-like library (rocBLAS-like): code objects for a fixed list of gfx targets only."""

from __future__ import annotations

from ...layers.binary import KernelBinary
from ...layers.library import LibraryBase
from ...sim.isa import Program
from . import FACTS
from .compiler import hsaco_image


class RocmLikeLibrary(LibraryBase):
    vendor = "rocm-like"
    facts = FACTS

    def build(self, programs: list[Program], fmt: str, target: str) -> KernelBinary:
        return hsaco_image(programs, target, f"{self.vendor} {self.name}")
