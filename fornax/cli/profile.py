"""``fornax profile``: run a workload under the stack's profiler and print what it saw, as
the runtime family's own profiler prints it — an nsys-like (cuda-like), rocprofv3-like
(rocm-like) or unitrace-like (xpu-like) summary: top kernels (share, total, instances,
average, minimum, maximum), API time per call, copies per direction, and per-kernel metrics
under the family's metric names.  Times are simulated nanoseconds.

The recording is the shared collector's (:class:`fornax.layers.profiler.Recorder`); the
vocabulary is the runtime family's ``[profiler]`` facts.  ``--json`` prints the
``fornax.profile/1`` document; ``--trace FILE`` writes the Chrome / Perfetto trace with the
API call track.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..compare import execute, prepare
from ..layers.errors import ConfigError
from ..layers.profiler import Recorder
from ..layers.profiler.summary import summarize, table
from ..scenarios.workloads import DEFAULT_WORKLOAD
from ..sim.trace import chrome_trace
from ..stack import load_config, make_config, parse_seam_overrides
from .errors import _fail, debug_option, handle_errors
from .options import stack_options

#: the narrowest the summary is printed (kernel and metric names are long, as in nsys and ncu)
WIDTH = 150


def _section(console: Console, section: dict[str, Any], rows: list[dict[str, Any]], note: str = "") -> None:
    t = Table(title=escape(section["title"] + note), box=box.SIMPLE_HEAD, title_justify="left")
    for key, label in section["columns"]:
        t.add_column(escape(label), justify="left" if key == "name" else "right",
                     overflow="fold")
    for cells in table(rows, section["columns"]):
        t.add_row(*(escape(c) for c in cells))
    console.print(t)


def render(doc: dict[str, Any], console: Console) -> None:
    """Print a ``fornax.profile/1`` document in its family's vocabulary."""
    console.print(f"[bold]{escape(doc['tool'])}[/] profile of {escape(doc['workload'])} on "
                  f"{escape(doc['stack'])} ({escape(doc['interface'])}; simulated ns)", soft_wrap=True)
    s = doc["sections"]
    shown, total = len(doc["kernels"]), doc["kernels_total"]
    _section(console, s["kernels"], doc["kernels"], f" — top {shown} of {total}" if shown < total else "")
    for domain in ("runtime", "driver"):
        rows = [r for r in doc["api"] if r["domain"] == domain]
        if rows:
            _section(console, s["api"], rows, f" — {rows[0]['domain_name']}")
    if doc["copies"]:
        _section(console, s["copies"], doc["copies"])
    for m in doc["metrics"]:
        console.print(escape(f"{doc['metrics_tool']}: {m['kernel']} ({m['instances']} instance"
                             f"{'s' if m['instances'] != 1 else ''}, averages)"), soft_wrap=True)
        t = Table(box=box.SIMPLE_HEAD)
        for col in ("Metric Name", "Metric Unit", "Metric Value"):
            t.add_column(col, justify="right" if col == "Metric Value" else "left")
        for key, named in doc["metric_names"].items():
            value = m["named"][named["name"]]
            t.add_row(escape(named["name"]), escape(named["unit"]),
                      f"{value:,.2f}" if abs(value) < 1e6 else f"{value:,.0f}")
        console.print(t)
    linked = doc["correlated"]
    console.print(f"correlation ids link {linked['kernels']} kernel(s) and {linked['copies']} copy(ies) "
                  "to the API calls that submitted them", soft_wrap=True)
    dropped = {k: v for k, v in doc["dropped"].items() if v}
    if dropped:
        console.print(f"[yellow]dropped records:[/] {dropped} (the recorder keeps a bounded window)")


@click.command("profile")
@stack_options
@click.option("--workload", default=None, metavar="NAME",
              help=f"Workload to profile (default {DEFAULT_WORKLOAD}; see `fornax workloads`).")
@click.option("--framework", default="graph", metavar="NAME",
              help="Where the workload comes from: graph (default), torch or jax (as `fornax compose`).")
@click.option("--spec", default=None, metavar="NAME", help="Chip spec (see `fornax specs`).")
@click.option("--seed", type=int, default=None, help="Seed for weights and inputs.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Kernels shown (by total time), with their metrics.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write the Chrome/Perfetto trace, with the API call track, to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print the fornax.profile/1 JSON document.")
@debug_option
@handle_errors
def profile_cmd(vendor, seams, config_path, workload, framework, spec, seed, top, trace_path, as_json,
                debug):
    """Run a workload under the stack's profiler; print an nsys/rocprof/unitrace-style summary."""
    base = load_config(config_path) if config_path else None
    if base is None and vendor is None and not seams:
        raise ConfigError("no stack given: use --vendor V, --seam SEAM=V for every seam, or --config FILE")
    if framework not in ("graph", "torch", "jax"):
        raise ConfigError(f"--framework {framework!r}: fornax profile runs graph, torch or jax workloads")
    cfg = make_config(vendor, parse_seam_overrides(seams), spec=spec, seed=seed, base=base)
    prep = prepare(cfg, framework, workload, origin="fornax profile")
    vocab = prep.stack.runtime.profiler().vocab
    recorder = Recorder(prep.stack.runtime)
    with recorder:
        out = execute(prep, debug=debug)
        prep.stack.runtime.synchronize()
    doc = {**summarize(recorder, vocab, top), "workload": prep.workload.name,
           "stack": prep.stack.describe(), "failed": out.failed}
    if trace_path:
        try:
            with open(trace_path, "w", encoding="utf-8") as fh:
                json.dump(chrome_trace(out.stack.devices, api=recorder.track()), fh)
        except OSError as exc:
            raise ConfigError(f"--trace: cannot write {trace_path}: {exc.strerror or exc}") from None
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        render(doc, Console(width=max(Console().width, WIDTH)))
    if out.failed:
        if not as_json:
            _fail(out.failed, 1)
        sys.exit(1)
