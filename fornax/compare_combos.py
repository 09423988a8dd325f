"""One workload over every seam combination of the runnable families: ``fornax compare --all-combos``.

A *combination* picks a family for each of the five seams (:data:`fornax.layers.vendor.SEAMS`);
over the runnable families (:func:`fornax.stack.runnable_vendors`) there are 3^5 = 243 of
them, or the subset that repeated ``--where SEAM=V`` fixes (:func:`combinations`).  Each one
is a ``fornax compose`` run (:func:`fornax.compare.prepare` + :func:`fornax.compare.execute`)
and, beside it, the same config composed with ``translate = False`` to record whether strict
mode (``--no-translate``) refuses it.  With ``all_paths`` every combination whose crossings
declare other paths (``alternatives`` in its crossings) runs again through each of them, as
``--path NAME`` would, so the paths of one combination can be compared row by row.

:func:`sweep` runs the combinations in parallel worker processes
(:class:`concurrent.futures.ProcessPoolExecutor`) and returns the ``fornax.combos/1``
document: per combination (:class:`Row`) the seams, the path that carried each crossing
between two families (``native`` when there is none), the strict-mode verdict, device time
and host wall, numerics, error, and the *overhead*: its device time over that of the native
stack of its driver's family (every seam from the driver's family; run as well when the
subset leaves it out), and the *first-run overhead*, which adds the simulated module-load time
(the driver's JIT or IL build plus any translation at load) to both sides::

    from fornax.compare_combos import combinations, sweep
    doc = sweep(combinations(["driver=cuda-like", "runtime=cuda-like"]), spec="tiny", jobs=2)
    [(r["path"], r["overhead"]) for r in doc["rows"]]

:func:`render` prints the table and its summary line, :func:`plot` draws the overheads.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .compare import FRAMEWORKS, execute, max_rel_err, prepare, resolve_workload
from .layers.errors import ConfigError, FornaxError
from .layers.vendor import SEAMS
from .stack import make_config, runnable_vendors

SCHEMA = "fornax.combos/1"
#: the path of a combination whose five seams are one family
NATIVE = "native"


# ---- which combinations --------------------------------------------------------------------------
def parse_where(items: Iterable[str]) -> dict[str, str]:
    """``--where SEAM=V`` items as ``{seam: family}``; a malformed item, an unknown seam or
    family, or one seam fixed to two families is a :class:`ConfigError`."""
    families = runnable_vendors()
    fixed: dict[str, str] = {}
    for item in items:
        seam, sep, family = str(item).partition("=")
        seam, family = seam.strip(), family.strip()
        if not sep or not seam or not family:
            raise ConfigError(f"--where takes SEAM=VENDOR, got {item!r}", hint=f"seams: {', '.join(SEAMS)}")
        if seam not in SEAMS:
            raise ConfigError(f"unknown seam {seam!r} in --where; valid seams: {', '.join(SEAMS)}")
        if family not in families:
            raise ConfigError(f"unknown vendor {family!r} in --where {seam}={family}; valid vendors: "
                              f"{', '.join(families)}")
        if fixed.get(seam, family) != family:
            raise ConfigError(f"--where fixes seam {seam} twice ({fixed[seam]} and {family})")
        fixed[seam] = family
    return fixed


def combinations(where: Iterable[str] = ()) -> list[dict[str, str]]:
    """Every combination of the runnable families over the five seams, in sorted order, with
    the seams ``--where SEAM=V`` fixes held to their family."""
    fixed = parse_where(where)
    families = runnable_vendors()
    choices = [[fixed[s]] if s in fixed else families for s in SEAMS]
    return [dict(zip(SEAMS, pick)) for pick in itertools.product(*choices)]


def native_of(seams: dict[str, str]) -> dict[str, str]:
    """The native stack of a combination's driver family: every seam from that family."""
    return dict.fromkeys(SEAMS, seams["driver"])


def sort_key(seams: dict[str, str]) -> tuple[str, ...]:
    """Rows sort by their families in seam order (framework first, driver last)."""
    return tuple(seams[s] for s in SEAMS)


# ---- one combination (runs in a worker process) --------------------------------------------------
@dataclass(frozen=True)
class Job:
    """What a worker needs to run one combination (picklable)."""

    seams: tuple[tuple[str, str], ...]
    framework: str
    workload: str | None
    spec: str | None
    seed: int | None
    debug: bool = False
    paths: tuple[str, ...] = ()      # --path names (ignored where they carry no crossing)


@dataclass
class Row:
    """One combination's outcome: a row of the table and of the JSON document."""

    seams: dict[str, str]
    path: str                        # "native", or "mechanism name; ..." per crossing
    mechanisms: list[str]            # the crossings' mechanisms, in crossing order
    crossings: list[dict[str, str]]  # negotiation.crossings of the composed stack
    strict: str                      # "runs" or "refused" with translate = false
    strict_error: str | None
    status: str                      # ok, error, numerics
    device_time_s: float | None
    host_wall_s: float | None
    numerics_ok: bool | None
    max_rel_err: float | None
    error: str | None
    overhead: float | None = None    # device time / that of the driver family's native stack
    load_s: float | None = None      # simulated module load: JIT / IL build + translation
    first_run_overhead: float | None = None   # (device + load) / the native stack's
    paths: list[str] = field(default_factory=list)   # the --path names this row was run with

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def path_of(crossings: list[dict[str, str]]) -> str:
    """A combination's path in words: ``native``, or each crossing's mechanism and name."""
    if not crossings:
        return NATIVE
    return "; ".join(f"{c['mechanism']} {c['name']}" for c in crossings)


def alternatives(row: Row) -> list[str]:
    """The paths a combination's crossings declare besides the ones that carried it, in
    crossing order (each once): what ``--path NAME`` could pick instead."""
    taken = {c["name"] for c in row.crossings}
    return list(dict.fromkeys(a for c in row.crossings for a in c.get("alternatives", ()) if a not in taken))


def _strict(job: Job) -> str | None:
    """None when the combination composes with translate = false, else the refusal."""
    cfg = make_config(seams=dict(job.seams), spec=job.spec, seed=job.seed, translate=False)
    try:
        prepare(cfg, job.framework, job.workload, origin="fornax compare --all-combos (strict)")
    except FornaxError as exc:
        return str(exc)
    return None


def run_job(job: Job) -> Row:
    """Compose and run one combination (as ``fornax compose`` would) and compose it strictly.
    A fornax error while composing or running is the row's ``error``; with ``debug`` it, or
    any other exception, propagates instead."""
    seams = dict(job.seams)
    crossings: list[dict[str, str]] = []
    device = wall = rel = load = None
    nums_ok: bool | None = None
    error: str | None = None
    try:
        cfg = make_config(seams=seams, spec=job.spec, seed=job.seed, paths=job.paths)
        cfg.paths_strict = False
        prep = prepare(cfg, job.framework, job.workload, origin="fornax compare --all-combos")
        crossings = list(prep.stack.negotiation.get("crossings", []))
        out = execute(prep, debug=job.debug)
        rep = out.report
        error = out.failed
        nums_ok = out.numerics_ok
        if error is None:
            device, wall = rep["costs"]["device_time_s"], rep["costs"]["host_wall_s"]
            load = rep["costs"]["module_build_s"] + rep["costs"]["translate_s"]
            rel = max_rel_err(rep)
    except Exception as exc:          # a crash of one combination must not hide the other rows
        if job.debug:
            raise
        error = str(exc) if isinstance(exc, FornaxError) else f"internal error: {type(exc).__name__}: {exc}"
    strict_error = _strict(job)
    status = "error" if error else ("ok" if nums_ok else "numerics")
    return Row(seams, path_of(crossings), [c["mechanism"] for c in crossings], crossings,
               "refused" if strict_error else "runs", strict_error, status, device, wall,
               nums_ok, rel, error, load_s=load, paths=list(job.paths))


#: the front-end modules a worker imports once before its first combination
_FRONT_END_MODULES = {"torch": "fornax.frameworks.torch", "jax": "fornax.frameworks.jax"}


def _init_worker(framework: str) -> None:
    """Import the front end in each worker up front, so no combination's host wall pays it."""
    module = _FRONT_END_MODULES.get(framework)
    if module is not None:
        import importlib
        importlib.import_module(module)


# ---- the sweep -----------------------------------------------------------------------------------
def _run_all(jobs: list[Job], workers: int, on_done: Callable[[int, Row], None] | None) -> list[Row]:
    """Every job's row, in the order of ``jobs``; ``on_done(n, row)`` as the n-th finishes."""
    rows: list[Row | None] = [None] * len(jobs)
    if workers <= 1:
        _init_worker(jobs[0].framework)
        for i, job in enumerate(jobs):
            row = run_job(job)
            rows[i] = row
            if on_done is not None:
                on_done(i + 1, row)
    else:
        # fresh interpreters ("spawn"), never fork: the parent may hold JAX's and PyTorch's
        # threads, and a forked child of a multithreaded process can deadlock
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), initializer=_init_worker,
                                 initargs=(jobs[0].framework,),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            futures: dict[Future[Row], int] = {pool.submit(run_job, j): i for i, j in enumerate(jobs)}
            for n, fut in enumerate(as_completed(futures), 1):
                row = fut.result()
                rows[futures[fut]] = row
                if on_done is not None:
                    on_done(n, row)
    return [r for r in rows if r is not None]


def summary(rows: list[Row]) -> dict[str, Any]:
    """How many combinations ran natively, through each mechanism (a combination counts once
    per mechanism it uses), were refused under strict mode, and failed."""
    mechanisms: Counter[str] = Counter()
    default = [r for r in rows if not r.paths]     # one row per combination: its default path
    for r in default:
        mechanisms.update(set(r.mechanisms))
    return {"combinations": len(default), "path_rows": len(rows) - len(default),
            "native": sum(1 for r in default if r.path == NATIVE),
            "mechanisms": dict(sorted(mechanisms.items())),
            "strict_refused": sum(1 for r in default if r.strict == "refused"),
            "failed": sum(1 for r in rows if r.status != "ok")}


def check_options(framework: str, workload: str | None, jobs: int | None) -> None:
    """The sweep's options checked before anything runs (a :class:`ConfigError` names the
    first mistake)."""
    if framework not in FRAMEWORKS:
        raise ConfigError(f"unknown framework {framework!r}; available: {', '.join(FRAMEWORKS)}")
    resolve_workload(framework, workload)
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs takes a positive number of worker processes, got {jobs}")


def sweep(combos: list[dict[str, str]], *, framework: str = "graph", workload: str | None = None,
          spec: str | None = None, seed: int | None = None, jobs: int | None = None,
          debug: bool = False, where: dict[str, str] | None = None, all_paths: bool = False,
          on_done: Callable[[int, int, Row], None] | None = None) -> dict[str, Any]:
    """Run every combination of ``combos`` (plus the native stack of each driver family that
    is not among them, for the overheads) in ``jobs`` worker processes (default: one per CPU)
    and return the ``fornax.combos/1`` document, rows sorted by :func:`sort_key`.  With
    ``all_paths``, then each combination again through every other path its crossings declare
    (a row each, right after the default's).  ``on_done(n, total, row)`` is called in this
    process as the n-th run finishes (``total`` grows when the second round starts)."""
    if not combos:
        raise ConfigError("no seam combination to run")
    check_options(framework, workload, jobs)
    wl = resolve_workload(framework, workload)
    asked = sorted(combos, key=sort_key)
    keys = {sort_key(c) for c in asked}
    extra = sorted({sort_key(native_of(c)) for c in asked} - keys)
    todo = asked + [dict(zip(SEAMS, k)) for k in extra]
    job_list = [Job(tuple((s, c[s]) for s in SEAMS), framework, wl.name, spec, seed, debug) for c in todo]
    t0 = time.perf_counter()
    workers = jobs or os.cpu_count() or 1
    done = None if on_done is None else (lambda n, row: on_done(n, len(job_list), row))
    rows = _run_all(job_list, workers, done)
    by_key = {sort_key(r.seams): r for r in rows}
    shown = [by_key[sort_key(c)] for c in asked]
    if all_paths:
        more = [replace(j, paths=(alt,))
                for r, j in zip(rows, job_list) if sort_key(r.seams) in keys
                for alt in alternatives(r)]
        if more:
            first = len(job_list)
            step = None if on_done is None else (lambda n, row: on_done(first + n, first + len(more), row))
            extra_rows = _run_all(more, workers, step)
            by_combo: dict[tuple[str, ...], list[Row]] = {}
            for r in extra_rows:
                by_combo.setdefault(sort_key(r.seams), []).append(r)
            shown = [x for r in shown for x in [r, *by_combo.get(sort_key(r.seams), [])]]
    elapsed = time.perf_counter() - t0
    for r in shown:
        base = by_key[sort_key(native_of(r.seams))]
        if r.device_time_s is not None and base.device_time_s and base.status == "ok":
            r.overhead = r.device_time_s / base.device_time_s
            if r.load_s is not None and base.load_s is not None:
                r.first_run_overhead = (r.device_time_s + r.load_s) / (base.device_time_s + base.load_s)
    baselines = [{"driver": by_key[k].seams["driver"], "device_time_s": by_key[k].device_time_s,
                  "load_s": by_key[k].load_s, "status": by_key[k].status, "in_rows": k in keys}
                 for k in sorted({sort_key(native_of(c)) for c in asked})]
    return {"schema": SCHEMA, "workload": wl.name, "framework": framework, "spec": spec,
            "seed": seed, "where": dict(where or {}), "jobs": workers,
            "all_paths": all_paths,
            "elapsed_s": elapsed, "rows": [r.to_dict() for r in shown], "baselines": baselines,
            "summary": summary(shown), "ok": all(r.status == "ok" for r in shown)}


# ---- rendering -----------------------------------------------------------------------------------
def summary_line(doc: dict[str, Any]) -> str:
    """The summary in one line: natives, per mechanism, strict refusals, failures."""
    s = doc["summary"]
    mech = ", ".join(f"{n} {m}" for m, n in s["mechanisms"].items()) or "none"
    alt = (f" (and {s['path_rows']} runs through another declared path)"
           if s.get("path_rows") else "")
    return (f"{s['combinations']} combinations{alt}: {s['native']} native; through a path: {mech}; "
            f"{s['strict_refused']} refused under --no-translate; {s['failed']} failed")


def _fmt_s(value: float | None) -> str:
    """Seconds in a narrow column: three significant figures in s, ms or µs."""
    if value is None:
        return "—"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= factor or unit == "µs":
            return f"{value / factor:.3g} {unit}"
    return f"{value} s"


def short(family: str) -> str:
    """A family's name in a narrow column: without its ``-like`` suffix."""
    return family.removesuffix("-like")


def render(doc: dict[str, Any], console: Any) -> None:
    """The sweep as one rich table (a row per combination) and its summary line."""
    from rich.markup import escape
    from rich.table import Table

    rows = doc["rows"]
    t = Table(title=escape(f"fornax compare --all-combos — {doc['workload']} ({doc['framework']})"),
              caption="stack: the families of " + "/".join(SEAMS) + ", then the path: native, or each "
                      "crossing's mechanism and name; strict: under --no-translate; "
                      "device: simulated device time; wall: host wall time (a separate clock); "
                      "load: simulated module load (JIT / IL build and translation); "
                      "overhead: device time over the native stack of the driver's family, and "
                      "first run: device time plus load over the same; num.: numerics; "
                      "a row marked --path runs one combination through another declared path")
    t.add_column("stack, and its path", overflow="fold")
    t.add_column("strict", no_wrap=True)
    t.add_column("device", justify="right", no_wrap=True)
    t.add_column("wall", justify="right", no_wrap=True)
    t.add_column("load", justify="right", no_wrap=True)
    t.add_column("overhead", justify="right", no_wrap=True)
    t.add_column("first run", justify="right", no_wrap=True)
    t.add_column("num.", no_wrap=True)
    errors = any(r["error"] for r in rows)
    if errors:
        t.add_column("error", overflow="fold", ratio=1)
    for i, r in enumerate(rows):
        nums = {True: "[green]ok[/]", False: "[red]FAIL[/]", None: "—"}[r["numerics_ok"]]
        forced = "".join(f" --path {n}" for n in r.get("paths", []))
        cells = ["/".join(short(r["seams"][s]) for s in SEAMS) + escape(forced) + "\n[dim]"
                 + escape(r["path"].replace("; ", "\n")) + "[/]",
                 "[yellow]refused[/]" if r["strict"] == "refused" else "runs",
                 _fmt_s(r["device_time_s"]), _fmt_s(r["host_wall_s"]), _fmt_s(r.get("load_s")),
                 "—" if r["overhead"] is None else f"{r['overhead']:.2f}x",
                 "—" if r.get("first_run_overhead") is None else f"{r['first_run_overhead']:.2f}x", nums]
        if errors:
            cells.append("[red]" + escape(r["error"]) + "[/]" if r["error"] else "")
        t.add_row(*cells, end_section=i < len(rows) - 1)
    console.print(t)
    console.print(escape(summary_line(doc)))


#: more combinations than this are drawn without a label per bar, sorted by overhead
_LABELLED_BARS = 60


def plot(doc: dict[str, Any], path: str) -> None:
    """A PNG of the overheads: on top, per path mechanism (and ``native``) the mean overhead
    of the combinations using it, with their range and count; below, a bar per combination,
    coloured by its path's mechanisms (by the compiler's path alone when more than ten
    mixes occur; none for a failed run) — labelled with its families
    for up to 60 combinations, sorted by overhead beyond that — and the native level at 1.0.
    Needs matplotlib (the ``plot`` extra); draws on its own Agg canvas.  A file that cannot
    be written is a :class:`ConfigError`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = doc["rows"]
    kinds = [" + ".join(dict.fromkeys(r["mechanisms"])) or NATIVE for r in rows]
    if len(set(kinds)) > 10:      # too many to tell apart: colour by the compiler's path alone
        kinds = [next((f"compiler: {c['mechanism']}" for c in r["crossings"]
                       if c["boundary"] == "compiler/driver"), "compiler: same family") for r in rows]
    palette = {k: f"C{i % 10}" for i, k in enumerate(dict.fromkeys(sorted(kinds)))}
    labelled = len(rows) <= _LABELLED_BARS
    order = list(range(len(rows))) if labelled else sorted(
        range(len(rows)), key=lambda i: (rows[i]["overhead"] is None, rows[i]["overhead"] or 0.0))
    fig = Figure(figsize=(max(8.0, 0.25 * len(rows) + 2.0) if labelled else 12.0, 9.0),
                 layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, height_ratios=(1, 1.4))
    groups: dict[str, list[float]] = {}
    for r in rows:
        for m in (dict.fromkeys(r["mechanisms"]) or [NATIVE]):
            if r["overhead"] is not None:
                groups.setdefault(m, []).append(r["overhead"])
    names = sorted(groups, key=lambda m: (m != NATIVE, m))
    means = [sum(groups[m]) / len(groups[m]) for m in names]
    lows = [mean - min(groups[m]) for m, mean in zip(names, means)]
    highs = [max(groups[m]) - mean for m, mean in zip(names, means)]
    top.bar(range(len(names)), means, yerr=[lows, highs], capsize=4, color="C0")
    top.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    top.set_xticks(range(len(names)), [f"{m}\n{len(groups[m])} combinations" for m in names],
                   fontsize="small")
    top.set_title("mean overhead of the combinations using each mechanism (bars: min to max)",
                  fontsize="medium")
    top.set_ylabel("overhead")
    xs = list(range(len(order)))
    bottom.bar(xs, [rows[i]["overhead"] if rows[i]["overhead"] is not None else float("nan") for i in order],
               color=[palette[kinds[i]] for i in order])
    bottom.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    bottom.set_ylabel("device time / native stack of the driver's family")
    if labelled:
        labels = ["/".join(short(rows[i]["seams"][s]) for s in SEAMS)
                  + "".join(f" {n}" for n in rows[i].get("paths", [])) for i in order]
        bottom.set_xticks(xs, labels, rotation=90, fontsize="x-small")
        bottom.set_xlabel("framework/compiler/library/runtime/driver")
    else:
        bottom.set_xticks([])
        bottom.set_xlabel(f"{len(rows)} combinations, sorted by overhead")
    bottom.legend(handles=[Patch(color=c, label=k) for k, c in palette.items()], fontsize="x-small",
                  loc="lower right")
    fig.suptitle(f"fornax compare --all-combos — workload {doc['workload']} ({doc['framework']})")
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise ConfigError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
