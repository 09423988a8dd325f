"""cuda-like library (cuBLAS-like): ships cubin-like images per sm arch plus PTX-like for newer archs."""

from __future__ import annotations

from ...layers.binary import KernelBinary
from ...layers.library import LibraryBase
from ...sim.isa import Program
from . import FACTS
from .compiler import ENCODERS


class CudaLikeLibrary(LibraryBase):
    vendor = "cuda-like"
    facts = FACTS

    def build(self, programs: list[Program], fmt: str, target: str) -> KernelBinary:
        return ENCODERS[fmt](programs, target, f"{self.vendor} {self.name}")
