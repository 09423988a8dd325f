"""What a run of the torch suite found: counts per kind and dtype, failures, stale entries.

Counts are of *samples* for OpInfos (one OpInfo sample in one variant is one count) and of
checks for ModuleInfos and OptimInfos (one module input or one optimizer configuration in
one check).  ``run = passed + failed + known``; ``tolerated`` counts the passed samples
that matched the CPU only within a tolerance entry's bounds: *known* are the failing samples a
known-failure entry covers, *failed* the ones none does; *stale* counts the entries that
matched a check in which nothing failed.  OpInfo backward counts under ``float32.backward``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: pass-rate targets (issue 14): float32 OpInfo samples, other dtypes and backward, the rest
TARGETS = {"ops": {"float32": 0.995, "*": 0.99}, "modules": {"*": 1.0}, "optims": {"*": 1.0}}


def target(kind: str, group: str) -> float:
    t = TARGETS[kind]
    return t.get(group, t["*"])


@dataclass
class Counts:
    run: int = 0
    passed: int = 0
    failed: int = 0
    known: int = 0
    stale: int = 0
    tolerated: int = 0         # of passed: within a tolerance entry's bounds only

    @property
    def rate(self) -> float:
        return self.passed / self.run if self.run else 1.0

    def to_json(self) -> dict:
        return {"run": self.run, "passed": self.passed, "tolerated": self.tolerated, "failed": self.failed,
                "known": self.known, "stale": self.stale, "rate": round(self.rate, 6)}


def group_of(check: dict) -> str:
    if check["kind"] != "ops":
        return "all"
    return f"{check['dtype']}.backward" if check["variant"] == "backward" else check["dtype"]


@dataclass
class SuiteResult:
    vendor: str
    full: bool
    kinds: dict = field(default_factory=dict)          # kind -> group -> Counts
    failures: list = field(default_factory=list)       # {kind, name, dtype, variant, error}
    stale: list = field(default_factory=list)          # entry keys that no longer fail
    errors: list = field(default_factory=list)         # what broke outside a check (a crash...)
    checks: int = 0

    def add(self, check: dict) -> None:
        """Count one check record (see :mod:`.record`)."""
        self.checks += 1
        c = self.kinds.setdefault(check["kind"], {}).setdefault(group_of(check), Counts())
        c.run += check["run"]
        c.passed += check["passed"]
        c.tolerated += check.get("tolerated", 0)
        if check["outcome"] == "known":
            c.known += check["failed"]
        else:
            c.failed += check["failed"]
        if check["outcome"] == "stale":
            c.stale += 1
            self.stale.append(check["entry"])
        if check["outcome"] == "failed":
            for err in check["errors"] or ["failed"]:
                self.failures.append({"kind": check["kind"], "name": check["name"], "dtype": check["dtype"],
                                      "variant": check["variant"], "error": err})

    @property
    def rates(self) -> dict:
        """``{"kind/group": pass rate}``."""
        return {f"{k}/{g}": c.rate for k, groups in self.kinds.items() for g, c in sorted(groups.items())}

    def below_target(self) -> dict:
        """``{"kind/group": (rate, target)}`` of the groups under their target."""
        return {f"{k}/{g}": (c.rate, target(k, g)) for k, groups in self.kinds.items() for g, c in groups.items()
                if c.rate < target(k, g)}

    @property
    def ok(self) -> bool:
        """No unexpected failure, no stale entry, nothing broken outside a check."""
        return not self.failures and not self.stale and not self.errors

    def to_json(self) -> dict:
        return {"vendor": self.vendor, "full": self.full,
                "kinds": {k: {g: c.to_json() for g, c in sorted(groups.items())}
                          for k, groups in self.kinds.items()},
                "failures": list(self.failures), "stale": list(self.stale), "errors": list(self.errors)}
