"""`fornax matrix`: the ecosystem matrix — front end x family x chip spec x dtype at their
qualification levels, read from stored evidence (:mod:`fornax.release.ecosystem`); nothing
is run."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..release import ecosystem
from .errors import debug_option, handle_errors


@click.command()
@click.option("--evidence", "paths", multiple=True, type=click.Path(), metavar="PATH",
              help="A fornax.qualify/1 document (fornax qualify --json), a real-clients.json, or a "
                   "folder searched for them (repeatable; default: the checkout's docs/evidence).")
@click.option("--json", "as_json", is_flag=True, help="Print the fornax.matrix/1 JSON document.")
@debug_option
@handle_errors
def matrix(paths, as_json, debug):
    """The ecosystem matrix: qualification levels per front end, family, spec and dtype, from stored evidence."""
    doc = ecosystem.matrix(list(paths) or None)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    render(doc, Console())


def render(doc: dict, console: Console) -> None:
    """A row per front end, family and spec; a column per dtype with its level."""
    t = Table(title="ecosystem matrix — qualification levels from stored evidence")
    for col in ("front end", "family", "spec", *doc["dtypes"]):
        t.add_column(col, no_wrap=True)
    t.add_column("evidence", overflow="fold")
    rows: dict[tuple[str, str, str], list[dict]] = {}
    for r in doc["rows"]:
        rows.setdefault((r["front_end"], r["family"], r["spec"]), []).append(r)
    for (fe, family, spec), cells in rows.items():
        levels = [f"[green]{c['level']}[/]" if c["level"] else f"[dim]{c['status']}[/]" for c in cells]
        notes = [n for c in cells for n in c["evidence"]]
        t.add_row(fe, family, spec, *levels, escape("; ".join(notes)),
                  end_section=spec == doc["specs"][-1] and family == doc["families"][-1])
    console.print(t)
    ev = doc["evidence"]
    places = ", ".join(ev["places"]) or "none (no docs/evidence in this install; give --evidence)"
    console.print(f"evidence read from {escape(places)}: {len(ev['qualifications'])} qualification "
                  f"document(s){', ' + escape(ev['real_clients']) if ev['real_clients'] else ''}")
    for q in ev["qualifications"]:
        console.print(f"  {escape(q['path'])}: {escape(q['stack'])} — verdict {q['verdict'] or 'fails L0'}")
    for i in ev["ignored"]:
        console.print(f"  ignored {escape(i['path'])}: {escape(i['reason'])}")
    console.print("a combination without a stored fornax.qualify/1 document is 'not qualified'; "
                  "run `fornax qualify --vendor V --json > docs/evidence/qualify/V.json` to record one")
