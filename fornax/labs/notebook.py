"""A lab as a Jupyter notebook, generated from the same source as its page (the ``labs``
extra: nbformat; executed with nbclient in the tests).

The notebook runs the lab live: a code cell runs the experiments (pictures into
``lab-N-output`` beside the notebook), the next displays every experiment's heading, text,
tables and pictures as markdown, rendered by the same function the page uses
(:func:`~fornax.labs.render.section_markdown`), and a last markdown cell lists the
exercises with the commands that start and check them.
"""

from __future__ import annotations

from typing import Any

from ..layers.errors import ConfigError
from .lab import Lab


def notebook(lab: Lab) -> Any:
    """The notebook of ``lab`` (an ``nbformat`` v4 notebook node)."""
    try:
        import nbformat.v4 as nbf
    except ImportError:
        raise ConfigError("lab notebooks need nbformat, which is not installed: pip install fornax[labs]",
                          hint="or read the lab's page in docs/labs and run `fornax lab run N`") from None
    out = f"lab-{lab.number}-output"
    exercises = "\n".join(f"- **{ex.id}** ({ex.points} point{'s' if ex.points != 1 else ''}) {ex.prompt}"
                          for ex in lab.exercises)
    cells = [
        nbf.new_markdown_cell(f"# Lab {lab.number}: {lab.title}\n\n*{lab.part} of the series; about "
                              f"{lab.minutes} minutes.*\n\n**Goal.** {lab.goal}\n\nThe next cell runs the "
                              f"lab's experiments live on the current code (pictures go to `{out}/`)."),
        nbf.new_code_cell("from pathlib import Path\n\nfrom IPython.display import Markdown, display\n\n"
                          "from fornax import labs\nfrom fornax.labs.render import section_markdown\n\n"
                          f"lab = labs.get({lab.number})\nsections = lab.run(Path({out!r}))\n"
                          "print(f'{len(sections)} experiments ran')"),
        nbf.new_code_cell("for i, section in enumerate(sections, 1):\n"
                          f"    display(Markdown(section_markdown(i, section, {out + '/'!r})))"),
        nbf.new_markdown_cell(f"## Exercises\n\n{exercises}\n\nStart them with `fornax lab new {lab.number} DIR` "
                              f"and check them with `fornax lab check {lab.number} DIR`."),
    ]
    return nbf.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                  "display_name": "Python 3"}})
