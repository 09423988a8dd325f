"""A lab run as a markdown page (``docs/labs/NN-slug.md``, never typed by hand) and as rich
output in the terminal.

The page holds the lab's goal, every experiment's text, tables and picture links, and the
exercises' questions (never their answers).  ``fornax lab render`` writes it from a live
run; a test renders it again and fails when the committed page differs.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from .lab import Lab, Section


def markdown(lab: Lab, sections: list[Section], pictures: str = "") -> str:
    """The page of ``lab`` from ``sections``; picture links point into ``pictures`` (a folder
    relative to the page)."""
    out = [f"# Lab {lab.number}: {lab.title}", "",
           f"*{lab.part} of the series; about {lab.minutes} minutes.* This page is rendered from a "
           f"live run by `fornax lab render {lab.number}`: every number below is what the current "
           "code computes.", "", f"**Goal.** {lab.goal}", "",
           f"Run it yourself with `fornax lab run {lab.number}`; start the exercises with "
           f"`fornax lab new {lab.number} DIR` and check them with `fornax lab check {lab.number} DIR`.", ""]
    for i, sec in enumerate(sections, 1):
        out += [section_markdown(i, sec, pictures)]
    out += ["## Exercises", ""]
    for ex in lab.exercises:
        out.append(f"- **{ex.id}** ({ex.points} point{'s' if ex.points != 1 else ''}) {ex.prompt}")
    out.append("")
    return "\n".join(out)


def section_markdown(index: int, sec: Section, pictures: str = "") -> str:
    """One experiment's heading, text, tables (markdown) and picture links, ending in a blank line."""
    out = [f"## {index}. {sec.heading}", "", sec.text, ""]
    for t in sec.tables:
        out += [f"**{t.title}**", "", "| " + " | ".join(t.columns) + " |",
                "|" + "|".join("---" for _ in t.columns) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t.rows]
        out.append("")
    for p in sec.pictures:
        out += [f"![{p}]({pictures}{p})", ""]
    return "\n".join(out)


def show(lab: Lab, sections: list[Section], folder: Path, console: Console) -> None:
    """The run in the terminal: headings, text, tables, and where the pictures went."""
    console.rule(f"Lab {lab.number}: {lab.title} ({lab.part})")
    console.print(lab.goal)
    for i, sec in enumerate(sections, 1):
        console.rule(f"{i}. {sec.heading}", style="dim")
        console.print(escape(sec.text))
        for t in sec.tables:
            rt = RichTable(title=escape(t.title))
            for c in t.columns:
                rt.add_column(escape(c))
            for row in t.rows:
                rt.add_row(*(escape(c) for c in row))
            console.print(rt)
        for p in sec.pictures:
            console.print(f"picture: {folder / p}")
    console.rule("exercises", style="dim")
    for ex in lab.exercises:
        console.print(f"[bold]{ex.id}[/] ({ex.points} pt) {escape(ex.prompt)}")
