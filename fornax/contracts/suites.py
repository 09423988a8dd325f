"""Every seam's conformance suite, loaded, and the runner of one suite by seam name.

The suites register their clauses into :data:`fornax.contracts.base.SUITES` when their
modules (named after the seams) are imported; this module imports all five, so
``SUITES`` here holds every suite.
"""

from __future__ import annotations

from ..layers.errors import ConfigError
from ..layers.vendor import Vendor
from . import compiler, driver, framework, library, runtime  # noqa: F401  (register the suites)
from .base import SUITES, Result, run_clause

__all__ = ["SUITES", "run_suite"]


def run_suite(seam: str, vendor: Vendor) -> list[Result]:
    """Every clause of ``seam``'s suite run on ``vendor``, in order."""
    if seam not in SUITES:
        raise ConfigError(f"no conformance suite for seam {seam!r}; suites: {', '.join(sorted(SUITES))}")
    return [run_clause(c, vendor) for c in SUITES[seam]]
