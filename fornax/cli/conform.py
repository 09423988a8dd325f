"""`fornax conform SEAM`: run a seam's conformance suite against an implementation."""

from __future__ import annotations

import json
import sys

import click

from ..contracts.base import resolve_impl
from ..layers.errors import ConfigError
from ..stack import get_vendor, runnable_vendors
from .errors import debug_option, handle_errors


@click.command()
@click.argument("seam")
@click.option("--vendor", metavar="V", help=f"A registered vendor family ({', '.join(runnable_vendors())}, or a template).")
@click.option("--impl", metavar="MODULE:ATTR", help="A third-party implementation: a fornax Vendor object.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@debug_option
@handle_errors
def conform(seam, vendor, impl, as_json, debug):
    """Check an implementation of SEAM (driver, runtime, compiler, library, framework) clause by clause."""
    from ..contracts.suites import SUITES, run_suite
    if seam not in SUITES:
        raise ConfigError(f"no conformance suite for seam {seam!r}; suites: {', '.join(sorted(SUITES))}")
    if (vendor is None) == (impl is None):
        raise ConfigError("give exactly one of --vendor V or --impl MODULE:ATTR")
    subject = get_vendor(vendor) if vendor else resolve_impl(impl)
    results = run_suite(seam, subject)
    failed = [r for r in results if not r.passed]
    if as_json:
        click.echo(json.dumps({"schema": "fornax.conform/1", "seam": seam,
                               "implementation": subject.name,
                               "passed": len(results) - len(failed), "failed": len(failed),
                               "clauses": [{"id": r.clause.id, "title": r.clause.title,
                                            "passed": r.passed, "detail": r.detail} for r in results]},
                              indent=2))
    else:
        for r in results:
            click.echo(r.line())
        click.echo(f"{seam} conformance of {subject.name}: {len(results) - len(failed)} of "
                   f"{len(results)} clauses pass")
    if failed:
        sys.exit(1)
