"""rocm-like library (rocBLAS-like): code objects for a fixed list of gfx targets only."""

from __future__ import annotations

from ...layers.library import LibraryBase
from .facts import FACTS
from .compiler import ENCODERS


class RocmLikeLibrary(LibraryBase):
    vendor = FACTS["name"]
    facts = FACTS
    encoders = ENCODERS
