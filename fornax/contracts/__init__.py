"""Conformance suites: one per seam, run against any implementation.

A suite is a list of clauses; each clause checks one promise of the seam's
contract by behaviour (never by ``isinstance``), on fresh simulated devices,
and reports pass or fail with a readable reason.  The three built-in
families pass every clause; a new implementation is qualified with
``fornax conform SEAM --impl package.module:VENDOR`` or
``pytest --fornax-impl package.module:VENDOR``.
"""

from .base import SUITES, Result, run_suite, resolve_impl

__all__ = ["SUITES", "Result", "run_suite", "resolve_impl"]
