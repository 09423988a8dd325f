"""xpu-like library (oneMKL-like): SPIR-V-like kernels built at load on any device, native for pvc."""

from __future__ import annotations

from ...layers.library import LibraryBase
from .facts import FACTS
from .compiler import ENCODERS


class XpuLikeLibrary(LibraryBase):
    vendor = FACTS["name"]
    facts = FACTS
    encoders = ENCODERS
