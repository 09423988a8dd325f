"""`fornax baseline save | check`: pinned baselines of reports, compared metric by metric.

``save NAME`` runs a matrix (``--matrix FILE.toml``, default the one fornax ships) and
stores ``NAME/baseline.json`` under ``--dir`` (default ``.fornax/baselines``); ``check
NAME`` reruns the stored matrix, prints the regressions and improvements, and exits 1 on
a regression (0 otherwise, 2 for a usage or configuration mistake).  The work lives in
:mod:`fornax.release`; this module parses the arguments and prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..compare import fmt_value
from ..layers.errors import ConfigError
from ..release import baseline as base_mod
from ..release import html as html_mod
from ..release import plan
from ..release.metrics import fmt_row_value
from .errors import FornaxGroup, debug_option, handle_errors

_DIR_HELP = f"The folder that holds the baselines (default {base_mod.DEFAULT_DIR} under the current directory)."
_BENCH_HELP = ("A bench.json (`python -m benchmarks`) whose figures are compared too, each against "
               "its own target; give one at save and at check.")


@click.group(cls=FornaxGroup)
def baseline() -> None:
    """Pinned baselines of run reports: save a matrix of runs, check a rerun against it."""


def _progress(console: Console):
    """Each run's key as it starts, on stderr when it is a terminal (a pipe or a log gets nothing)."""
    def on_run(i: int, n: int, run: plan.Run) -> None:
        console.print(f"[dim]run {i + 1}/{n}: {escape(run.key)}[/]")
    return on_run if console.is_terminal else None


@baseline.command("save")
@click.argument("name")
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False), metavar="FILE.toml",
              help="The matrix of runs and tolerances (TOML data; default: the matrix fornax ships).")
@click.option("--dir", "root", type=click.Path(file_okay=False), metavar="DIR", help=_DIR_HELP)
@click.option("--bench", type=click.Path(dir_okay=False), metavar="FILE", help=_BENCH_HELP)
@click.option("--force", is_flag=True, help="Replace an existing baseline of that name.")
@debug_option
@handle_errors
def save_cmd(name, matrix_path, root, bench, force, debug):
    """Run the matrix and store its reports' metrics as baseline NAME."""
    matrix = plan.load(matrix_path)
    err = Console(stderr=True)
    doc = base_mod.save(name, matrix, root, bench=bench, force=force, on_run=_progress(err))
    where = base_mod.folder(name, root) / base_mod.FILE
    t = Table(title=escape(f"baseline {name} — {len(doc['runs'])} runs"))
    for col in ("run", "status", "device time", "kernels", "fallbacks"):
        t.add_column(col)
    for r in doc["runs"]:
        mt = r["metrics"]
        t.add_row(escape(r["key"]), r["status"], fmt_value("s", mt.get("device_time_s")),
                  str(mt.get("kernels", "—")), str(mt.get("fallbacks", "—")))
    console = Console()
    console.print(t)
    figures = len(doc["bench"]["figures"]) if doc["bench"] else 0
    console.print(f"saved {escape(str(where))}" + (f" (with {figures} bench figures)" if figures else ""))


@baseline.command("check")
@click.argument("name")
@click.option("--dir", "root", type=click.Path(file_okay=False), metavar="DIR", help=_DIR_HELP)
@click.option("--bench", type=click.Path(dir_okay=False), metavar="FILE", help=_BENCH_HELP)
@click.option("--html", "html_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write the comparison as a self-contained HTML page to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print only the fornax.regression/1 JSON document.")
@click.option("--all", "all_rows", is_flag=True, help="Show every compared metric, not only the changes.")
@debug_option
@handle_errors
def check_cmd(name, root, bench, html_path, as_json, all_rows, debug):
    """Rerun baseline NAME's matrix and compare metric by metric (exit 1 on a regression)."""
    err = Console(stderr=True)
    doc = base_mod.check(name, root, bench=bench, on_run=None if as_json else _progress(err))
    if html_path:
        try:
            Path(html_path).write_text(html_mod.render(doc), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--html: cannot write {html_path}: {exc.strerror or exc}") from None
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        render(doc, Console(), all_rows=all_rows)
    if not doc["ok"]:
        sys.exit(1)


_MARK = {"regression": "[bold red]REGRESSION[/]", "improvement": "[green]improvement[/]",
         "within": "within tolerance", "new": "[cyan]new[/]", "same": "[dim]same[/]"}


def render(doc: dict[str, Any], console: Console, all_rows: bool = False) -> None:
    """The check as a rich table (the regressions and improvements, or every row) and a summary."""
    shown = [r for r in doc["rows"] if all_rows or r["verdict"] in ("regression", "improvement")]
    shown.sort(key=lambda r: r["verdict"] != "regression")
    if shown:
        t = Table(title=escape(f"baseline {doc['baseline']}: "
                               + ("every metric" if all_rows else "regressions and improvements")))
        for col in ("run", "metric", "baseline", "now", "change", "verdict", "why"):
            t.add_column(col, overflow="fold")
        for r in shown:
            change = "—" if r["change"] is None else f"{r['change']:+.2%}"
            t.add_row(escape(r["run"]), escape(r["label"]), escape(fmt_row_value(r, "baseline")),
                      escape(fmt_row_value(r, "now")), change, _MARK[r["verdict"]], escape(r["why"]))
        console.print(t)
    for d in doc["software"]["differences"]:
        console.print(f"software: {escape(d['key'])} {escape(str(d['baseline']))} -> "
                      f"{escape(str(d['now']))} (shown, not a regression by itself)")
    c = doc["counts"]
    console.print(f"baseline {escape(doc['baseline'])} (saved {doc['created']}): {doc['runs']} runs, "
                  f"{len(doc['rows'])} metrics compared: {c['regression']} regressions, "
                  f"{c['improvement']} improvements, {c['within']} within tolerance, "
                  f"{c['same']} unchanged, {c['new']} new")
