"""`fornax qualify`: does this stack support PyTorch, and up to which level (L0-L7)?

The levels, their evidence and the verdict live in :mod:`fornax.qualify`; this module
parses the arguments, prints the table (or the ``fornax.qualify/1`` document) and sets
the exit code: 0 when every level run passes, 1 when one fails (all are printed
anyway), 2 for a usage or configuration mistake.
"""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import qualify as q
from ..layers.errors import ConfigError
from ..stack import load_config, make_config, runnable_vendors
from .errors import debug_option, handle_errors


@click.command()
@click.option("--vendor", metavar="V", help="Qualify the stack with all five seams from vendor V "
              f"({', '.join(runnable_vendors())}).")
@click.option("--stack", "stack_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Qualify the stack a config TOML describes ([stack] vendor/spec/seed, [stack.seams]).")
@click.option("--partition", default=None, metavar="LAYOUT",
              help="Qualify the stack on a partitioned chip (3g.40gb; cpx; flat): its partitions are "
                   "the devices and the torch device is partition 0.")
@click.option("--level", "levels", multiple=True, metavar="L",
              help="Run only level L (L0-L7; repeatable). Default: every level.")
@click.option("--json", "as_json", is_flag=True, help="Print the fornax.qualify/1 JSON document.")
@click.option("--full", is_flag=True, help="Run the real-client evidence whole: every OpInfo, "
              "ModuleInfo and OptimInfo and every zoo mode, and install fornax into a fresh venv "
              "(slow); the default is a deterministic sample.")
@debug_option
@handle_errors
def qualify(vendor, stack_path, partition, levels, as_json, full, debug):
    """The support contract: levels L0-L7 of PyTorch support, each with evidence."""
    if (vendor is None) == (stack_path is None):
        raise ConfigError("give exactly one of --vendor V or --stack FILE",
                          hint="e.g. fornax qualify --vendor xpu-like")
    cfg = make_config(vendor, base=None if vendor else load_config(stack_path), partition=partition)
    wanted = [q.normalize_level(lv) for lv in levels] or None
    status = Console(stderr=True)
    if as_json or not status.is_terminal:
        result = q.qualify(cfg, wanted, full=full)
    else:
        with status.status("qualifying") as spinner:
            result = q.qualify(cfg, wanted, full=full,
                               progress=lambda cid: spinner.update(f"qualifying: {cid}"))
    if debug:
        for lr in result.levels:
            for e in lr.evidence:
                if e.traceback:
                    click.echo(f"--- {e.clause.ref}\n{e.traceback}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        render(result, Console())
    if result.exit_code:
        sys.exit(result.exit_code)


def _value(e: q.Result) -> str:
    v = e.value
    text = "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
    m = e.clause.measure
    if m is None:
        return text
    limit = f"{m.limit:.3g}" if isinstance(m.limit, float) else m.limit
    return f"{m.measured}: {text} ({m.relation} {limit})"


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def render(result: q.Qualification, console: Console) -> None:
    """One row per level (status, evidence passed) with its evidence lines under it; the
    full details are in the --json document."""
    b = result.build
    t = Table(title=f"fornax qualify: {escape(result.stack)}\n"
                    f"fornax {b['fornax']}, torch {b['torch']}, jax {b['jax']}, python {b['python']}")
    t.add_column("level", no_wrap=True)
    t.add_column("result", no_wrap=True)
    t.add_column("evidence", ratio=3)
    t.add_column("measured", ratio=2)
    style = {"pass": "green", "fail": "bold red", "not run": "dim"}
    for lr in result.levels:
        n, ok = len(lr.evidence), sum(e.passed for e in lr.evidence)
        st = lr.status
        count = f" — {ok}/{n} evidence pass" if lr.ran else ""
        t.add_row(f"[bold]{lr.level.id}[/]", f"[{style[st]}]{st.upper()}[/]",
                  f"[bold]{escape(lr.level.title)}[/]{count}", "", end_section=not lr.evidence)
        for i, e in enumerate(lr.evidence):
            c = e.clause
            mark = "[green]ok[/]" if e.passed else "[red]FAIL[/]"
            what = f"{escape(c.id)}: {escape(c.title)}"
            shown = [x for x in ((c.measure.dtype, c.measure.shape) if c.measure else ()) if x]
            if shown:
                what += f" [dim]({escape(', '.join(shown))})[/]"
            what += f"\n[dim]{escape(_clip(e.detail))}[/]" if e.passed else \
                f"\n[red]{escape(_clip(e.detail, 400))}[/]"
            t.add_row("", mark, what, escape(_value(e)), end_section=i == len(lr.evidence) - 1)
    console.print(t)
    colour = "green" if result.passed else "red"
    console.print(f"[{colour}]{escape(result.verdict_text)}[/]")
