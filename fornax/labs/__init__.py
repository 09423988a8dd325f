"""Teaching labs on stack boundaries, one per part of the series: each runs its experiments
live on the current code and checks a student's answers against what the code really does
(:mod:`.lab`); ``fornax lab list | run | new | check | render`` (:mod:`fornax.cli.lab`)."""

from __future__ import annotations

import importlib
import pkgutil

from ..layers.errors import ConfigError
from .lab import Exercise, Feedback, Lab, Section, Table


def _discover() -> dict[int, Lab]:
    """Every ``labNN`` module of this package's ``LAB``, by number (a lab is one file)."""
    found: dict[int, Lab] = {}
    for info in pkgutil.iter_modules(__path__):
        name = info.name
        if name.startswith("lab") and name[3:].isdigit():
            lab: Lab = importlib.import_module(f"{__name__}.{name}").LAB
            if lab.number != int(name[3:]) or lab.number in found:
                raise ConfigError(f"fornax/labs/{name}.py holds lab {lab.number}: one lab per file, "
                                  "the file named after its number")
            found[lab.number] = lab
    return dict(sorted(found.items()))


#: every lab, by number
LABS: dict[int, Lab] = _discover()


def get(number: int) -> Lab:
    """Lab ``number``; a clear error naming the labs there are."""
    if number not in LABS:
        raise ConfigError(f"there is no lab {number}; the labs are {', '.join(map(str, sorted(LABS)))}",
                          hint="see `fornax lab list`")
    return LABS[number]


__all__ = ["LABS", "Exercise", "Feedback", "Lab", "Section", "Table", "get"]
