"""The answer of a qualification: every level with its evidence, the verdict, and the
``fornax.qualify/1`` document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..contracts.clause import Result, Value
from .levels import OPINFO_THRESHOLD, SCHEMA, Level


def jsonable(v: object) -> Value:
    """A measured value as JSON has it (numpy scalars unwrapped, a non-finite float as text)."""
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return cast(Value, v.item())
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return cast(Value, v)


def evidence_json(e: Result) -> dict[str, Any]:
    """One evidence row of the document: the clause, what it measured, the build it ran on."""
    c = e.clause
    m = c.measure
    if m is None:
        raise ValueError(f"clause {c.ref} measures nothing: it is not evidence of a level")
    doc: dict[str, Any] = {
        "check": c.ref, "title": c.title, "build": e.build, "seam": c.seam, "vendor": e.vendor,
        "dtype": m.dtype, "shape": m.shape, "measured": m.measured, "value": jsonable(e.value),
        "relation": m.relation, "limit": m.limit, "passed": e.passed, "detail": e.detail,
        "error": e.error, "wall_s": round(e.wall_s, 4)}
    if e.cases is not None:
        doc["cases"] = e.cases
    return doc


@dataclass
class LevelResult:
    level: Level
    ran: bool
    evidence: list[Result] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.ran and bool(self.evidence) and all(e.passed for e in self.evidence)

    @property
    def status(self) -> str:
        return "not run" if not self.ran else "pass" if self.passed else "fail"

    def to_json(self) -> dict[str, Any]:
        lv = self.level
        return {"level": lv.id, "title": lv.title, "promise": lv.promise, "status": self.status,
                "evidence_passed": sum(e.passed for e in self.evidence),
                "evidence_total": len(self.evidence),
                "wall_s": round(sum(e.wall_s for e in self.evidence), 4),
                "evidence": [evidence_json(e) for e in self.evidence]}


@dataclass
class Qualification:
    """The answer: every level with its evidence, and the verdict."""

    stack: str                     # Stack.describe() (or the config's seams if it did not compose)
    config: dict[str, Any]
    build: dict[str, str | None]
    levels: list[LevelResult]
    wall_s: float
    full: bool = False             # the real-client evidence ran whole, not sampled

    @property
    def verdict(self) -> str | None:
        """The highest level L such that L0 .. L all pass (None: L0 did not pass or was not run)."""
        best = None
        for lr in self.levels:
            if not lr.passed:
                break
            best = lr.level.id
        return best

    @property
    def passed(self) -> bool:
        """Every level that ran passed."""
        return all(lr.passed for lr in self.levels if lr.ran)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def verdict_text(self) -> str:
        ran = [lr for lr in self.levels if lr.ran]
        passed = [lr.level.id for lr in ran if lr.passed]
        failed = [lr.level.id for lr in ran if not lr.passed]
        if len(ran) < len(self.levels):
            said = "; ".join(f"{label}: {', '.join(ids)}"
                             for label, ids in (("pass", passed), ("fail", failed)) if ids)
            return (f"{self.stack}: {said} (only {', '.join(lr.level.id for lr in ran)} run; "
                    "the verdict needs every level)")
        if self.verdict is None:
            return f"{self.stack} does not support PyTorch: L0 fails"
        tail = "every level passes" if not failed else f"failing: {', '.join(failed)}"
        return f"{self.stack} supports PyTorch up to {self.verdict} ({tail})"

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "stack": self.stack, "config": self.config, "build": self.build,
                "levels_run": [lr.level.id for lr in self.levels if lr.ran],
                "verdict": self.verdict, "verdict_text": self.verdict_text,
                "passed": self.passed, "full": self.full, "opinfo_threshold": OPINFO_THRESHOLD,
                "wall_s": round(self.wall_s, 3),
                "levels": [lr.to_json() for lr in self.levels]}
