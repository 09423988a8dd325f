"""Options several commands share: the stack a command runs on (``--vendor``, ``--seam``,
``--config``), as ``fornax compose`` takes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from ..stack import runnable_vendors

F = TypeVar("F", bound=Callable[..., object])


def stack_options(fn: F) -> F:
    """``--vendor V``, ``--seam SEAM=V`` (repeatable) and ``--config FILE``, passed as
    ``vendor``, ``seams`` and ``config_path``."""
    fn = click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="FILE",
                      help="Stack config TOML ([stack] vendor/spec/devices/seed, [stack.seams]).")(fn)
    fn = click.option("--seam", "seams", multiple=True, metavar="SEAM=V",
                      help="Override one seam (repeatable), e.g. --seam compiler=cuda-like.")(fn)
    return click.option("--vendor", metavar="V",
                        help=f"Set all five seams to vendor V ({', '.join(runnable_vendors())}).")(fn)
