"""What a vendor family provides: one factory per seam, and its facts as data.

A vendor package exposes ``VENDOR = Vendor(...)``; built-in families and
third-party ones (through the ``fornax.vendors`` entry-point group) register
the same way.  Each family's facts (API names, error codes, formats, limits)
live in its ``vendor.toml``, read once with :func:`load_facts`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable

from .errors import ConfigError

SEAMS = ("framework", "compiler", "library", "runtime", "driver")


@dataclass(frozen=True)
class Vendor:
    name: str
    description: str
    facts: dict
    driver: Callable[..., Any]       # (devices) -> Driver
    runtime: Callable[..., Any]      # (driver) -> Runtime
    library: Callable[..., Any]      # (runtime) -> Library
    compiler: Callable[..., Any]     # () -> Compiler
    framework: Callable[..., Any]    # (compiler, library, runtime, target) -> Framework

    def factory(self, seam: str) -> Callable[..., Any]:
        return getattr(self, seam)


def load_facts(package: str) -> dict:
    """Read ``vendor.toml`` from a vendor package."""
    try:
        text = (resources.files(package) / "vendor.toml").read_text()
        return tomllib.loads(text)
    except (FileNotFoundError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"vendor package {package} has no readable vendor.toml: {exc}") from None
