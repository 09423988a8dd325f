"""cuda-like library (cuBLAS-like): ships cubin-like images per sm arch plus PTX-like for newer archs."""

from __future__ import annotations

from ...layers.library import LibraryBase
from .facts import FACTS
from .compiler import ENCODERS


class CudaLikeLibrary(LibraryBase):
    vendor = FACTS["name"]
    facts = FACTS
    encoders = ENCODERS
