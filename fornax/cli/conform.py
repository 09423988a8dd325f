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
@click.option("--over", metavar="FAMILY",
              help="Check the compiler or library of --vendor as it reaches FAMILY's driver by a "
                   "declared portability path (cross-compile, translation, port, marshalling).")
@click.option("--path", "path", metavar="NAME",
              help="With --over: the path to check where several are declared (default: the one "
                   "compose picks).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@debug_option
@handle_errors
def conform(seam, vendor, impl, as_json, debug, over=None, path=None):
    """Check an implementation of SEAM (driver, runtime, compiler, library, framework) clause by clause."""
    from ..contracts.suites import SUITES, run_suite
    if seam not in SUITES:
        raise ConfigError(f"no conformance suite for seam {seam!r}; suites: {', '.join(sorted(SUITES))}")
    if (vendor is None) == (impl is None):
        raise ConfigError("give exactly one of --vendor V or --impl MODULE:ATTR")
    crossing = None
    if path is not None and over is None:
        raise ConfigError("--path goes with --over FAMILY", hint="e.g. --over rocm-like --path hipify-like")
    if over is not None:
        if vendor is None:
            raise ConfigError("--over goes with --vendor V (a registered family)")
        from ..contracts.paths import path_subject
        subject, crossing = path_subject(seam, vendor, over, path)
    else:
        subject = get_vendor(vendor) if vendor else resolve_impl(impl)
    results = run_suite(seam, subject)
    failed = [r for r in results if not r.passed]
    what = subject.name if crossing is None else (f"{vendor} over {over} by {crossing['mechanism']} "
                                                  f"{crossing['name']}")
    if as_json:
        click.echo(json.dumps({"schema": "fornax.conform/1", "seam": seam,
                               "implementation": what,
                               "passed": len(results) - len(failed), "failed": len(failed),
                               "clauses": [{"id": r.clause.id, "title": r.clause.title,
                                            "passed": r.passed, "detail": r.detail} for r in results]},
                              indent=2))
    else:
        for r in results:
            click.echo(r.line())
        if crossing is not None:
            click.echo(f"path: {crossing['real_name']}")
        click.echo(f"{seam} conformance of {what}: {len(results) - len(failed)} of "
                   f"{len(results)} clauses pass")
    if failed:
        sys.exit(1)
