"""The runtime's handles: :class:`Stream`, :class:`Event` and :class:`Graph` (what a
framework holds between runtime calls), and the stream flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from ..driver import Marker, Queue

BLOCKING, NON_BLOCKING = "blocking", "non_blocking"

#: one captured command: its kind ("launch", "h2d", "d2h", "d2d") then that kind's operands
#: (a launch: module, entry, grid, args; a copy: destination, source[, bytes])
GraphNode: TypeAlias = tuple[Any, ...]


@dataclass(eq=False)
class Stream:
    """A runtime stream/queue.  ``queue`` is its (first) driver queue; an out-of-order
    queue spreads its commands over ``queues``, a pool of driver queues."""

    id: int
    queue: Queue
    device: int
    blocking: bool = True              # False: a non-blocking stream (opts out of the NULL stream's syncs)
    in_order: bool = True
    kind: str = "created"              # "legacy" (NULL stream), "per_thread", "default" or "created"
    profiling: bool = True             # SYCL property::queue::enable_profiling (timing needs it there)
    queues: tuple[Queue, ...] = ()
    priority: int = 0                  # within the family's range; lower numbers run first
    capture: Graph | None = None       # the graph being captured on this stream
    destroyed: bool = False
    _next: int = 0
    _seen: dict[int, int] = field(default_factory=dict)   # sem id -> value this stream already waits for
    _waits: list[Marker] = field(default_factory=list)    # markers waited for since the last command

    def __post_init__(self) -> None:
        if not self.queues:
            self.queues = (self.queue,)

    def pick(self) -> Queue:
        """The driver queue the next command goes to (round robin for an out-of-order queue)."""
        q = self.queues[self._next % len(self.queues)]
        self._next += 1
        return q


@dataclass(eq=False)
class Event:
    """A runtime event: reached when every marker is reached.  ``timing``: whether
    elapsed times may be asked of it; ``host_time``: the host clock when it was recorded."""

    timing: bool = True
    markers: tuple[Marker, ...] = ()
    stream: Stream | None = None
    host_time: float = 0.0
    recorded: bool = False
    captured: bool = False             # recorded on a capturing stream: a graph node, not a point in time
    destroyed: bool = False            # destroy_event was called: later use is an error

    def timestamp(self) -> float | None:
        """Simulated time at which the event completed (None while it has not)."""
        t = self.host_time
        for m in self.markers:
            r = m.sem.reached_at(m.value)
            if r is None:
                return None
            t = max(t, r)
        return t


class GraphLauncher(Protocol):
    """What a :class:`Graph` replays through: the runtime that captured it."""

    def graph_launch(self, graph: Graph, stream: Stream | None = None) -> Event:
        """Submit every node of ``graph`` on ``stream`` (its capture stream when None)."""


@dataclass(eq=False)
class Graph:
    """Work captured from a stream: launches and copies, replayed by :meth:`replay`."""

    runtime: GraphLauncher
    stream: Stream
    nodes: list[GraphNode] = field(default_factory=list)
    invalidated: str | None = None     # why an illegal call during capture broke it
    instantiated: bool = False
    replays: int = 0

    def replay(self, stream: Stream | None = None) -> Event:
        """Submit every captured node again (cudaGraphLaunch / hipGraphLaunch / ext_oneapi_graph)."""
        return self.runtime.graph_launch(self, stream)
