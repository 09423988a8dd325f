"""The heap of a process fornax owns (the ``fornax`` command line), kept out of the cyclic
collector's way.

A process that imports PyTorch (and JAX) holds half a million or more long-lived container
objects: modules, functions, classes.  Python's full collection walks every one of them, and a
simulated stack creates enough short-lived objects to trigger one every few thousand
launches.  The command line owns its process, so it arms :func:`freeze_at_compose`: the first
stack composed after that freezes the heap as it is then (``gc.freeze()``, the frameworks and
the simulator already imported); those objects are never walked again and everything created
later is collected as usual.  A library user's process is left alone.
"""

from __future__ import annotations

import gc

_armed = False


def arm() -> None:
    """Freeze the heap at the next stack composition (once)."""
    global _armed
    _armed = True


def freeze_at_compose() -> bool:
    """Called by every composition; freezes the heap when armed (True), once."""
    global _armed
    if not _armed:
        return False
    _armed = False
    gc.freeze()
    return True
