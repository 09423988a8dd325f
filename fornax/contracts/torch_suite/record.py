"""The verdict of one check (kind, name, dtype, variant) and the record a run keeps of it.

A check counts its samples: passed, failed, and the first few errors.  Its verdict against
the family's known-failure table:

* no failure and no entry: passed;
* samples that differ from the CPU only within a covering *tolerance entry*'s bounds pass
  (counted as ``tolerated``, as a test passes under PyTorch's ``toleranceOverride``); one
  beyond them fails the check;
* failures and an entry that covers them: *known* (pytest xfail, the reason from the table);
* failures and no entry: the test fails, naming the first errors;
* no failure and an exact OpInfo entry (dtype and variant named, not ``*``): *stale*, the
  test fails (remove the entry).  A wildcard entry, and a ModuleInfo or OptimInfo entry
  (several tests share its key: train and eval mode, optimizer configurations), is stale when
  no check it covers failed: the runner judges that over the whole run.

Every check is appended as one JSON line to the file ``FORNAX_TORCH_SUITE_EVENTS`` names
(when set), which is what :func:`~fornax.contracts.torch_suite.run_suite` reads.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from . import selection
from .known import Entry, KnownFailures

MAX_ERRORS = 3

#: how a sample that fails PyTorch's tolerance but passes a tolerance entry's is reported
WITHIN = "within the table's tolerance: "

_KNOWN: dict[str, KnownFailures] = {}


def family() -> str:
    import fornax.frameworks.torch as ft
    return ft.current().stack.config.seams["framework"]


def known() -> KnownFailures:
    path = os.environ.get(selection.KNOWN)
    key = path or family()
    if key not in _KNOWN:
        _KNOWN[key] = KnownFailures.load(path) if path else KnownFailures.for_family(family())
    return _KNOWN[key]


@dataclass
class Check:
    kind: str
    name: str
    dtype: str
    variant: str
    run: int = 0
    passed: int = 0
    failed: int = 0
    tolerated: int = 0         # passed only within the covering tolerance entry's bounds (in passed)
    errors: list = field(default_factory=list)
    outcome: str = ""          # passed | failed | known | stale | empty | skipped
    reason: str = ""           # the table's reason (known, stale); PyTorch's (skipped)
    entry: str = ""            # the covering entry's key
    wildcard: bool = False

    def add(self, why: str | None, where: str = "") -> None:
        """Count one sample: ``why`` None (not applicable), "" (passed), :data:`WITHIN` + the
        difference (passed at the covering tolerance entry's bounds, as a test passes under
        PyTorch's ``toleranceOverride``) or the failure."""
        if why is None:
            return
        self.run += 1
        if why == "":
            self.passed += 1
            return
        if why.startswith(WITHIN):
            self.passed += 1
            self.tolerated += 1
            return
        self.failed += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(f"{where}: {why}" if where else why)

    def entry_for(self) -> Entry | None:
        return known().find(self.kind, self.name, self.dtype, self.variant)

    def skip(self, reason: str) -> None:
        """Record the check as skipped for ``reason`` (PyTorch's own, see
        :func:`~.compare.upstream_skip`) and skip the test; nothing is counted."""
        import pytest
        self.outcome, self.reason = "skipped", reason
        emit(self)
        pytest.skip(reason)

    def finish(self) -> None:
        """Decide, record, and raise pytest's outcome for this check."""
        import pytest
        entry = self.entry_for()
        if entry is not None:
            self.entry = entry.key()
            # judged over the whole run: a wildcard, or a module checked in train and eval mode
            self.wildcard = "*" in (entry.dtype, entry.variant) or self.kind != "ops"
            self.reason = entry.reason
        if self.run == 0:
            self.outcome = "empty"
        elif self.failed and entry is not None and entry.tolerance is None:
            self.outcome = "known"
        elif self.failed:                 # no entry, or beyond a tolerance entry's bounds
            self.outcome = "failed"
        elif entry is not None and not self.tolerated and not self.wildcard:
            self.outcome = "stale"
        else:
            self.outcome = "passed"
        emit(self)
        label = f"{self.kind} {self.name} {self.dtype} {self.variant}"
        if self.outcome == "known":
            pytest.xfail(f"known on {known().family}: {self.reason}")
        if self.outcome == "failed":
            raise AssertionError(f"{label}: {self.failed}/{self.run} samples differ from CPU"
                                 f"{' beyond the table tolerance ' + str(entry.tolerance) if entry else ''}:\n  "
                                 + "\n  ".join(self.errors))
        if self.outcome == "stale":
            raise AssertionError(f"STALE known failure {self.entry} in {known().path}: all {self.run} "
                                 f"samples now pass on fornax; remove the entry")
        if self.outcome == "empty":
            pytest.skip(f"{label}: no sample applies")


def emit(check: Check) -> None:
    path = os.environ.get(selection.EVENTS)
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"event": "check", **asdict(check)}) + "\n")
