"""What a vendor family provides: one factory per seam, and its facts as data.

A vendor package exposes ``VENDOR = Vendor(...)``; built-in families and
third-party ones (through the ``fornax.vendors`` entry-point group) register
the same way.  Each family's facts (API names, error codes, formats, limits)
live in its ``vendor.toml``, read once and checked with
:func:`fornax.vendors.facts_loader.load_facts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


SEAMS = ("framework", "compiler", "library", "runtime", "driver")


@dataclass(frozen=True)
class Vendor:
    name: str
    description: str
    facts: dict[str, Any]
    driver: Callable[..., Any]       # (devices) -> Driver
    runtime: Callable[..., Any]      # (driver) -> Runtime
    library: Callable[..., Any]      # (runtime) -> Library
    compiler: Callable[..., Any]     # () -> Compiler
    framework: Callable[..., Any]    # (compiler, library, runtime, target) -> Framework

    def factory(self, seam: str) -> Callable[..., Any]:
        """The constructor of seam ``seam`` (driver, runtime, library, compiler, framework)."""
        make: Callable[..., Any] = getattr(self, seam)
        return make
