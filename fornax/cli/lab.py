"""``fornax lab``: teaching labs that run live and check answers.

* ``fornax lab list`` — number, title, series part, time, exercises;
* ``fornax lab run N [--out DIR]`` — run the experiments live, print the narrative and its
  tables, write the pictures into DIR (default ``lab-N-output``);
* ``fornax lab new N DIR`` — write the starter files (``answers.toml`` and any file an
  exercise asks for);
* ``fornax lab check N [DIR] [--reference]`` — check the answers in DIR (default: the
  current folder) against what the code computes now; per exercise pass or fail with what
  was expected, what was observed and where to look, and a score.  Exit 0 with full marks,
  1 otherwise; ``--reference`` checks the packaged reference solution (for tests);
* ``fornax lab notebook N [--out FILE]`` — the lab as a Jupyter notebook (the ``labs`` extra);
* ``fornax lab render N [--docs DIR]`` — write the lab's page (and its pictures) from a live
  run into DIR (default ``docs/labs``).
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..layers.errors import ConfigError
from .errors import debug_option, handle_errors


@click.group(name="lab")
def lab() -> None:
    """Teaching labs on stack boundaries: list, run, new, check, render."""


def markdown_list() -> str:
    """The labs as the markdown table README.md quotes (``fornax lab list --markdown``)."""
    from .. import labs
    lines = ["| lab | title | part | time | exercises |", "|---:|---|---|---|---:|"]
    for n, lb in sorted(labs.LABS.items()):
        lines.append(f"| {n} | [{lb.title}](docs/labs/{lb.slug}.md) | {lb.part} | ~{lb.minutes} min | "
                     f"{len(lb.exercises)} |")
    return "\n".join(lines)


@lab.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print the labs as JSON.")
@click.option("--markdown", is_flag=True, help="Print the markdown table README.md quotes.")
@debug_option
@handle_errors
def list_cmd(as_json, markdown, debug):
    """The labs: number, title, series part, time and exercises."""
    from .. import labs
    rows = [{"number": n, "title": lb.title, "part": lb.part, "minutes": lb.minutes,
             "exercises": len(lb.exercises), "page": f"docs/labs/{lb.slug}.md"} for n, lb in sorted(labs.LABS.items())]
    if as_json:
        click.echo(json.dumps({"schema": "fornax.labs/1", "labs": rows}))
        return
    if markdown:
        click.echo(markdown_list())
        return
    t = Table(title="fornax labs")
    for c in ("lab", "title", "part", "time", "exercises"):
        t.add_column(c)
    for r in rows:
        t.add_row(str(r["number"]), r["title"], r["part"], f"~{r['minutes']} min", str(r["exercises"]))
    Console().print(t)


@lab.command(name="run")
@click.argument("number", type=int)
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Folder for the pictures (default lab-N-output).")
@debug_option
@handle_errors
def run_cmd(number, out, debug):
    """Run lab NUMBER's experiments live and print them."""
    from .. import labs
    from ..labs.render import show
    lb = labs.get(number)
    folder = Path(out or f"lab-{number}-output")
    sections = lb.run(folder)
    show(lb, sections, folder, Console())


@lab.command(name="new")
@click.argument("number", type=int)
@click.argument("folder", type=click.Path(file_okay=False))
@debug_option
@handle_errors
def new_cmd(number, folder, debug):
    """Write lab NUMBER's starter files into FOLDER."""
    from .. import labs
    lb = labs.get(number)
    dest = Path(folder)
    dest.mkdir(parents=True, exist_ok=True)
    files = lb.starter()
    clash = [name for name in files if (dest / name).exists()]
    if clash:
        raise ConfigError(f"{dest} already holds {', '.join(clash)}; nothing was written",
                          hint="pick an empty folder, or move your answers aside first")
    for name, text in files.items():
        (dest / name).write_text(text, encoding="utf-8")
    click.echo(f"wrote {', '.join(files)} to {dest}; answer there, then: fornax lab check {number} {dest}")


@lab.command(name="check")
@click.argument("number", type=int)
@click.argument("folder", type=click.Path(file_okay=False), required=False)
@click.option("--reference", is_flag=True, help="Check the packaged reference solution instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@debug_option
@handle_errors
def check_cmd(number, folder, reference, as_json, debug):
    """Check the answers to lab NUMBER in FOLDER (default: the current folder)."""
    from .. import labs
    lb = labs.get(number)
    if reference and folder:
        raise ConfigError("--reference checks the packaged solution; give no FOLDER with it")
    where = lb.reference_dir() if reference else Path(folder or ".")
    if not where.is_dir():
        raise ConfigError(f"{where} is not a folder", hint=f"write one with `fornax lab new {number} DIR`")
    verdicts = lb.check(where)
    score = sum(v.points for v in verdicts)
    total = sum(v.max_points for v in verdicts)
    if as_json:
        click.echo(json.dumps({"schema": "fornax.lab-check/1", "lab": number, "score": score, "out_of": total,
                               "exercises": [{"id": v.exercise, "passed": v.passed, "points": v.points,
                                              "max_points": v.max_points, "feedback": v.text}
                                             for v in verdicts]}))
    else:
        t = Table(title=f"lab {number}: {lb.title} — {score}/{total}")
        for c in ("exercise", "result", "points", "feedback"):
            t.add_column(c)
        for v in verdicts:
            t.add_row(v.exercise, "[green]pass[/]" if v.passed else "[red]fail[/]", f"{v.points}/{v.max_points}",
                      escape(v.text))
        Console().print(t)
    raise SystemExit(0 if score == total else 1)


@lab.command(name="notebook")
@click.argument("number", type=int)
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="The notebook file (default NN-slug.ipynb in the current folder).")
@debug_option
@handle_errors
def notebook_cmd(number, out, debug):
    """Write lab NUMBER as a Jupyter notebook (needs the labs extra)."""
    from .. import labs
    from ..labs.notebook import notebook
    lb = labs.get(number)
    nb = notebook(lb)
    import nbformat
    path = Path(out or f"{lb.slug}.ipynb")
    if not path.parent.is_dir():
        raise ConfigError(f"--out {path}: folder {path.parent} does not exist")
    nbformat.write(nb, str(path))
    click.echo(f"wrote {path}; open it in Jupyter, or run it: jupyter execute {path}")


@lab.command(name="render")
@click.argument("number", type=int)
@click.option("--docs", "docs", type=click.Path(file_okay=False), default="docs/labs",
              help="Folder of the lab pages (default docs/labs).")
@debug_option
@handle_errors
def render_cmd(number, docs, debug):
    """Write lab NUMBER's page and pictures from a live run into DOCS."""
    from .. import labs
    from ..labs.render import markdown
    lb = labs.get(number)
    dest = Path(docs)
    if not dest.is_dir():
        raise ConfigError(f"{dest} is not a folder", hint="run from the repository root, or give --docs")
    pictures = dest / "img" / lb.slug
    sections = lb.run(pictures)
    page = dest / f"{lb.slug}.md"
    page.write_text(markdown(lb, sections, f"img/{lb.slug}/"), encoding="utf-8")
    click.echo(f"wrote {page}")
