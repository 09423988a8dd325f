"""xpu-like library (oneMKL-like): SPIR-V-like kernels built at load on any device, native for pvc."""

from __future__ import annotations

from ...layers.binary import KernelBinary
from ...layers.library import LibraryBase
from ...sim.isa import Program
from . import FACTS
from .compiler import ENCODERS


class XpuLikeLibrary(LibraryBase):
    vendor = "xpu-like"
    facts = FACTS

    def build(self, programs: list[Program], fmt: str, target: str) -> KernelBinary:
        return ENCODERS[fmt](programs, target, f"{self.vendor} {self.name}")
