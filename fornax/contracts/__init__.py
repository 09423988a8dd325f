"""Conformance suites: one per seam, run against any implementation.

A suite is a list of clauses; each clause checks one promise of the seam's
contract by behaviour (never by ``isinstance``), on fresh simulated devices,
and reports pass or fail with a readable reason.  The three built-in
families pass every clause; a new implementation is qualified with
``fornax conform SEAM --impl package.module:VENDOR`` or
``pytest --fornax-impl package.module:VENDOR``.

``SUITES`` and ``run_suite`` come from :mod:`fornax.contracts.suites`, loaded on first
use (the pytest plugin lives in this package, so importing it stays light).
"""

from __future__ import annotations

from typing import Any

from .base import Result, resolve_impl

__all__ = ["SUITES", "Result", "run_suite", "resolve_impl"]


def __getattr__(name: str) -> Any:
    if name in ("SUITES", "run_suite"):
        from . import suites
        return getattr(suites, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
