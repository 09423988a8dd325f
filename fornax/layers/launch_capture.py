"""Captured launch sequences: a resident plan run again skips its framework and library work.

A compiled plan launched on device-resident buffers (a ``torch.compile`` graph's segment,
a ``fornax.frameworks.jax.jit`` program) makes the same runtime calls every time it runs
on a stream: the same allocations of its temporaries, the same kernel launches with the
same arguments up to where its buffers lie (the library's algorithm choice, grids and
workspaces depend only on shapes and on the library's switches), the same frees.  So, as
CUDA graphs do, the plan's second run on a stream is *captured* -- the runtime calls it and
its library make, through a :class:`RuntimeTap` that forwards each one and records it --
and later runs *replay* them: the recorded calls are made on the runtime again, in order,
without walking the plan or asking the library to plan anything, and the library's call
records are appended where a live run appends them.  (The first run is a warm-up: a
library that autotunes does it there.)

Every recorded call still goes through the runtime, the driver and the simulator, so a
replayed run has the results, device times, counters and traces of a live one: only the
host time the framework and library layers take is saved.  The caller's buffers and the
temporaries the allocator places elsewhere than at the capture are followed: arguments
inside their old ranges move with them (:func:`relocations`).  A capture is not taken (and
the reason is kept) where a replay could differ from a live run: a collective step (other
ranks take part), a library whose split-K reductions draw a fresh order per call, a call
other than an allocation, a copy, a launch or a module lookup.  It is dropped when the
library's switches change, when a module it launches was unloaded (a device reset), or
when a replay raises.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .runtime import Runtime

#: runtime calls a capture records and a replay makes again
REPLAYED = frozenset({"launch", "allocate", "deallocate", "malloc", "free", "memcpy_h2d",
                      "memcpy_d2d", "load_module"})
#: what a plan's run may read from the runtime without changing anything
QUERIES = frozenset({"current_device", "driver", "default_stream"})
#: calls whose result is a new device address (a temporary)
ALLOCATIONS = frozenset({"allocate", "malloc"})

#: one recorded call: method name, positional and keyword arguments, result, and how many
#: records the library had appended to its call log (since the capture began) before it
Call = tuple[str, tuple[Any, ...], dict[str, Any], Any, int]


class RuntimeTap:
    """Stands in for a runtime during a captured run: forwards every call, records the ones
    in :data:`REPLAYED`, and notes the first other call that changes something.  Only the
    capturing thread's calls are recorded: the library it stands in for may serve another
    thread meanwhile (its calls are forwarded, and are no part of the capture)."""

    def __init__(self, runtime: Runtime, log: list[Any] | None = None):
        self._runtime = runtime
        self._thread = threading.get_ident()
        #: the library's call log, and its length when the capture began
        self.log, self.first = log, len(log) if log is not None else 0
        self.calls: list[Call] = []
        #: why the run cannot be replayed (None: it can)
        self.refused: str | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._runtime, name)
        if threading.get_ident() != self._thread:
            return attr
        if name in REPLAYED:
            return self._recording(name, attr)
        if name not in QUERIES and callable(attr) and self.refused is None:
            self.refused = f"the plan's run calls runtime.{name}"
        return attr

    def _recording(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            logged = len(self.log) - self.first if self.log is not None else 0
            result = fn(*args, **kwargs)
            if name == "memcpy_h2d":          # the bytes as they were: the caller may reuse its array
                args = (args[0], np.array(args[1], copy=True), *args[2:])
            self.calls.append((name, args, dict(kwargs), result, logged))
            return result
        return call

    def records(self) -> list[Any]:
        """What the library appended to its call log during the capture."""
        return list(self.log[self.first:]) if self.log is not None else []


def _size(call: Call) -> int:
    name, args, kwargs, _, _ = call
    return int(args[0] if args else kwargs["nbytes"])


def relocations(places: list[tuple[int, int, int]]) -> list[tuple[int, int, int]] | None:
    """``(captured address, size, address now)`` of a call's buffers as ranges to move:
    buffers that overlapped at the capture (views of one allocation, an output written in
    place) are one range and must have moved together; None where they did not, or where
    buffers apart at the capture overlap now (the capture's calls cannot be followed)."""
    groups: list[list[int]] = []                 # [old lo, old hi, delta]
    for old, nbytes, new in sorted(places):
        hi = old + max(nbytes, 1)
        if groups and old < groups[-1][1]:
            if new - old != groups[-1][2]:
                return None
            groups[-1][1] = max(groups[-1][1], hi)
        else:
            groups.append([old, hi, new - old])
    spans = sorted((lo + d, hi + d) for lo, hi, d in groups)
    if any(a_hi > b_lo for (_, a_hi), (b_lo, _) in zip(spans, spans[1:])):
        return None
    return [(lo, hi - lo, lo + d) for lo, hi, d in groups if d]


class _Moves:
    """Old address ranges of temporaries the allocator placed elsewhere on a replay."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int, int]] = []     # (old lo, old hi, new lo)

    def placed(self, old: int, nbytes: int, new: int) -> None:
        hi = old + max(nbytes, 1)
        self.ranges = [r for r in self.ranges if r[1] <= old or r[0] >= hi]
        if new != old:
            self.ranges.append((old, hi, new))

    def moved(self, value: Any) -> Any:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            for lo, hi, new in self.ranges:
                if lo <= value < hi:
                    return new + (int(value) - lo)
        return value


def _rebased(call: Call, moves: _Moves) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A recorded call's arguments with every device address of a moved temporary moved."""
    name, args, kwargs, _, _ = call
    if not moves.ranges:
        return args, kwargs
    if name == "launch":
        module, entry, grid, kargs, *rest = args
        params = module.kernels[entry].params
        ptrs = {p.name for p in params if p.kind == "ptr"}
        kargs = {k: moves.moved(v) if k in ptrs else v for k, v in kargs.items()}
        return (module, entry, grid, kargs, *rest), kwargs
    if name in ("deallocate", "free", "memcpy_h2d"):
        return (moves.moved(args[0]), *args[1:]), kwargs
    if name == "memcpy_d2d":
        return (moves.moved(args[0]), moves.moved(args[1]), *args[2:]), kwargs
    return args, kwargs


class LaunchCapture:
    """One captured run of a plan: its runtime calls and the library records it appended
    (each after the calls made before it was appended, as in a live run)."""

    __slots__ = ("calls", "records", "modules", "buffers")

    def __init__(self, calls: list[Call], records: list[Any], buffers: list[int]):
        self.calls = calls
        self.records = records
        self.modules = [c[1][0] for c in calls if c[0] == "launch"]
        #: the caller's buffer addresses (inputs, then outputs) of the captured run
        self.buffers = buffers

    def valid(self) -> bool:
        """Whether every module it launches is still loaded (a device reset unloads them)."""
        return all(getattr(m, "loaded", False) for m in self.modules)

    def replay(self, runtime: Runtime, calls_log: list[Any] | None,
               places: list[tuple[int, int, int]] | None = None) -> None:
        """Make the recorded calls on ``runtime`` again, appending the library's records to
        ``calls_log`` where a live run would; ``places``: :func:`relocations` of the caller's
        buffers since the capture.  On an error, what this replay allocated and has not
        released is released, and the error propagates."""
        moves = _Moves()
        for old, nbytes, new in places or ():
            moves.placed(old, nbytes, new)
        records = self.records if calls_log is not None else []
        logged = 0
        live: dict[int, str] = {}          # address -> how to release it
        try:
            for call in self.calls:
                name, due = call[0], call[4]
                if due > logged:
                    calls_log.extend(records[logged:due])     # type: ignore[union-attr]
                    logged = due
                args, kwargs = _rebased(call, moves)
                result = getattr(runtime, name)(*args, **kwargs)
                if name in ALLOCATIONS:
                    moves.placed(int(call[3]), _size(call), int(result))
                    live[int(result)] = "deallocate" if name == "allocate" else "free"
                elif name in ("deallocate", "free"):
                    live.pop(int(args[0]), None)
        except BaseException:
            for ptr, how in live.items():
                try:
                    getattr(runtime, how)(ptr)
                except Exception:          # a faulted device: nothing more to release
                    pass
            raise
        if len(records) > logged:
            calls_log.extend(records[logged:])                # type: ignore[union-attr]
