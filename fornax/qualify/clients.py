"""Real-client evidence shared by several levels: PyTorch's own databases (OpInfo,
ModuleInfo, OptimInfo) through PyTorch's device-generic harness, and the real models (the
transformers zoo).  What runs is narrowed by :mod:`fornax.qualify_clients`'s ``SUITE_ONLY``,
``ZOO_MODELS`` and ``JAX_PROGRAMS`` (read at run time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import qualify_clients as narrow
from ..contracts.clause import Outcome
from .subject import StackSubject

if TYPE_CHECKING:
    from ..contracts.torch_suite.result import SuiteResult


def need(*modules: str) -> None:
    """Real-client evidence needs the ``clients`` extra; say so instead of an ImportError."""
    import importlib.util
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"this evidence needs {', '.join(missing)}: install fornax[clients] "
                           "(pinned in constraints.txt)")


# ---------------------------------------------------------------------------------------------
# PyTorch's own databases (OpInfo, ModuleInfo, OptimInfo) through PyTorch's device-generic harness
def torch_suite_family(s: StackSubject) -> str:
    """The family the torch suite composes: the suite runs whole families in fresh
    processes (``FORNAX_VENDOR``), so a stack that mixes families is refused."""
    names = set(s.config.seams.values())
    if len(names) != 1:
        raise RuntimeError("PyTorch's test suite runs on whole families (FORNAX_VENDOR in a "
                           f"fresh process); this stack mixes {', '.join(sorted(names))}")
    return names.pop()


#: the level whose evidence reads each kind of the suite (``suite_outcome`` in its module)
SUITE_KINDS = {"L2": "ops", "L3": "modules", "L5": "optims"}


def suite_result(s: StackSubject, kind: str) -> SuiteResult:
    """The suite's result for ``kind`` on the subject's family, run once per qualification:
    at the first request, every kind the levels being run read (``s.suite_kinds``) runs, in
    one subprocess for the sample, so PyTorch's databases are imported once."""
    need("pytest", "expecttest")
    from ..contracts.torch_suite.runner import run_suite
    cache = s.torch_suite
    if kind not in cache:
        kinds = (kind, *(k for k in s.suite_kinds if k != kind and k not in cache))
        res = run_suite(torch_suite_family(s), full=s.full, kinds=kinds, only=narrow.SUITE_ONLY)
        for k in kinds:
            cache[k] = res
    return cache[kind]


def suite_outcome(s: StackSubject, kind: str) -> Outcome:
    """The evidence of PyTorch's ``kind`` database (ops, modules, optims): every dtype group
    meets its target and every failure is a listed known one."""
    from ..contracts.torch_suite.result import target
    res = suite_result(s, kind)
    groups = res.kinds.get(kind, {})
    failures = [f for f in res.failures if f["kind"] == kind]       # a run may hold other kinds
    stale = [e for e in res.stale if e.split(":", 1)[0] == kind]
    cases = [{"group": g, **c.to_json(), "target": target(kind, g)} for g, c in sorted(groups.items())]
    run = sum(c.run for c in groups.values())
    passed = sum(c.passed for c in groups.values())
    low = {g: (c.rate, target(kind, g)) for g, c in groups.items() if c.rate < target(kind, g)}
    problems = []
    if not run:
        problems.append("no check ran")
    problems += [f"{g} {r:.2%} < {t:.1%}" for g, (r, t) in sorted(low.items())]
    if failures:
        f = failures[0]
        problems.append(f"{len(failures)} failure(s) no known-failure entry names, first "
                        f"{f['name']} {f['dtype']} {f['variant']}: {f['error'][:160]}")
    if stale:
        problems.append(f"stale known-failure entries: {', '.join(stale[:4])}")
    problems += [f"run broken: {e[:200]}" for e in res.errors[:2]]
    scope = "everything" if s.full else "the deterministic sample"
    if narrow.SUITE_ONLY:
        scope += f" narrowed to {', '.join(narrow.SUITE_ONLY)}"
    detail = (f"{scope}: {passed}/{run} pass; "
              + ", ".join(f"{g} {c.rate:.2%}" + (f" ({c.known} known)" if c.known else "")
                          for g, c in sorted(groups.items())))
    return Outcome(round(passed / run, 6) if run else 0.0, not problems,
                   "; ".join(problems) or detail, cases)


# ---------------------------------------------------------------------------------------------
# real models: the transformers zoo (PyTorch; the equinox/optax programs are L4's)
def zoo_outcome(s: StackSubject, modes: tuple[str, ...]) -> Outcome:
    """The evidence of the transformers zoo in ``modes``: every model-mode matches CPU."""
    need("transformers")
    from ..scenarios import hf_zoo
    s.torch()
    results = [hf_zoo.run_model(name, None, modes) for name in narrow.ZOO_MODELS or hf_zoo.ZOO]
    cases = [r.to_json() for r in results]
    bad = [(r.model, mode, m) for r in results for mode, m in r.modes.items() if not m.ok]
    ran = sum(len(r.modes) for r in results)
    worst = max(((r.model, mode, m) for r in results for mode, m in r.modes.items()
                 if m.max_error is not None), key=lambda t: t[2].max_error or 0.0, default=None)
    detail = (f"{len(results)} models{' (narrowed)' if narrow.ZOO_MODELS else ''}, "
              f"{ran - len(bad)}/{ran} model-modes match CPU")
    if worst:
        detail += f"; largest error {worst[2].max_error:.2e} ({worst[0]} {worst[1]}: {worst[2].worst_tensor})"
    problems = [f"{model} {mode}: " + (m.error or f"{m.worst_tensor} differs by {m.max_error:.2e}")
                for model, mode, m in bad]
    return Outcome(f"{ran - len(bad)}/{ran}", not bad and ran > 0,
                   "; ".join(p[:240] for p in problems[:4]) or detail, cases)
