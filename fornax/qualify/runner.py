"""Running a qualification: every wanted level's evidence on the stack under test, in order.

Each piece of evidence is a clause of :mod:`fornax.contracts.clause` run by its
:func:`~fornax.contracts.clause.evaluate`, as a conformance clause is; a check that raises
is recorded with its error (the level fails, the run goes on).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable

from ..contracts.clause import Clause, Result, evaluate
from ..layers.errors import ConfigError, FornaxError
from ..sim.faults import SpecError
from ..sim.spec import load_spec
from ..stack import Stack, StackConfig
from . import (l0_device, l1_memory, l2_operators, l3_autograd, l4_compile,  # noqa: F401  (register
               l5_numerics, l6_distributed, l7_failures)                      # the evidence)
from .clients import SUITE_KINDS
from .levels import EVIDENCE, LEVEL_IDS, LEVELS, normalize_level
from .report import LevelResult, Qualification
from .subject import StackSubject


def qualify(target: StackConfig | Stack, levels: Iterable[str] | None = None,
            progress: Callable[[str], None] | None = None, full: bool = False) -> Qualification:
    """Run the evidence of ``levels`` (default: all, L0..L7) against the stack ``target``
    (a config, composed here, or an already composed Stack) and return the qualification.
    ``progress(check_id)`` is called before each check (``"L2.opinfo"``).  ``full`` runs the
    real-client evidence whole (every OpInfo, ModuleInfo and OptimInfo, a fresh venv for
    packaging) instead of its deterministic sample."""
    wanted = list(LEVEL_IDS) if levels is None else [normalize_level(lv) for lv in levels]
    if not wanted:
        raise ConfigError("no level to run", hint=f"levels: {', '.join(LEVEL_IDS)}")
    config = target.config if isinstance(target, Stack) else target
    if config.meta:
        raise ConfigError("a shape-only (meta) stack computes no values, so it cannot be "
                          "qualified", hint="set meta = false in the stack config")
    try:
        load_spec(config.spec)
    except SpecError as exc:
        raise ConfigError(str(exc)) from None
    subject = StackSubject(target)
    subject.full = bool(full)
    subject.suite_kinds = tuple(kind for lv, kind in SUITE_KINDS.items() if lv in wanted)
    t0 = time.perf_counter()
    results = [LevelResult(lv, lv.id in wanted) for lv in LEVELS]
    import torch
    with torch.random.fork_rng(devices=[]):
        for lr in results:
            if not lr.ran:
                continue
            for c in EVIDENCE.get(lr.level.id, []):
                if progress is not None:
                    progress(c.ref)
                lr.evidence.append(run_evidence(subject, c))
        if subject.torch_used:
            try:                    # leave the stack under test active and usable
                subject.torch()
            except FornaxError:
                pass
    return Qualification(subject.describe(), config.describe(), subject.versions, results,
                         time.perf_counter() - t0, subject.full)


def _explain(exc: Exception) -> tuple[str, str | None]:
    """A qualification's words for evidence that raised: the stack under test misbehaved."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    return f"raised {type(exc).__name__}: {msg}", f"{type(exc).__name__}: {msg}"


def run_evidence(subject: StackSubject, c: Clause[StackSubject]) -> Result:
    """One piece of evidence on the subject, with the build it ran on and the family that
    answered."""
    seams = subject.config.seams
    vendor = seams[c.seam] if c.seam else ", ".join(sorted(set(seams.values())))
    subject.current = c.ref
    result = evaluate(c, subject, _explain)
    return dataclasses.replace(result, build=result.build or subject.build(), vendor=vendor)
