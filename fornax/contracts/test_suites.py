"""The conformance clauses as pytest tests (collected with ``pytest --pyargs fornax.contracts``)."""

from __future__ import annotations

from .base import resolve_impl, run_clause


def _vendor(ref: str):
    if ":" in ref:
        return resolve_impl(ref)
    from ..stack import get_vendor
    return get_vendor(ref)


def test_clause(fornax_impl, fornax_clause):
    result = run_clause(fornax_clause, _vendor(fornax_impl))
    assert result.passed, result.line()
