"""``fornax drill``: every injectable fault on every family through every front end —
detected with the family's exact code, recovered as the family recovers, the results
after recovery compared bit for bit with a clean run (:mod:`fornax.scenarios.drill`).

Exit 0 when every row passes, 1 when one fails (all are printed), 2 for a usage mistake.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..layers.errors import ConfigError
from ..scenarios import drill as d
from ..sim.trace import chrome_trace
from ..stack import get_vendor, runnable_vendors
from .errors import debug_option, handle_errors


def _choices(given, allowed, what: str) -> list[str]:
    for g in given:
        if g not in allowed:
            raise ConfigError(f"unknown {what} {g!r}; choose from {', '.join(allowed)}")
    return list(given) or list(allowed)


@click.command()
@click.option("--vendor", "families", multiple=True, metavar="F",
              help="Drill family F (repeatable). Default: every runnable family.")
@click.option("--fault", "faults", multiple=True, metavar="KIND",
              help=f"Drill fault KIND (repeatable): {', '.join(d.FAULTS)}. Default: all.")
@click.option("--front-end", "front_ends", multiple=True, metavar="FE",
              help="Drill through front end FE (repeatable): graph, torch, jax. Default: all.")
@click.option("--spec", default=None, metavar="CHIP", help="Chip spec for every stack.")
@click.option("--partition", default=None, metavar="LAYOUT",
              help="Drill on partition 0 of the chip split this way (3g.40gb,4g.40gb; cpx; flat), a "
                   "second tenant on partition 1: a fault must stay in its partition or take every "
                   f"partition down as the mode says; adds fault {', '.join(d.PARTITION_FAULTS)}.")
@click.option("--json", "as_json", is_flag=True, help="Print the fornax.drill/1 JSON document.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Write a Perfetto/Chrome trace of each row's device timeline into DIR.")
@debug_option
@handle_errors
def drill(families, faults, front_ends, spec, partition, as_json, trace_dir, debug):
    """Fault drill: inject, detect, recover, and compare with a clean run."""
    faults = _choices(faults, d.FAULTS + (d.PARTITION_FAULTS if partition else ()), "fault")
    front_ends = _choices(front_ends, d.FRONT_ENDS, "front end")
    for f in families:
        get_vendor(f)                      # an unknown family: a clear error naming the choices
    families = _choices(families, runnable_vendors(), "vendor")
    traces: list | None = [] if trace_dir else None
    console = Console(stderr=as_json)
    with console.status("drilling...") as status:
        doc = d.drill(faults, families, front_ends, spec=spec, trace=traces, partition=partition,
                      progress=lambda r: status.update(f"{r.fault} / {r.family} / {r.front_end}"))
    if traces is not None:
        out = Path(trace_dir)
        out.mkdir(parents=True, exist_ok=True)
        doc["traces"] = []
        for name, stack in traces:
            path = out / f"drill-{name}.json"
            path.write_text(json.dumps(chrome_trace(stack.devices)))
            doc["traces"].append(str(path))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        where = f" on partition 0 of {escape(partition)}" if partition else ""
        t = Table(title=f"fault drill{where}: {doc['passed']} of {len(doc['rows'])} rows pass")
        for col in ("fault", "family", "front", "code raised", "recovery") + (("scope", "neighbour")
                                                                              if partition else ()):
            t.add_column(col, overflow="fold")
        t.add_column("detected recovered identical" + (" isolated" if partition else ""), no_wrap=True)
        for r in doc["rows"]:
            part = r.get("partition")
            checks = [r[k] for k in ("detected", "recovered", "identical")]
            if partition:                  # the neighbour saw what the mode says
                checks.append(part is None or part["isolated"])
            marks = " ".join("yes" if ok else "[red]NO[/red]" for ok in checks)
            extra = (part["scope"], escape(part["neighbour"])) if part else ("—", "—") if partition else ()
            t.add_row(r["fault"], r["family"], r["front_end"], escape(r["code"] or "—"),
                      escape(r["recovery"]), *extra, marks)
        console.print(t)
        for r in doc["rows"]:
            if not r["ok"]:
                console.print(f"[red]FAILED[/red] {r['fault']} / {r['family']} / {r['front_end']}: "
                              f"{escape(r['detail'])}")
        if traces is not None:
            console.print(f"traces: {len(doc['traces'])} file(s) in {escape(str(trace_dir))}")
    sys.exit(1 if doc["failed"] else 0)
