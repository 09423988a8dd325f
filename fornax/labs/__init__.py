"""Teaching labs on stack boundaries, one per part of the series: each runs its experiments
live on the current code and checks a student's answers against what the code really does
(:mod:`.lab`); ``fornax lab list | run | new | check | render`` (:mod:`fornax.cli.lab`)."""

from __future__ import annotations

from ..layers.errors import ConfigError
from .lab import Exercise, Feedback, Lab, Section, Table
from .lab09 import LAB as LAB09
from .lab11 import LAB as LAB11

#: every lab, by number
LABS: dict[int, Lab] = {lab.number: lab for lab in (LAB09, LAB11)}


def get(number: int) -> Lab:
    """Lab ``number``; a clear error naming the labs there are."""
    if number not in LABS:
        raise ConfigError(f"there is no lab {number}; the labs are {', '.join(map(str, sorted(LABS)))}",
                          hint="see `fornax lab list`")
    return LABS[number]


__all__ = ["LABS", "Exercise", "Feedback", "Lab", "Section", "Table", "get"]
