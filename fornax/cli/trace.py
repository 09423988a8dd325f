"""``fornax trace``: work with the Chrome / Perfetto traces of the simulated timeline.

``fornax trace merge FILES... -o OUT.json`` joins the traces the ranks of a distributed run
wrote (one per rank: :func:`fornax.sim.trace.chrome_trace` of its device, ``otherData``
saying its ``rank``, ``world_size``, ``family`` and ``node``) into one trace with a process
per rank, arrows joining each collective across the ranks and an instant where a rank
arrived last (:mod:`fornax.sim.trace_merge`), and prints what the ranks did: busy, waiting
and exposed communication time per rank, and the stragglers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..layers.errors import ConfigError
from ..report import fmt_time
from ..sim.trace_merge import TraceMergeError, merge
from .errors import debug_option, handle_errors

#: the files a directory argument stands for
RANK_GLOB = "rank*.trace.json"
#: how many stragglers the table shows
TOP = 5


@click.group("trace")
def trace_cmd() -> None:
    """Work with Chrome / Perfetto traces of the simulated timeline."""


def _files(paths: tuple[Path, ...]) -> list[Path]:
    """The trace files: each path itself, or a directory's rank*.trace.json files."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob(RANK_GLOB))
            if not found:
                raise ConfigError(f"directory {path} holds no {RANK_GLOB} files",
                                  hint="pass the ranks' trace files, or the directory they were written to")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise ConfigError(f"{path}: no such file or directory")
    return out


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not a trace JSON file: {exc}",
                          hint="pass the Chrome / Perfetto trace files the ranks wrote") from None


def _share(part: float | None) -> str:
    return "—" if part is None else f"{part * 100:.0f}%"


def _unit(seconds: list[float]) -> tuple[float, str]:
    """One unit for a column of simulated times: (scale, name)."""
    top = max(seconds, default=0.0)
    return (1.0, "s") if top >= 1 else (1e3, "ms") if top >= 1e-3 else (1e6, "µs")


def _show(summary: dict[str, Any], output: Path, events: int) -> None:
    console = Console()
    rows = summary["ranks"]
    keys = ("compute_s", "copy_s", "collective_s", "waiting_s", "exposed_s")
    scale, unit = _unit([r[k] for r in rows for k in keys])
    t = Table(title=f"{summary['world_size']} ranks · {summary['family']} · simulated {unit}",
              box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for name in ("rank", "node", "compute", "copies", "comm", "calls", "waiting", "exposed",
                 "overlap", "last"):
        t.add_column(name, justify="right")
    for r in rows:
        t.add_row(str(r["rank"]), "—" if r["node"] is None else str(r["node"]),
                  *(f"{r[k] * scale:.2f}" for k in keys[:3]), str(r["collectives"]),
                  *(f"{r[k] * scale:.2f}" for k in keys[3:]), _share(r["overlap"]), str(r["straggler"]))
    console.print(t)
    if summary["stragglers"]:
        s = Table(title="stragglers: ranks that arrived last at a collective", box=box.SIMPLE_HEAD)
        for name in ("rank", "times last", "others waited"):
            s.add_column(name, justify="right")
        for row in summary["stragglers"][:TOP]:
            s.add_row(str(row["rank"]), str(row["count"]), fmt_time(row["caused_wait_s"]))
        console.print(s)
    for u in summary["unmatched"]:
        console.print(f"[yellow]unmatched:[/] {escape(u['call'])} (group {escape(u['group'])}, seq {u['seq']}) "
                      f"issued by rank(s) {', '.join(map(str, u['ranks']))}, never by "
                      f"{', '.join(map(str, u['missing_ranks']))}")
    for m in summary["mismatched"]:
        calls = ", ".join(f"rank {k} {v}" for k, v in m["calls"].items())
        console.print(f"[yellow]mismatched:[/] group {escape(m['group'])} seq {m['seq']}: {escape(calls)}")
    for w in summary["warnings"]:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    console.print(f"wrote {escape(str(output))} ({events} events): open it in https://ui.perfetto.dev",
                  soft_wrap=True)


@trace_cmd.command("merge")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the merged trace (JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object on stdout.")
@debug_option
@handle_errors
def merge_cmd(files: tuple[Path, ...], output: Path, as_json: bool, debug: bool) -> None:
    """Merge the ranks' traces of a distributed run into one (FILES: trace files, or a
    directory of rank*.trace.json files); print each rank's busy, waiting and exposed
    communication time and the stragglers."""
    paths = _files(files)
    try:
        merged = merge([_load(p) for p in paths], sources=[str(p) for p in paths])
    except TraceMergeError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    try:
        output.write_text(json.dumps(merged), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc}") from None
    summary = merged["otherData"]["summary"]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    _show(summary, output, len(merged["traceEvents"]))
