"""pytest plugin of a torch-suite run (loaded with ``-p fornax.contracts.torch_suite.plugin``).

It appends to the events file (``FORNAX_TORCH_SUITE_EVENTS``) how many tests were collected
and, per test, pytest's outcome, so the runner can show progress and notice a test that
broke outside its check (an error in setup, a crash of the harness).  RuntimeWarnings raised
from fornax's own modules become errors: no check may pass while fornax warns.
"""

from __future__ import annotations

import json
import os

from . import selection


def _emit(record: dict) -> None:
    path = os.environ.get(selection.EVENTS)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_configure(config) -> None:
    config.addinivalue_line("filterwarnings", r"error::RuntimeWarning:fornax(\..*)?")


def pytest_collection_finish(session) -> None:
    _emit({"event": "collected", "total": len(session.items)})


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" or report.outcome != "passed":
        if report.when != "call" and report.outcome == "skipped":
            outcome = "skipped"
        else:
            outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        _emit({"event": "test", "nodeid": report.nodeid, "when": report.when, "outcome": outcome,
               "error": "" if report.outcome != "failed" else str(report.longrepr)[-600:]})
