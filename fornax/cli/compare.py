"""``fornax compare``: one workload over a matrix of stacks, in one side-by-side table.

The matrix is the vendor families of ``--vendors`` (every seam from one family;
default: every runnable registered family) or the stack config files of ``--stack``,
crossed with the front ends of ``--frameworks`` (default graph).  Each column is
one ``fornax compose`` run (:mod:`fornax.compare`); ``--json`` prints the
``fornax.compare/1`` document, ``--plot`` draws bar charts of it.  A run that
fails shows its error in its column, the others still run, and the command
exits 1 at the end.

``--all-combos`` instead runs one workload over every seam combination of the
runnable families (or the ``--where SEAM=V`` subset) in ``--jobs`` worker
processes (:mod:`fornax.compare_combos`); ``--json`` prints the
``fornax.combos/1`` document.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from .. import compare as cmp
from .. import compare_combos as combos
from ..layers.errors import ConfigError, FornaxError
from .errors import debug_option, handle_errors


def _check_plot_target(path: str) -> None:
    """Before anything runs: matplotlib is importable and ``path``'s folder exists."""
    try:
        import matplotlib  # noqa: F401  (only checked here; fornax.compare.plot draws)
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed: pip install fornax[plot]") from None
    folder = Path(path).parent
    if not folder.is_dir():
        raise ConfigError(f"--plot {path}: folder {folder} does not exist")


def _run(cols, debug: bool, show_progress: bool) -> dict:
    """Run the matrix, with a transient progress bar on stderr when ``show_progress`` and
    stderr is a terminal (a log file gets nothing)."""
    console = Console(stderr=True)
    if not show_progress or not console.is_terminal:
        return cmp.compare(cols, debug=debug)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    with progress:
        task = progress.add_task("composing stacks", total=len(cols))

        def on_run(i, col):
            progress.update(task, completed=i, description=escape(f"running {col.label} ({col.framework})"),
                            refresh=True)
        doc = cmp.compare(cols, debug=debug, on_run=on_run)
        progress.update(task, completed=len(cols))
    return doc


def _progress(console: Console) -> Progress:
    """A transient progress bar on ``console`` (stderr)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


def _all_combos(where, framework, workload, spec, seed, jobs, as_json, plot_path, debug,
                conflicting: list[str], all_paths: bool = False) -> None:
    """``--all-combos``: every seam combination (or the --where subset), in worker processes."""
    if conflicting:
        raise ConfigError(f"--all-combos excludes {', '.join(conflicting)}",
                          hint="fix seams with --where SEAM=V and the front end with --framework")
    if plot_path is not None:
        _check_plot_target(plot_path)
    fixed = combos.parse_where(where)
    todo = combos.combinations(where)
    combos.check_options(framework, workload, jobs)
    console = Console(stderr=True)
    if as_json or not console.is_terminal:
        doc = combos.sweep(todo, framework=framework, workload=workload, spec=spec, seed=seed,
                           jobs=jobs, debug=debug, where=fixed, all_paths=all_paths)
    else:
        progress = _progress(console)
        with progress:
            task = progress.add_task("running seam combinations", total=len(todo))

            def on_done(n, total, row):
                seams = "/".join(row.seams[s] for s in combos.SEAMS)
                progress.update(task, completed=n, total=total, refresh=True,
                                description=escape(f"done {seams}"))
            doc = combos.sweep(todo, framework=framework, workload=workload, spec=spec, seed=seed,
                               jobs=jobs, debug=debug, where=fixed, all_paths=all_paths,
                               on_done=on_done)
    if plot_path is not None:
        combos.plot(doc, plot_path)
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        combos.render(doc, Console())
    bad = [r for r in doc["rows"] if r["status"] != "ok"]
    if bad:
        what = "; ".join(f"{'/'.join(r['seams'][s] for s in combos.SEAMS)}: "
                         f"{r['error'] or 'numerics outside tolerance'}" for r in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise FornaxError(f"{len(bad)} of {len(doc['rows'])} combinations failed — {what}{more}")


@click.command("compare")
@click.option("--vendors", default=None, metavar="V,V,...",
              help=f"Vendor families to compare, every seam from one family (default "
                   f"{','.join(cmp.default_vendors())}).")
@click.option("--frameworks", default=None, metavar="F,F,...",
              help="Front ends to cross with the stacks: graph (default), torch, jax, jax-pjrt (plain "
                   "jax.jit through the PJRT plugin, one process per column), max; the "
                   "workload must exist for each.  Several front ends add rows saying where each "
                   "puts the hardware boundary.")
@click.option("--stack", "stacks", multiple=True, metavar="FILE",
              help="A stack config TOML, as `fornax compose --config` takes (repeatable; one column "
                   "each; excludes --vendors).")
@click.option("--workload", default=None, metavar="NAME",
              help="Workload to run in every column (default mlp; see `fornax workloads`).")
@click.option("--spec", default=None, metavar="NAME",
              help="Chip spec for every column (overrides a --stack file's; see `fornax specs`).")
@click.option("--seed", type=int, default=None, help="Seed for weights and inputs in every column.")
@click.option("--json", "as_json", is_flag=True, help="Print only the fornax.compare/1 document on stdout.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Also write bar charts of the metrics to FILE.png (needs the plot extra: matplotlib).")
@click.option("--all-combos", "all_combos", is_flag=True,
              help="Run the workload over every seam combination of the runnable families (3^5), "
                   "in worker processes; excludes --vendors, --stack, --frameworks.")
@click.option("--where", "where", multiple=True, metavar="SEAM=V",
              help="With --all-combos: only the combinations with seam SEAM from family V (repeatable).")
@click.option("--framework", default=None, metavar="NAME",
              help="With --all-combos: the front end, graph (default), torch or jax.")
@click.option("--jobs", type=int, default=None, metavar="N",
              help="With --all-combos: worker processes (default: one per CPU).")
@click.option("--all-paths", "all_paths", is_flag=True, default=False,
              help="With --all-combos: also run each combination through every other portability "
                   "path its crossings declare (as `compose --path NAME`), a row each.")
@debug_option
@handle_errors
def compare_cmd(vendors, frameworks, stacks, workload, spec, seed, as_json, plot_path, all_combos,
                where, framework, jobs, debug, all_paths=False):
    """Run one workload on a matrix of stacks and show them side by side."""
    if all_combos:
        conflicting = [name for name, given in (("--vendors", vendors), ("--stack", stacks),
                                                ("--frameworks", frameworks)) if given]
        _all_combos(where, framework or "graph", workload, spec, seed, jobs, as_json, plot_path,
                    debug, conflicting, all_paths)
        return
    extra = [name for name, given in (("--where", where), ("--framework", framework),
                                      ("--all-paths", all_paths),
                                      ("--jobs", jobs is not None)) if given]
    if extra:
        raise ConfigError(f"{', '.join(extra)} only go with --all-combos",
                          hint="use --vendors / --frameworks for a matrix of stacks")
    if plot_path is not None:
        _check_plot_target(plot_path)
    cols = cmp.columns(workload, vendors=None if vendors is None else [vendors],
                       frameworks=None if frameworks is None else [frameworks],
                       stacks=list(stacks) or None, spec=spec, seed=seed)
    doc = _run(cols, debug, show_progress=not as_json)
    if plot_path is not None:
        cmp.plot(doc, plot_path)
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        cmp.render(doc, Console())
    bad = [c for c in doc["columns"] if c["status"] != "ok"]
    if bad:
        what = "; ".join(f"{c['label']}: {c['error'] or 'numerics outside tolerance'}" for c in bad)
        raise FornaxError(f"{len(bad)} of {len(doc['columns'])} runs failed — {what}")
