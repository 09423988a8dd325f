"""Clauses and their results: the one mechanism behind conformance and qualification.

A :class:`Clause` is one promise, checked by a function of a *subject* (the thing under
test: a vendor on fresh simulated devices for a seam's conformance suite, a composed
stack for ``fornax qualify``).  The check either raises (the promise is broken, or the
implementation crashed) or returns nothing (kept) or an :class:`Outcome` (what it
measured, whether that meets the clause's limit, one line of detail).

A clause that gives *evidence* also carries the level it belongs to and a
:class:`Measure`: what its value is and the limit it is held to.  :func:`evaluate` runs
any clause on any subject and turns whatever happens into a :class:`Result`; how a raised
exception is worded is the caller's (a suite and a qualification word them differently).
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar, Union

#: a measured value: a count, a rate, an error, a vendor code, a name
Value = Union[float, int, str, bool, None]
#: per-item results of a clause (one per OpInfo, per dtype group, per model, ...)
Cases = list[dict[str, Any]]

S = TypeVar("S")


class ContractFailure(AssertionError):
    """A clause's promise was broken; the message says how."""


@dataclass(frozen=True)
class Measure:
    """What a clause's value is and the limit it is held to (evidence metadata)."""

    measured: str                  # what the value is
    relation: str                  # how the value meets the limit: "<=", ">=" or "=="
    limit: float | int | str | None
    dtype: str | None = None       # the dtype(s) the check used
    shape: str | None = None       # the shape(s) the check used


@dataclass
class Outcome:
    """What a check measured: the value, whether it meets the limit, and a detail line."""

    value: Value
    passed: bool
    detail: str
    cases: Cases | None = None     # per-item results
    build: str | None = None       # the build it ran on, when not the subject's own


@dataclass(frozen=True)
class Clause(Generic[S]):
    """One promise of a seam (``seam``) or of a stack as a whole (``seam`` None), checked
    by ``check(subject)``; ``level`` and ``measure`` make it a piece of evidence."""

    seam: str | None
    id: str
    title: str
    check: Callable[[S], Outcome | None]
    level: str | None = None
    measure: Measure | None = None

    @property
    def ref(self) -> str:
        """``L0.driver`` for evidence of a level, the clause id otherwise."""
        return f"{self.level}.{self.id}" if self.level else self.id


@dataclass(frozen=True)
class Result:
    """What running a clause gave: passed or not, why, and what it measured."""

    clause: Clause[Any]
    passed: bool
    detail: str
    value: Value = None
    wall_s: float = 0.0
    error: str | None = None       # the exception the check raised, in one line
    cases: Cases | None = None
    traceback: str | None = None   # kept for --debug, never part of a document
    build: str | None = None       # the build it ran on (evidence)
    vendor: str | None = None      # the family that answered: the clause's seam's, or every one

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        text = f"{status} {self.clause.seam} {self.clause.id} {self.clause.title}"
        return text if self.passed else f"{text}: {self.detail}"


#: how a runner words an exception a check raised: (detail, error or None)
Explain = Callable[[Exception], "tuple[str, str | None]"]


def evaluate(c: Clause[S], subject: S, explain: Explain) -> Result:
    """Run ``c`` on ``subject``; an exception is a failed result worded by ``explain``,
    never an exception of the runner (an implementation crash must not crash the suite)."""
    t = time.perf_counter()
    try:
        out = c.check(subject)
    except Exception as exc:
        detail, error = explain(exc)
        return Result(c, False, detail, None, time.perf_counter() - t, error=error,
                      traceback=traceback.format_exc())
    wall = time.perf_counter() - t
    if out is None:
        return Result(c, True, "", wall_s=wall)
    return Result(c, bool(out.passed), out.detail, out.value, wall, cases=out.cases, build=out.build)
