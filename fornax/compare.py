"""One workload over a matrix of stacks, side by side: what ``fornax compare`` runs.

A *run* is one workload through one composed stack from one front end: built in
the graph IR (``graph``), a ``torch.nn`` program on ``torch.device("fornax")``
(``torch``) or a JAX function through ``fornax.frameworks.jax.jit`` (``jax``).
:func:`prepare` checks and composes it, :func:`execute` runs it and builds its
``fornax.report/1`` document; ``fornax compose`` is exactly one such run, and
``fornax compare`` is many of them.

A *matrix* is a list of :class:`Column` — vendor families (every seam from one
family) or stack config files, crossed with front ends — made by :func:`columns`,
which checks every argument before anything runs.  :func:`compare` composes every
column's stack first (a stack that cannot be composed is a configuration error,
so nothing has run when it is reported), then runs them one after the other and
returns the ``fornax.compare/1`` document: per column its stack, front end,
status, the compared metrics (:data:`METRICS`) and the run's full report.  A run
that fails keeps its error in its column; the other columns still run::

    from fornax.compare import columns, compare
    doc = compare(columns("mlp", frameworks=["torch", "jax"], vendors=["cuda-like"]))
    [c["metrics"]["device_time_s"] for c in doc["columns"]]

Every column of one matrix runs in the same process, one after the other; each
has a stack of its own (fresh devices, fresh caches) and, for torch, a fresh
front-end session on it, so no run sees another's counters.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union, cast

import numpy as np
from pathlib import Path

from . import report as report_mod
from .layers.errors import ConfigError, FornaxError
from .scenarios.workloads import DEFAULT_WORKLOAD, Workload, get_workload, numerics
from .sim.faults import FaultPlan
from .stack import Stack, StackConfig, compose, load_config, make_config, runnable_vendors

if TYPE_CHECKING:
    from .frameworks.jax import Client
    from .layers.framework import RunResult
    from .scenarios.jax_workloads import JaxRun, JaxWorkload
    from .scenarios.max_workloads import MaxRun, MaxWorkload
    from .scenarios.torch_workloads import TorchRun, TorchWorkload

#: a workload of any front end: a graph workload, a torch.nn program, a JAX function or a
#: MAX-style graph
AnyWorkload = Union[Workload, "TorchWorkload", "JaxWorkload", "MaxWorkload"]

SCHEMA = "fornax.compare/1"
#: where each front end places its public hardware boundary: where the vendor's code begins,
#: and what the vendor gets to see there (a comparison across front ends shows these rows)
BOUNDARIES: dict[str, dict[str, str]] = {
    "graph": {"begins": "the framework seam: fornax's graph IR, compiled by the stack",
              "sees": "the whole graph (the compiler fuses and picks kernels)"},
    "torch": {"begins": "the ATen dispatcher (PrivateUse1 kernels, one per op); torch.compile "
                        "hands the backend an FX graph",
              "sees": "one ATen op at a time in eager mode; a traced graph under torch.compile"},
    "jax": {"begins": "above PJRT: fornax.frameworks.jax.jit takes the traced program",
            "sees": "the whole program as a jaxpr (JAX's primitives); never kernels"},
    "jax-pjrt": {"begins": "PJRT, JAX's real boundary: the plugin's C API (compile, execute, buffers, events)",
                 "sees": "the whole program as StableHLO bytecode with compile options; never kernels"},
    "max": {"begins": "the graph compiler, plus the custom ops' kernels through the library",
            "sees": "the whole graph, and the kernels the user wrote for custom ops"},
}
#: where a workload comes from: the graph IR, a torch.nn program, a JAX function, a MAX-style graph
FRAMEWORKS = ("graph", "torch", "jax", "jax-pjrt", "max")
def default_vendors() -> list[str]:
    """The families a matrix crosses when no --vendors (and no --stack) is given: every
    runnable registered family (the one registry, :func:`fornax.stack.runnable_vendors`)."""
    return runnable_vendors()


# ---- one run -------------------------------------------------------------------------------------
def resolve_workload(framework: str, name: str | None, flag: str = "--framework"):
    """The workload ``name`` (the framework's default when None) of front end ``framework``:
    a graph :class:`~fornax.scenarios.workloads.Workload`, a torch or a jax workload.  A name
    that exists only for other front ends says which to ask for (with option ``flag``)."""
    if framework not in FRAMEWORKS:
        raise ConfigError(f"unknown framework {framework!r}; available: {', '.join(FRAMEWORKS)}")
    if framework == "torch":
        from .scenarios import torch_workloads
        return torch_workloads.get_workload(name or torch_workloads.DEFAULT_WORKLOAD)
    if framework in ("jax", "jax-pjrt"):
        from .scenarios import jax_workloads
        return jax_workloads.get_workload(name or jax_workloads.DEFAULT_WORKLOAD)
    if framework == "max":
        from .scenarios import max_workloads
        return max_workloads.get_workload(name or max_workloads.DEFAULT_WORKLOAD)
    try:
        return get_workload(name or DEFAULT_WORKLOAD)
    except ConfigError as exc:
        from .scenarios.jax_workloads import WORKLOADS as JAX_WORKLOADS
        from .scenarios.max_workloads import WORKLOADS as MAX_WORKLOADS
        from .scenarios.torch_workloads import WORKLOADS as TORCH_WORKLOADS
        kinds = [k for k, table in (("torch", TORCH_WORKLOADS), ("jax", JAX_WORKLOADS), ("max", MAX_WORKLOADS))
                 if name in table]
        if kinds:
            raise ConfigError(exc.message, hint=f"{name} is a {' and '.join(kinds)} workload: "
                              f"add {' or '.join(f'{flag} {k}' for k in kinds)}") from None
        raise


@dataclass
class Prepared:
    """A run ready to go: its config, front end, workload and composed stack (and, for jax,
    the run's own PJRT-shaped client over that stack)."""

    config: StackConfig
    framework: str
    workload: AnyWorkload
    stack: Stack
    client: Client | None = None


def prepare(cfg: StackConfig, framework: str, workload: str | None, origin: str = "fornax") -> Prepared:
    """Check that ``workload`` of ``framework`` can run on ``cfg`` and compose the stack.
    Every mistake here is a :class:`ConfigError` (nothing has run yet); ``origin`` names the
    JAX client (``client.describe()``)."""
    wl = resolve_workload(framework, workload)
    if framework in ("torch", "jax", "jax-pjrt", "max") and cfg.meta:
        raise ConfigError(f"--framework {framework} computes real values on the fornax device; a "
                          "shape-only (--meta) stack cannot back it")
    if framework == "graph" and wl.meta_only and not cfg.meta:
        raise ConfigError(f"workload {wl.name} needs shape-only mode: add --meta, or meta = true in "
                          "the stack config file (its weights and activations are too large to "
                          "hold as data)")
    if cfg.parallel is not None:
        from .scenarios.parallel import check
        check(wl.name, framework, cfg.devices, cfg.parallel, cfg.meta)
    client = None
    if framework == "jax-pjrt":
        # the PJRT plugin's own client when this process registered it for this stack; else the
        # run goes to a process of its own (one plugin per process, registered before JAX starts)
        from .compare_pjrt import plugin_client
        client = plugin_client(cfg)
        if client is not None:
            return Prepared(cfg, framework, wl, client.stack, client)
    stack = compose(cfg)
    if framework == "jax":
        from .frameworks.jax import Client
        client = Client(stack, origin)
    return Prepared(cfg, framework, wl, stack, client)


@dataclass
class Outcome:
    """A finished run: its ``fornax.report/1`` document and, when it failed, the error's
    message (with the vendor code and the hint)."""

    stack: Stack
    report: dict
    failed: str | None = None
    #: one-off costs a run in a process of its own paid there (its warm-up), else None
    one_off: dict | None = None

    @property
    def numerics_ok(self) -> bool:
        return all(n["ok"] for n in self.report["numerics"])


def execute(prep: Prepared, *, faults: FaultPlan | None = None, debug: bool = False) -> Outcome:
    """Run a prepared workload and build its report.  A fornax error raised while running is
    recorded in the report's ``errors`` (``debug`` re-raises it instead); the report then says
    what ran until the failure.  Host wall time excludes building the graph workload."""
    cfg, framework, wl, stack = prep.config, prep.framework, prep.workload, prep.stack
    if framework == "jax-pjrt" and prep.client is None:
        from .compare_pjrt import run_in_worker
        try:
            return run_in_worker(prep, faults=faults, debug=debug)
        except FornaxError as exc:       # the worker never reported: the column says why, the others run
            if debug:
                raise
            rep = report_mod.build(stack, wl.name, None, [], 0.0, [exc.to_dict()], framework=framework)
            return Outcome(stack, rep, str(exc))
    if faults is not None:
        for device in stack.devices:
            device.inject(faults)
    graph, feeds = (wl.build(cfg.seed) if isinstance(wl, Workload) and wl.runner is None
                    and wl.build is not None and cfg.parallel is None else (None, None))
    t0 = time.perf_counter()
    errors: list[dict[str, Any]] = []
    result: RunResult | None = None
    nums: list[dict[str, Any]] = []
    scenario: dict[str, Any] | None = None
    parallel: dict[str, Any] | None = None
    frun: TorchRun | JaxRun | MaxRun | None = None
    failed: str | None = None
    try:
        if framework == "torch":            # a torch.nn program through the torch front end
            from .scenarios import torch_workloads
            frun = torch_workloads.run(wl.name, stack, seed=cfg.seed)
            nums = frun.numerics
        elif framework == "jax":            # a JAX function through fornax.frameworks.jax.jit
            from .scenarios import jax_workloads
            frun = jax_workloads.run(wl.name, prep.client, seed=cfg.seed)
            nums = frun.numerics
        elif framework == "jax-pjrt":       # plain jax.jit on the fornax PJRT platform of this process
            from .scenarios import jax_workloads
            frun = jax_workloads.run_pjrt(wl.name, seed=cfg.seed)
            nums = frun.numerics
        elif framework == "max":            # a MAX-style graph through an InferenceSession
            from .scenarios import max_workloads
            frun = max_workloads.run(wl.name, stack, seed=cfg.seed)
            nums = frun.numerics
        elif cfg.parallel is not None:      # every device runs a rank (fornax.scenarios.parallel)
            from .scenarios import parallel as parallel_mod
            result, nums, parallel = parallel_mod.run(stack, wl.name, cfg.parallel, cfg.seed)
        elif isinstance(wl, Workload) and wl.runner is not None:   # a scenario that drives the stack
            result, scenario = wl.runner(stack, cfg.seed)
        elif graph is not None and feeds is not None:
            result = stack.run(graph, feeds)
            # meta: no data; otherwise the stack hands back arrays
            nums = [] if cfg.meta else numerics(graph, cast("list[np.ndarray]", result.outputs), feeds)
    except FornaxError as exc:
        if debug:
            raise
        errors.append(exc.to_dict())
        failed = str(exc)
    wall = frun.host_wall_s if frun is not None else time.perf_counter() - t0
    rep = report_mod.build(stack, wl.name, result, nums, wall, errors, framework=framework)
    if scenario is not None:
        rep["scenario"] = scenario
    if parallel is not None:
        rep["parallel"] = parallel
    if framework == "torch":
        rep["torch"] = _torch_section(frun)
    if framework in ("jax", "jax-pjrt"):
        rep["jax"] = _jax_section(frun, prep.client)
    if framework == "max" and frun is not None:
        rep["max"] = {**cast("MaxRun", frun).boundary, "stack": stack.describe()}
    report_mod.front_end_counts(rep)
    return Outcome(stack, rep, failed)


def _torch_section(trun) -> dict:
    """``report["torch"]`` for a torch workload; after a failed run, what the front end did
    until the failure (the run had a fresh front-end session of its own)."""
    if trun is not None:
        return report_mod.torch_section(trun.routes, mode=trun.mode, stack=trun.stack,
                                        losses=trun.losses, reference_losses=trun.reference_losses,
                                        reference_wall_s=trun.reference_wall_s)
    import fornax.frameworks.torch as ft

    from .scenarios.torch_workloads import route_delta
    session = ft.current()
    return report_mod.torch_section(route_delta({}, session.report()), stack=session.describe())


def _jax_section(jrun, client) -> dict:
    """``report["jax"]`` for a jax workload; after a failed run, what the run's client did
    until the failure."""
    from .scenarios.jax_workloads import route_delta
    if jrun is not None:
        return report_mod.jax_section(jrun.routes, stack=jrun.stack, platform=jrun.platform,
                                      plugin=jrun.plugin, platform_version=jrun.platform_version,
                                      losses=jrun.losses,
                                      reference_losses=jrun.reference_losses,
                                      reference_wall_s=jrun.reference_wall_s, received=jrun.received)
    rep = client.report()
    return report_mod.jax_section(route_delta({}, rep), stack=rep["stack"], platform=rep["platform"],
                                  plugin=rep["plugin"],
                                  platform_version=rep["platform_version"])


# ---- the compared metrics ------------------------------------------------------------------------
def fallback_count(rep: dict) -> int:
    """Work that ran on the CPU instead of the device: graph nodes the framework seam sent to
    the CPU, plus, for a torch or jax run, the front end's fallbacks (ATen calls, jaxpr
    equations) counted as often as they ran."""
    front = (rep.get("torch") or rep.get("jax") or {}).get("fallbacks", [])
    return len(rep["fallbacks"]) + sum(f["count"] for f in front)


def max_rel_err(rep: dict) -> float | None:
    """The largest normwise relative error over the run's outputs; None when nothing was
    checked (a shape-only run, or a run that failed)."""
    errs = [n["max_rel_err"] for n in rep["numerics"]]
    return max(errs) if errs else None


@dataclass(frozen=True)
class Metric:
    """One compared row: ``key`` in a column's ``metrics``, its label, its unit (``s``,
    ``count``, ``bytes``, ``J`` or ``ratio``) and how it is read from a report."""

    key: str
    label: str
    unit: str
    value: Callable[[dict], float | int | None]


def _cost(key: str) -> Callable[[dict], float | int]:
    return lambda rep: rep["costs"][key]


METRICS: tuple[Metric, ...] = (
    Metric("device_time_s", "device time (simulated)", "s", _cost("device_time_s")),
    Metric("host_wall_s", "host wall time", "s", _cost("host_wall_s")),
    Metric("kernels", "kernels", "count", _cost("kernels")),
    Metric("launches", "launches", "count", _cost("launches")),
    Metric("fused_kernels", "fused kernels", "count", _cost("fused_kernels")),
    Metric("library_calls", "library calls", "count", _cost("library_calls")),
    Metric("copies", "copies", "count", _cost("copies")),
    Metric("h2d_bytes", "H2D bytes", "bytes", _cost("h2d_bytes")),
    Metric("d2h_bytes", "D2H bytes", "bytes", _cost("d2h_bytes")),
    Metric("peak_device_bytes", "peak device memory", "bytes", _cost("peak_device_bytes")),
    Metric("fallbacks", "CPU fallbacks", "count", fallback_count),
    Metric("max_rel_err", "max rel. error vs float64", "ratio", max_rel_err),
    Metric("energy_j", "energy (simulated)", "J", _cost("energy_j")),
)


def metrics(rep: dict) -> dict:
    """Every metric of :data:`METRICS` read from one ``fornax.report/1`` document."""
    return {m.key: m.value(rep) for m in METRICS}


# ---- the matrix ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One column of a comparison: a workload on a stack config from a front end, under a label."""

    label: str
    config: StackConfig
    framework: str
    workload: str
    file: str | None = None          # the stack config file it came from (None: a vendor family)


def _names(items, what: str, known: list[str]) -> list[str]:
    """Split comma-separated ``items`` (the values of option ``what``) into names, each one of
    ``known`` and none twice."""
    names = [n.strip() for item in items for n in str(item).split(",")]
    if any(not n for n in names):
        raise ConfigError(f"{what} takes a comma-separated list of names, got {','.join(map(str, items))!r}")
    for n in names:
        if n not in known:
            raise ConfigError(f"unknown {what.removeprefix('--').rstrip('s')} {n!r} in {what}; "
                              f"available: {', '.join(known)}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{what} names {', '.join(dup)} more than once")
    return names


def _stack_config(path: str, spec: str | None, seed: int | None) -> StackConfig:
    """A --stack file read as ``fornax compose --config`` reads it, --spec / --seed on top."""
    if Path(path).is_dir():
        raise ConfigError(f"--stack {path} is a folder, not a stack config file")
    try:
        base = load_config(path)
    except OSError as exc:
        raise ConfigError(f"--stack {path}: cannot read the file: {exc.strerror or exc}") from None
    return make_config(spec=spec, seed=seed, base=base)


def _file_labels(paths: list[str]) -> list[str]:
    """Column names for stack files: the file's stem, or the path as given where stems repeat."""
    stems = [Path(p).stem for p in paths]
    return [s if stems.count(s) == 1 else p for s, p in zip(stems, paths)]


def columns(workload: str | None = None, *, vendors=None, frameworks=None, stacks=None,
            spec: str | None = None, seed: int | None = None) -> list[Column]:
    """The columns of a comparison, every argument checked (a :class:`ConfigError` names the
    first mistake; nothing is composed or run).  ``vendors`` (default :func:`default_vendors`)
    and ``stacks`` (stack config files) are exclusive; each is crossed with ``frameworks``
    (default graph), and ``workload`` (default mlp) must exist for every framework asked."""
    fws = _names(frameworks, "--frameworks", list(FRAMEWORKS)) if frameworks else ["graph"]
    name = workload or DEFAULT_WORKLOAD
    for fw in fws:
        resolve_workload(fw, name, flag="--frameworks")
    if stacks and vendors:
        raise ConfigError("--vendors and --stack exclude each other: a --stack file names its "
                          "own vendors", hint="give the families with --vendors, or one --stack "
                          "FILE per stack")
    if stacks:
        paths = [str(p) for p in stacks]
        stacks_by_label: list[tuple[str, StackConfig, str | None]] = [(label, _stack_config(p, spec, seed), p)
                           for label, p in zip(_file_labels(paths), paths)]
    else:
        names = _names(vendors, "--vendors", runnable_vendors()) if vendors else default_vendors()
        stacks_by_label = [(v, make_config(v, spec=spec, seed=seed), None) for v in names]
    return [Column(label if len(fws) == 1 else f"{label}/{fw}", cfg, fw, name, path)
            for label, cfg, path in stacks_by_label for fw in fws]


#: the front-end modules a column's first run imports (a one-off cost, reported apart)
_FRONT_END_MODULES = {"torch": "fornax.frameworks.torch", "jax": "fornax.frameworks.jax",
                      "jax-pjrt": "fornax.frameworks.jax"}


def warm_up(col: Column) -> dict:
    """Pay a column's one-off costs before it is measured, and say what they were: importing
    its front end (the first column of that front end only) and a first run on a stack of its
    own (first compiles, caches, lazy initialisation).  The measured run that follows is the
    steady state, so no column is charged for running first."""
    import importlib
    import sys
    module = _FRONT_END_MODULES.get(col.framework)
    import_s = 0.0
    if module is not None and module not in sys.modules:
        t0 = time.perf_counter()
        importlib.import_module(module)
        import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        execute(prepare(col.config, col.framework, col.workload, origin=f"fornax compare {col.label} warm-up"))
    except FornaxError:              # the measured run reports the failure
        pass
    return {"import_s": import_s, "first_run_wall_s": time.perf_counter() - t0}


def _column_doc(col: Column, out: Outcome) -> dict:
    rep = out.report
    status = "error" if out.failed else ("ok" if out.numerics_ok else "numerics")
    return {"label": col.label, "file": col.file,
            "stack": {"description": out.stack.describe(), **col.config.describe()},
            "vendors": sorted(set(col.config.seams.values())),
            "framework": col.framework, "workload": col.workload, "status": status,
            "error": out.failed,
            "metrics": None if out.failed else metrics(rep),
            "report": rep}


def compare(cols: list[Column], *, debug: bool = False,
            on_run: Callable[[int, Column], None] | None = None) -> dict:
    """Run every column (one workload for all) and return the ``fornax.compare/1``
    document.  Every stack is composed before the first run (a mistake is a
    :class:`ConfigError` and nothing runs); ``on_run(i, column)`` is called as run ``i``
    starts.  A column's ``status`` is ``ok``, ``error`` (a fornax error while running: its
    message in ``error``, ``metrics`` null, the report says what ran until then) or
    ``numerics`` (an output outside its tolerance); ``ok`` is true when every column is."""
    if not cols:
        raise ConfigError("nothing to compare: no columns")
    names = sorted({c.workload for c in cols})
    if len(names) > 1:
        raise ConfigError(f"a comparison runs one workload in every column, got {', '.join(names)}")
    prepared = [prepare(c.config, c.framework, c.workload, origin=f"fornax compare {c.label}")
                for c in cols]
    docs = []
    for i, col in enumerate(cols):
        if on_run is not None:
            on_run(i, col)
        prep = prepared.pop(0)                           # popped: a finished run's devices go
        one_off = warm_up(col) if prep.client is not None or col.framework != "jax-pjrt" else None
        out = execute(prep, debug=debug)
        # a jax-pjrt column's one-off costs were paid in its own process (none when it never reported)
        docs.append({**_column_doc(col, out),
                     "one_off": out.one_off or one_off or {"import_s": 0.0, "first_run_wall_s": 0.0}})
    fws = list(dict.fromkeys(c.framework for c in cols))
    return {"schema": SCHEMA, "workload": names[0],
            "metrics": [{"key": m.key, "label": m.label, "unit": m.unit} for m in METRICS],
            "columns": docs, "ok": all(d["status"] == "ok" for d in docs),
            "boundaries": {fw: BOUNDARIES[fw] for fw in fws}}


def received(rep: dict) -> str:
    """What a JAX column's stack was handed at the boundary, in words ("" for other columns)."""
    got = (rep.get("jax") or {}).get("received")
    return report_mod.received_text(got) if got else ""


# ---- rendering -----------------------------------------------------------------------------------
STATUS_TEXT = {"ok": "[green]ok[/]", "error": "[red]FAILED[/]", "numerics": "[yellow]numerics FAIL[/]"}


def fmt_value(unit: str, value) -> str:
    """A metric value in its unit (``—`` where there is none: a failed run, no numerics)."""
    if value is None:
        return "—"
    if unit == "s":
        return report_mod.fmt_time(value)
    if unit == "bytes":
        return report_mod.fmt_bytes(value)
    if unit == "J":
        return f"{value:.4g} J"
    if unit == "ratio":
        return f"{value:.2e}"
    return str(value)


def render(doc: dict, console) -> None:
    """The comparison as one rich table: a column per run, a row per metric, the stack, front
    end and status on top and, where a run failed, its error at the bottom of its column."""
    from rich.markup import escape
    from rich.table import Table

    cols = doc["columns"]
    fws = sorted({c["framework"] for c in cols})
    t = Table(title=escape(f"fornax compare — {doc['workload']}" + (f" ({fws[0]})" if len(fws) == 1 else "")),
              caption="simulated device time and host wall time are separate clocks; host wall "
                      "time is a second run, after the one-off costs below")
    t.add_column("metric", no_wrap=True)
    for c in cols:
        t.add_column(escape(c["label"]), justify="right", overflow="fold")
    t.add_row("stack", *(escape(c["stack"]["description"]) for c in cols))
    t.add_row("front end", *(c["framework"] for c in cols))
    if len(fws) > 1:        # front ends side by side: where each puts the hardware boundary
        b = doc.get("boundaries") or BOUNDARIES
        t.add_row("vendor code begins at", *(escape(b[c["framework"]]["begins"]) for c in cols))
        t.add_row("the vendor sees", *(escape(b[c["framework"]]["sees"]) for c in cols))
        if any(received(c["report"]) for c in cols):
            t.add_row("program handed over", *(escape(received(c["report"])) for c in cols))
    t.add_row("status", *(STATUS_TEXT[c["status"]] for c in cols), end_section=True)
    units = {m["key"]: m["unit"] for m in doc["metrics"]}
    for m in doc["metrics"]:
        t.add_row(m["label"], *(fmt_value(units[m["key"]], (c["metrics"] or {}).get(m["key"]))
                                for c in cols))
    t.add_row("one-off: front-end import", *(fmt_value("s", c["one_off"]["import_s"]) for c in cols))
    t.add_row("one-off: first run (host wall)", *(fmt_value("s", c["one_off"]["first_run_wall_s"])
                                                  for c in cols))
    if any(c["error"] for c in cols):
        t.add_row("[red]error[/]", *(escape(c["error"] or "") for c in cols), end_section=True)
    console.print(t)


#: the figure's panels: title, unit, and the metrics stacked in each bar (bottom first)
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("simulated device time", "s", ("device_time_s",)),
    ("host wall time", "s", ("host_wall_s",)),
    ("kernels", "count", ("kernels",)),
    ("bytes moved", "bytes", ("h2d_bytes", "d2h_bytes")),
    ("peak device memory", "bytes", ("peak_device_bytes",)),
    ("energy (simulated)", "J", ("energy_j",)),
)
_SCALES = {"s": ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")),
           "bytes": ((2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")),
           "J": ((1.0, "J"), (1e-3, "mJ"), (1e-6, "µJ")),
           "count": ((1.0, ""),)}


def _scale(unit: str, top: float) -> tuple[float, str]:
    """The largest step of ``unit`` that keeps ``top`` at 1 or more (the smallest step when
    ``top`` is below every one)."""
    steps = _SCALES[unit]
    return next(((f, name) for f, name in steps if top >= f), steps[-1])


def plot(doc: dict, path: str) -> None:
    """A PNG figure of the comparison: one bar chart per panel of :data:`PANELS`, a bar per
    column (none for a failed run, whose label says so); bytes moved stacks H2D under D2H.
    Needs matplotlib (the ``plot`` extra); it draws on its own Agg canvas, so pyplot's
    global state is left alone.  A file that cannot be written is a :class:`ConfigError`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = doc["columns"]
    labels = [c["label"] + ("" if c["metrics"] else "\n(failed)") for c in cols]
    names = {m["key"]: m["label"] for m in doc["metrics"]}
    xs = list(range(len(cols)))
    crowded = len(cols) > 3
    panel_width = max(3.4, 0.5 * len(cols) + 1.0)          # inches: room for every bar's label
    fig = Figure(figsize=(3 * panel_width, 7.0 if crowded else 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (title, unit, keys) in zip(fig.subplots(2, 3).flat, PANELS):
        parts = [[c["metrics"][k] if c["metrics"] else float("nan") for c in cols] for k in keys]
        totals = [sum(vs) for vs in zip(*parts)]
        factor, step = _scale(unit, max((v for v in totals if not math.isnan(v)), default=0.0))
        bottom = [0.0] * len(cols)
        for key, values in zip(keys, parts):
            scaled = [v / factor for v in values]
            ax.bar(xs, scaled, bottom=bottom, label=names[key],
                   color=None if len(keys) > 1 else [f"C{i % 10}" for i in xs])
            bottom = [b + v for b, v in zip(bottom, scaled)]
        if len(keys) > 1:
            ax.legend(fontsize="small")
        ax.set_title(title, fontsize="medium")
        if step:
            ax.set_ylabel(step)
        ax.set_xticks(xs, labels, rotation=20 if crowded else 0, ha="right" if crowded else "center",
                      fontsize="small")
    fws = list(dict.fromkeys(c["framework"] for c in cols))
    fig.suptitle(f"fornax compare — workload {doc['workload']} ({', '.join(fws)})")
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise ConfigError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
