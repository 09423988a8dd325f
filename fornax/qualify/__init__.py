"""The support contract: does a stack support PyTorch, and up to which level?

``fornax qualify`` answers with evidence.  Eight levels, each a promise a user of
the stack relies on, each backed by one or more focused checks that run real work
through the stack and compare it with a reference (CPU eager PyTorch, ``jax.jit``
on the CPU, numpy in float64)::

    L0 device discovered          L4 compile (torch.compile, fornax jit)
    L1 allocation, copies, views  L5 numerics and autocast
    L2 operator coverage          L6 distributed (two devices)
    L3 autograd                   L7 failure handling and diagnosability

A level passes when all of its evidence passes.  The verdict is the highest level
``L`` such that ``L0`` .. ``L`` all pass ("supports PyTorch up to L4"); every level
is run and shown anyway, so a stack that fails ``L2`` but passes ``L3`` says so.

Each piece of evidence names the check, the build (``Stack.describe()`` plus the
fornax, torch and jax versions), the vendor family of the seam it exercises, the
dtype and shape it used, what was measured (a value against a limit) and why it
passed or failed.  A check that raises records the failure with the error message;
the qualification itself never crashes on the stack under test.

Reuse from Python::

    from fornax.qualify import qualify
    from fornax.stack import make_config
    q = qualify(make_config("xpu-like"))            # or a composed Stack, or levels=["L3"]
    print(q.verdict_text)                           # "... supports PyTorch up to L7"
    doc = q.to_json()                               # the fornax.qualify/1 document

The package: :mod:`~fornax.qualify.levels` (the levels, their limits and the evidence
registry), one module of evidence per level (``l0_device``, ``l1_memory``,
``l2_operators``, ``l3_autograd``, ``l4_compile``, ``l5_numerics``, ``l6_distributed``,
``l7_failures``), :mod:`~fornax.qualify.subject` (the stack under test),
:mod:`~fornax.qualify.runner` and :mod:`~fornax.qualify.report` (the answer and its
document).  Each piece of evidence is a :class:`fornax.contracts.clause.Clause` with a
level and a :class:`~fornax.contracts.clause.Measure`, run by the same
:func:`~fornax.contracts.clause.evaluate` as the conformance suites' clauses; its row is a
:class:`~fornax.contracts.clause.Result`.

The torch front end serves one stack per process: qualifying switches it to the
stack under test (``fornax.frameworks.torch.use_stack(stack=...)``) and leaves that
stack active and usable afterwards.  The global torch RNG state is restored.
"""

from __future__ import annotations

from ..contracts.clause import Measure, Outcome, Result
from .levels import (EVIDENCE, LEVEL_IDS, LEVELS, OPINFO_OPS, OPINFO_SAMPLES, OPINFO_THRESHOLD,
                     SCHEMA, TOL, Level, evidence, normalize_level)
from .measure import normwise
from .report import LevelResult, Qualification, evidence_json
from .runner import qualify, run_evidence
from .subject import StackSubject

__all__ = ["EVIDENCE", "LEVEL_IDS", "LEVELS", "OPINFO_OPS", "OPINFO_SAMPLES", "OPINFO_THRESHOLD",
           "SCHEMA", "TOL", "Level", "LevelResult", "Measure", "Outcome", "Qualification", "Result",
           "StackSubject", "evidence", "evidence_json", "normalize_level", "normwise", "qualify",
           "run_evidence"]
