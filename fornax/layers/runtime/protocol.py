"""The runtime seam's contract: the :class:`Runtime` Protocol, what frameworks call.

A front end reaches a runtime only through it.  An implementation need not
subclass :class:`~fornax.layers.runtime.base.RuntimeBase`; it must provide every
member declared here, with these semantics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from numpy.typing import NDArray

from ..binary import KernelBinary
from ..driver import Context, Driver, HostArray, KernelArgs, Module
from ..errors import ErrorTable
from .handles import BLOCKING, Event, Graph, Stream


@runtime_checkable
class Runtime(Protocol):
    """What frameworks call.  Addresses are device virtual addresses (ints) of the current
    device's primary context; sizes are bytes; every asynchronous call is ordered on its
    stream (the default stream when None) and returns an :class:`Event`; errors are
    :class:`~fornax.layers.errors.FornaxError` subclasses carrying the family's runtime code."""

    vendor: str
    #: the driver underneath (the runtime owns the contexts it creates there)
    driver: Driver
    #: the family's API name for each runtime call (``malloc`` -> ``cudaMalloc``); errors
    #: name the call this way
    calls: dict[str, str]
    #: the family's runtime error codes: every error this runtime raises comes from it
    errors: ErrorTable

    # devices and contexts
    def device_count(self) -> int:
        """How many devices the driver sees."""
    def set_device(self, index: int) -> None:
        """Make device ``index`` current for later calls; ``invalid_device`` out of range."""
    def current_device(self) -> int:
        """The current device's index (0 until :meth:`set_device`)."""
    def context(self, index: int | None = None) -> Context:
        """The device's primary context, created on first use (and again after a reset)."""
    def device_reset(self, index: int | None = None) -> None:
        """Destroy everything on the device (allocations, streams, modules, graphs) and start
        afresh; a lost device is reset through the driver first."""
    # memory: the family's malloc/free (which may synchronise) and the framework-facing
    # caching allocator (allocate/deallocate never synchronise; a block is reused only on
    # the stream it was freed on)
    def malloc(self, nbytes: int, stream: Stream | None = None) -> int:
        """``nbytes`` (> 0) of device memory; blocks the host where the family's malloc does.
        With ``stream``, the allocation is ordered on it (the caching allocator may reuse a
        block freed on that stream without waiting).
        Raises ``out_of_memory`` (after returning cached blocks) or ``invalid_value``."""
    def free(self, ptr: int) -> None:
        """Free a block of :meth:`malloc` (synchronising where the family's free does)."""
    def allocate(self, nbytes: int, stream: Stream | None = None) -> int:
        """A cached block of ``nbytes`` for work on ``stream``; never synchronises."""
    def deallocate(self, ptr: int) -> None:
        """Return a block of :meth:`allocate` to its stream's pool; never synchronises."""
    def empty_cache(self) -> None:
        """Return every wholly unused cached segment to the driver."""
    def memory_stats(self, index: int | None = None) -> dict[str, int]:
        """The caching allocator's statistics for device ``index`` (the current one when
        None): allocated/reserved bytes, current and peak, cache hits, OOMs, and the pinned
        host pool's counters once it exists."""
    def memory_summary(self, index: int | None = None) -> str:
        """A human-readable table of the device's caching allocator."""
    def malloc_host(self, nbytes: int) -> NDArray[Any]:
        """A uint8 host array of ``nbytes`` in page-locked memory (copies run at full host
        link rate); the caller owns it until :meth:`free_host`."""
    def free_host(self, buf: NDArray[Any]) -> None:
        """Return a buffer of :meth:`malloc_host` (reused once its pending copies are done)."""
    # copies
    def memcpy(self, dst: int | NDArray[Any], src: int | NDArray[Any],
               stream: Stream | None = None) -> None:
        """The synchronous copy between a host array and a device address (the direction
        follows the arguments); when it returns is the family's ``[runtime.sync_copy]`` rule."""
    def memcpy_h2d(self, dst: int, src: HostArray, stream: Stream | None = None,
                   depends_on: Iterable[Event] = (), held: bool = False) -> Event:
        """Asynchronous copy of ``src`` to ``dst`` after ``depends_on``; its event.  Its bytes
        are staged at the call unless ``held``: the caller keeps ``src`` unchanged until it
        has waited for the copy (then the copy reads ``src`` itself when it runs)."""
    def memcpy_d2h(self, dst: HostArray, src: int, stream: Stream | None = None,
                   blocking: bool = True, depends_on: Iterable[Event] = ()) -> Event:
        """Copy ``dst.nbytes`` at ``src`` into ``dst``; ``blocking`` waits for the stream.
        (On a shape-only device either host array may be a shape alone.)"""
    def memcpy_d2d(self, dst: int, src: int, nbytes: int, stream: Stream | None = None,
                   depends_on: Iterable[Event] = ()) -> Event:
        """Asynchronous device-to-device copy of ``nbytes`` (>= 0); its event."""
    # streams and events
    def create_stream(self, flags: str = BLOCKING, in_order: bool | None = None,
                      enable_profiling: bool = False, priority: int = 0) -> Stream:
        """A new stream owned by the caller until :meth:`destroy_stream`; ``flags``
        ``blocking`` or ``non_blocking``; ``not_supported`` for an out-of-order queue in a
        family without them; ``priority`` clamped to :meth:`stream_priority_range`."""
    def stream_priority_range(self) -> tuple[int, int]:
        """(least, greatest) priority; lower numbers run first when queues compete."""
    def default_stream(self) -> Stream:
        """The stream work goes to when none is named; always in order."""
    def destroy_stream(self, stream: Stream) -> None:
        """Release a created stream; its queued work still completes."""
    def create_event(self, timing: bool = True) -> Event:
        """An unrecorded event owned by the caller until :meth:`destroy_event`."""
    def destroy_event(self, event: Event) -> None:
        """Release an event of :meth:`create_event`; later use is ``invalid_handle``."""
    def record_event(self, stream: Stream | None = None, event: Event | None = None) -> Event:
        """Record ``event`` (a new one when None) after everything submitted to ``stream``."""
    def stream_wait_event(self, stream: Stream, event: Event) -> None:
        """Later work on ``stream`` waits until ``event`` has completed (host does not wait)."""
    def query_event(self, event: Event) -> bool:
        """Whether the work before ``event`` has finished by the host's current time."""
    def event_synchronize(self, event: Event) -> None:
        """The host waits until ``event`` has completed; raises a fault of that work."""
    def elapsed_time(self, start: Event, end: Event) -> float:
        """Milliseconds of simulated time between two completed events."""
    def stream_synchronize(self, stream: Stream) -> None:
        """The host waits for every command submitted to ``stream``."""
    def synchronize(self) -> None:
        """The host waits for all work of the current device (destroyed streams' too)."""
    # modules, launches, graphs
    def load_module(self, binary: KernelBinary) -> Module:
        """Through the module cache keyed by (device, binary digest)."""
    def unload_module(self, module: Module) -> None:
        """Drop ``module`` from the cache and unload it from the driver."""
    def launch(self, module: Module, entry: str, grid: Sequence[int], args: KernelArgs,
               stream: Stream | None = None, depends_on: Iterable[Event] = ()) -> Event:
        """Launch kernel ``entry`` of ``module`` over ``grid`` on ``stream`` after
        ``depends_on``; its event (a graph node's while the stream captures)."""
    def begin_capture(self, stream: Stream) -> None:
        """Start capturing ``stream``: its launches and async copies become graph nodes."""
    def end_capture(self, stream: Stream) -> Graph:
        """Stop capturing and return the instantiated graph; raises if an illegal call
        invalidated the capture."""
    def graph_launch(self, graph: Graph, stream: Stream | None = None) -> Event:
        """Submit every node of ``graph`` as one launch; its event."""
    def destroy_graph(self, graph: Graph) -> None:
        """Release an instantiated graph; it can no longer be launched."""
    # profiling
    def profiler(self) -> Any:
        """The family's profiling interface over this runtime and its driver (one per
        runtime; a :class:`~fornax.layers.profiler.ProfilerBase`): CUPTI-like,
        rocprofiler-sdk-like or Level Zero tracer-like, over the one shared collector."""
    # accounting
    def handles(self) -> dict[str, int]:
        """Live handles of the runtime and its driver (what churn checks)."""
    def report(self) -> dict[str, Any]:
        """This runtime's part of the run report (JSON-serialisable)."""
