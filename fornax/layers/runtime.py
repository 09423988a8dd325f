"""The runtime seam: what frameworks call.

Current device, streams/queues, events, a caching device allocator, a pinned
host pool, synchronous and asynchronous copies, a module cache, launches and
graph capture/replay — on top of any driver, through the
:class:`~fornax.layers.driver.Driver` protocol only.  The policy is written
once here; the families differ in data (``vendor.toml`` ``[runtime]``):

- ``default_stream``: ``legacy`` (the NULL stream of CUDA and HIP, which
  waits for prior work of every blocking stream and makes every blocking
  stream wait for it) or ``in_order`` (an ordinary in-order queue, as
  torch.xpu's current stream is);
- ``queue_order``/``queue_pool``: what ``create_stream()`` gives by default —
  an in-order stream, or a SYCL-like out-of-order queue whose commands run on
  a pool of driver queues and are ordered only by ``depends_on`` events;
- ``per_thread_supported``/``per_thread_default_stream``: the per-thread
  default stream (cudaStreamPerThread, hipStreamPerThread);
- ``blocking`` and ``[runtime.sync_copy]``: which calls block the host and
  when a synchronous copy returns;
- ``event_timing``/``elapsed_incomplete``: who enables event timing (an event
  flag, or the queue's profiling property) and what an elapsed-time query on
  unfinished work does;
- ``pageable_host_rate``: the share of the host link a pageable copy reaches;
- ``[runtime.graph]``: whether captured graphs exist and what a graph node's
  launch costs relative to a stream launch.

Implicit orderings are record/wait markers on the driver queues, so the
timeline and the race detector see exactly the ordering the family promises.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..sim.faults import SimError
from .allocator import AllocatorOOM, CachingAllocator, fmt_bytes
from .binary import KernelBinary
from .driver import Context, Driver, Marker, Module, Queue
from .errors import ErrorTable, FornaxError, OutOfMemoryError

BLOCKING, NON_BLOCKING = "blocking", "non_blocking"


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
    queues: tuple = ()
    capture: "Graph | None" = None     # the graph being captured on this stream
    destroyed: bool = False
    _next: int = 0
    _seen: dict = field(default_factory=dict)     # sem id -> value this stream already waits for
    _waits: list = field(default_factory=list)    # markers waited for since the last command

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
    markers: tuple = ()
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


@dataclass(eq=False)
class Graph:
    """Work captured from a stream: launches and copies, replayed by :meth:`replay`."""

    runtime: "RuntimeBase"
    stream: Stream
    nodes: list = field(default_factory=list)
    invalidated: str | None = None     # why an illegal call during capture broke it
    instantiated: bool = False
    replays: int = 0

    def replay(self, stream: Stream | None = None) -> Event:
        """Submit every captured node again (cudaGraphLaunch / hipGraphLaunch / ext_oneapi_graph)."""
        return self.runtime.graph_launch(self, stream)


@runtime_checkable
class Runtime(Protocol):
    """What frameworks call.  Addresses are device virtual addresses (ints) of the current
    device's primary context; sizes are bytes; every asynchronous call is ordered on its
    stream (the default stream when None) and returns an :class:`Event`; errors are
    :class:`~fornax.layers.errors.FornaxError` subclasses carrying the family's runtime code."""

    vendor: str
    driver: Driver

    # devices and contexts
    def device_count(self) -> int: ...
    def set_device(self, index: int) -> None: ...
    def current_device(self) -> int: ...
    def context(self, index: int | None = None) -> Context:
        """The device's primary context, created on first use (and again after a reset)."""
    def device_reset(self, index: int | None = None) -> None:
        """Destroy everything on the device (allocations, streams, modules, graphs) and start
        afresh; a lost device is reset through the driver first."""
    # memory: the family's malloc/free (which may synchronise) and the framework-facing
    # caching allocator (allocate/deallocate never synchronise; a block is reused only on
    # the stream it was freed on)
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def allocate(self, nbytes: int, stream: Stream | None = None) -> int: ...
    def deallocate(self, ptr: int) -> None: ...
    def empty_cache(self) -> None:
        """Return every wholly unused cached segment to the driver."""
    def memory_stats(self) -> dict:
        """The caching allocator's statistics (allocated/reserved bytes, current and peak)."""
    def memory_summary(self, index: int | None = None) -> str: ...
    def malloc_host(self, nbytes: int) -> np.ndarray: ...
    def free_host(self, buf: np.ndarray) -> None: ...
    # copies
    def memcpy(self, dst, src, stream: Stream | None = None) -> None: ...
    def memcpy_h2d(self, dst: int, src: np.ndarray, stream: Stream | None = None,
                   depends_on=()) -> Event: ...
    def memcpy_d2h(self, dst: np.ndarray, src: int, stream: Stream | None = None,
                   blocking: bool = True, depends_on=()) -> Event: ...
    def memcpy_d2d(self, dst: int, src: int, nbytes: int, stream: Stream | None = None,
                   depends_on=()) -> Event: ...
    # streams and events
    def create_stream(self, flags: str = BLOCKING, in_order: bool | None = None,
                      enable_profiling: bool = False) -> Stream: ...
    def default_stream(self) -> Stream: ...
    def destroy_stream(self, stream: Stream) -> None:
        """Release a created stream; its queued work still completes."""
    def create_event(self, timing: bool = True) -> Event: ...
    def destroy_event(self, event: Event) -> None: ...
    def record_event(self, stream: Stream | None = None, event: Event | None = None) -> Event: ...
    def stream_wait_event(self, stream: Stream, event: Event) -> None: ...
    def query_event(self, event: Event) -> bool: ...
    def event_synchronize(self, event: Event) -> None: ...
    def elapsed_time(self, start: Event, end: Event) -> float:
        """Milliseconds of simulated time between two completed events."""
    def stream_synchronize(self, stream: Stream) -> None: ...
    def synchronize(self) -> None:
        """The host waits for all work of the current device (destroyed streams' too)."""
    # modules, launches, graphs
    def load_module(self, binary: KernelBinary) -> Module:
        """Through the module cache keyed by (device, binary digest)."""
    def unload_module(self, module: Module) -> None: ...
    def launch(self, module: Module, entry: str, grid, args: dict, stream: Stream | None = None,
               depends_on=()) -> Event: ...
    def begin_capture(self, stream: Stream) -> None: ...
    def end_capture(self, stream: Stream) -> Graph: ...
    def graph_launch(self, graph: Graph, stream: Stream | None = None) -> Event: ...
    def destroy_graph(self, graph: Graph) -> None: ...
    # accounting
    def handles(self) -> dict:
        """Live handles of the runtime and its driver (what churn checks)."""
    def report(self) -> dict: ...


class PinnedHostPool:
    """A caching pool of host-pinned buffers, like PyTorch's CachingHostAllocator.

    Sizes round up to a power of two (at least 512 bytes).  A freed buffer goes
    back to its size's free list; it is handed out again only once every copy
    that used it has completed (the events recorded when it was used), so a
    pending DMA never sees its buffer reused."""

    MIN = 512

    def __init__(self, runtime: "RuntimeBase"):
        self.rt = runtime
        self.free_lists: dict[int, list[tuple[int, np.ndarray]]] = {}
        self.live: dict[int, tuple[int, int, np.ndarray]] = {}   # id(base) -> (va, size, base)
        self.uses: dict[int, list[Event]] = {}
        self.stats = {"host_allocations": 0, "host_cache_hits": 0, "host_segments": 0,
                      "host_reserved_bytes": 0, "host_allocated_bytes": 0}

    @staticmethod
    def size_class(nbytes: int) -> int:
        return max(PinnedHostPool.MIN, 1 << (int(nbytes) - 1).bit_length())

    def allocate(self, nbytes: int) -> np.ndarray:
        size = self.size_class(nbytes)
        self.stats["host_allocations"] += 1
        pool = self.free_lists.setdefault(size, [])
        for i, (va, base) in enumerate(pool):
            if all(self.rt.query_event(e) for e in self.uses.get(id(base), ())):
                del pool[i]
                self.uses.pop(id(base), None)
                self.stats["host_cache_hits"] += 1
                break
        else:
            ctx = self.rt.context()
            va = self.rt.driver.allocate(ctx, size, "host_pinned")
            mapping, _ = ctx.space.resolve(va, size)
            base = mapping.buffer          # the owning array: numpy views point straight at it
            self.stats["host_segments"] += 1
            self.stats["host_reserved_bytes"] += size
        self.live[id(base)] = (va, size, base)
        self.stats["host_allocated_bytes"] += size
        return base[:int(nbytes)]

    def base_of(self, arr) -> np.ndarray | None:
        """The pool buffer ``arr`` is a view of, or None for pageable memory."""
        a = arr
        while isinstance(a, np.ndarray):
            if id(a) in self.live:
                return a
            a = a.base
        return None

    def record_use(self, arr, event: Event) -> None:
        base = self.base_of(arr)
        if base is not None:
            self.uses.setdefault(id(base), []).append(event)

    def free(self, arr) -> bool:
        base = self.base_of(arr)
        if base is None:
            return False
        va, size, base = self.live.pop(id(base))
        self.stats["host_allocated_bytes"] -= size
        self.free_lists.setdefault(size, []).append((va, base))
        return True


class RuntimeBase:
    """Shared runtime policy; a vendor subclass sets ``vendor`` and ``facts``."""

    seam = "runtime"
    vendor = "base"
    facts: dict = {}
    ROUND = 512                      # allocation granularity of the caching allocator

    def __init__(self, driver: Driver, per_thread_default_stream: bool | None = None):
        self.driver = driver
        r = self.facts["runtime"]
        self.calls: dict[str, str] = r["calls"]
        self.blocking: set[str] = set(r.get("blocking", ()))
        e = r["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="runtime", vendor=self.vendor)
        self.legacy_default = r.get("default_stream", "legacy") == "legacy"
        self.queue_order = r.get("queue_order", "in_order")
        self.out_of_order = bool(r.get("out_of_order", False))
        self.queue_pool = max(1, int(r.get("queue_pool", 1)))
        self.event_timing = r.get("event_timing", "event")
        self.elapsed_incomplete = r.get("elapsed_incomplete", "error")
        self.pageable_rate = float(r.get("pageable_host_rate", 1.0))
        self.sync_copy: dict = r.get("sync_copy", {})
        self.graph_facts: dict = r.get("graph", {})
        if per_thread_default_stream is None:
            per_thread_default_stream = bool(r.get("per_thread_default_stream", False))
        if per_thread_default_stream and not r.get("per_thread_supported", False):
            raise self._error(f"{r['api']} has no per-thread default stream", "per_thread_default_stream",
                              condition="not_supported",
                              hint="create a stream per thread with create_stream()")
        self.per_thread = bool(per_thread_default_stream)
        self._device = 0
        self._stream_ids = itertools.count(1)
        self._events: set[Event] = set()          # events of create_event not yet destroyed
        self._graphs: set[Graph] = set()          # instantiated graphs not yet destroyed
        self._deferred_frees: list[int] = []      # frees asked for while a packet ran
        self._contexts: dict[int, Context] = {}
        self._streams: dict[int, list[Stream]] = {}
        self._retiring: dict[int, list[Stream]] = {}   # destroyed streams whose work is pending
        self._defaults: dict[tuple, Stream] = {}
        self._modules: dict[tuple[int, str], Module] = {}
        self._allocators: dict[int, CachingAllocator] = {}
        self._host_pool: PinnedHostPool | None = None
        self.counts = {"malloc_calls": 0, "module_cache_hits": 0, "module_loads": 0, "launches": 0,
                       "h2d_copies": 0, "d2h_copies": 0, "d2d_copies": 0, "host_syncs": 0, "streams": 0,
                       "implicit_waits": 0, "graph_replays": 0, "graph_nodes_replayed": 0, "cached_allocations": 0,
                       "pageable_copies": 0, "pinned_copies": 0, "device_resets": 0}

    def _error(self, message: str, call: str, hint: str | None = None,
               condition: str = "invalid_value") -> FornaxError:
        """A runtime-API error with this family's exact code for ``condition``."""
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=self.calls.get(call, call), hint=hint)

    # -- devices and contexts ----------------------------------------------------
    def device_count(self) -> int:
        return self.driver.device_count()

    def set_device(self, index: int) -> None:
        if not isinstance(index, int) or not 0 <= index < self.device_count():
            raise self._error(f"device {index!r} does not exist ({self.device_count()} device(s))",
                              "set_device", condition="invalid_device")
        self._device = index

    def current_device(self) -> int:
        return self._device

    def context(self, index: int | None = None) -> Context:
        """The primary context of a device, created on first use."""
        index = self._device if index is None else index
        if index not in self._contexts:
            self._contexts[index] = self.driver.create_context(index)
        return self._contexts[index]

    def _timeline(self, device: int | None = None):
        return self.context(device).device.timeline

    # -- streams --------------------------------------------------------------------
    def _new_stream(self, kind: str, blocking: bool, in_order: bool, profiling: bool) -> Stream:
        streams = self._streams.setdefault(self._device, [])
        ctx = self.context()
        n = 1 if in_order else self.queue_pool
        queues = tuple(self.driver.create_queue(ctx) for _ in range(n))
        stream = Stream(next(self._stream_ids), queues[0], self._device, blocking, in_order, kind,
                        profiling, queues)
        streams.append(stream)
        self.counts["streams"] += 1
        return stream

    def default_stream(self) -> Stream:
        """The stream work goes to when none is named: the legacy NULL stream (cuda-like,
        rocm-like), the calling thread's own stream in per-thread mode, or an in-order queue
        (xpu-like).  It is in order on every family, so a launch plan may rely on it."""
        if self.per_thread:
            key = (self._device, "per_thread", threading.get_ident())
            kind = "per_thread"
        else:
            key = (self._device, "default")
            kind = "legacy" if self.legacy_default else "default"
        stream = self._defaults.get(key)
        if stream is None:
            stream = self._defaults[key] = self._new_stream(kind, True, True, True)
        return stream

    def legacy_stream(self) -> Stream:
        """The legacy NULL stream (cudaStreamLegacy), also reachable in per-thread mode."""
        if not self.legacy_default:
            raise self._error(f"{self.facts['runtime']['api']} has no legacy default stream",
                              "default_stream", condition="not_supported")
        key = (self._device, "default")
        stream = self._defaults.get(key)
        if stream is None:
            stream = self._defaults[key] = self._new_stream("legacy", True, True, True)
        return stream

    def create_stream(self, flags: str = BLOCKING, in_order: bool | None = None,
                      enable_profiling: bool = False) -> Stream:
        """A new stream/queue.  ``flags``: ``blocking`` (default; synchronises with the legacy
        NULL stream) or ``non_blocking``; ``in_order``: None for the family's default, True
        for an in-order queue, False for an out-of-order one where the family has them;
        ``enable_profiling``: the SYCL queue property that event timing needs there."""
        if flags not in (BLOCKING, NON_BLOCKING):
            raise self._error(f"stream flags must be {BLOCKING!r} or {NON_BLOCKING!r}, got {flags!r}",
                              "create_stream")
        if in_order is None:
            in_order = self.queue_order == "in_order"
        if not in_order and not self.out_of_order:
            raise self._error(f"{self.facts['runtime']['queue_name']} is always in order; an "
                              "out-of-order queue does not exist in this family", "create_stream",
                              condition="not_supported", hint="use several streams and events")
        return self._new_stream("created", flags == BLOCKING, bool(in_order),
                                bool(enable_profiling) or self.event_timing != "queue")

    def _stream(self, stream: Stream | None) -> Stream:
        if stream is None:
            return self.default_stream()
        if not isinstance(stream, Stream) or stream.destroyed:
            what = "destroyed" if isinstance(stream, Stream) else type(stream).__name__
            raise self._error(f"expected a stream, got a {what} one" if what == "destroyed" else
                              f"expected a stream, got {what}", "stream_synchronize",
                              condition="invalid_handle")
        return stream

    def destroy_stream(self, stream: Stream) -> None:
        """Release a stream made by :meth:`create_stream` (cudaStreamDestroy): the call
        returns at once; work already submitted still completes, then its driver queues go."""
        s = self._stream(stream)
        if s.kind != "created":
            raise self._error(f"the {s.kind} stream is not destroyable; only streams made by "
                              "create_stream() are", "destroy_stream", condition="invalid_handle")
        if s.capture is not None:
            raise self._capture_error(s, "destroying a capturing stream", "destroy_stream",
                                      "capture_unsupported")
        streams = self._streams.get(s.device, [])
        if s in streams:
            streams.remove(s)
        if any(q.hwq.pending for q in s.queues):
            # its work still counts for device synchronisation and the legacy stream's waits
            self._retiring.setdefault(s.device, []).append(s)
        s.destroyed = True
        alloc = self._allocators.get(s.device)
        if alloc is not None:
            alloc.release_stream(s.id)   # its cached blocks can never be handed out again
        for q in s.queues:
            try:
                self.driver.destroy_queue(q)
            except FornaxError:          # its context is gone (a device reset): nothing to release
                pass

    def _wait_marker(self, stream: Stream, marker: Marker) -> None:
        """Make every later command of ``stream`` wait for ``marker`` (once per value)."""
        if marker.value <= 0 or self._seen(stream, marker):
            return
        stream._seen[marker.sem.id] = marker.value
        for q in stream.queues:
            q.wait(marker)
        stream._waits.append(marker)

    @staticmethod
    def _seen(stream: Stream, marker: Marker) -> bool:
        return stream._seen.get(marker.sem.id, 0) >= marker.value

    def _implicit_sync(self, stream: Stream) -> None:
        """The legacy NULL stream's rule: its work waits for all prior work of the device's
        blocking streams, and a blocking stream's work waits for prior NULL-stream work."""
        peers = self._streams.get(stream.device, [])
        if stream.kind == "legacy" and self._retiring.get(stream.device):
            peers = peers + self._live_retiring(stream.device)
        if stream.kind == "legacy":
            others = [s for s in peers if s is not stream and s.blocking]
        elif stream.blocking:
            others = [s for s in peers if s.kind == "legacy"]
        else:
            return
        for other in others:
            if other.capture is not None:
                raise self._capture_error(
                    other, f"work on stream {stream.id} would implicitly wait for stream "
                    f"{other.id}, which is capturing", "launch", "capture_implicit")
            now = self._timeline(stream.device).host_time
            for q in other.queues:
                m = q.record()
                done = m.sem.value >= m.value and (m.sem.reached_at(m.value) or 0.0) <= now
                if m.value > 0 and not done and not self._seen(stream, m):
                    self._wait_marker(stream, m)
                    self.counts["implicit_waits"] += 1

    def _before(self, stream: Stream, depends_on) -> Queue:
        """Order a command: implicit syncs, explicit event dependencies; its driver queue."""
        self._implicit_sync(stream)
        q = stream.pick()
        for ev in depends_on or ():
            self._check_event(ev, "stream_wait_event")
            for m in ev.markers:
                if m.value > 0:
                    q.wait(m)
        return q

    def _after(self, stream: Stream, q: Queue, timing: bool = True) -> Event:
        stream._waits = []
        return Event(timing and stream.profiling, (q.record(),), stream,
                     self._timeline(stream.device).host_time, True)

    # -- events -------------------------------------------------------------------------
    def create_event(self, timing: bool = True) -> Event:
        """An event not yet recorded (cudaEventCreateWithFlags; ``timing=False`` is
        cudaEventDisableTiming).  It is this runtime's until :meth:`destroy_event`."""
        event = Event(bool(timing))
        self._events.add(event)
        return event

    def destroy_event(self, event: Event) -> None:
        """Release an event of :meth:`create_event` (cudaEventDestroy); later use is an error."""
        if not isinstance(event, Event) or event not in self._events:
            raise self._error("not an event of create_event, or already destroyed", "destroy_event",
                              condition="invalid_handle")
        self._events.discard(event)
        event.destroyed = True

    def record_event(self, stream: Stream | None = None, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) at the current end of ``stream``: it completes
        when everything submitted there before it has (on an out-of-order queue: every
        earlier command, as a barrier does)."""
        s = self._stream(stream)
        ev = event if event is not None else Event(True)
        if not isinstance(ev, Event) or ev.destroyed:
            raise self._error("the event was destroyed" if isinstance(ev, Event) else
                              f"expected an event, got {type(ev).__name__}", "record_event",
                              condition="invalid_handle")
        ev.stream, ev.recorded = s, True
        if s.capture is not None:
            ev.markers, ev.captured = (), True
            return ev
        self._implicit_sync(s)
        ev.markers = tuple(q.record() for q in s.queues) + tuple(s._waits)
        ev.captured = False
        ev.host_time = self._timeline(s.device).host_time
        ev.timing = ev.timing and s.profiling
        return ev

    def _check_event(self, event, call: str) -> Event:
        if not isinstance(event, Event) or event.destroyed:
            raise self._error("the event was destroyed" if isinstance(event, Event) else
                              f"expected an event, got {type(event).__name__}", call,
                              condition="invalid_handle")
        if not event.recorded:
            raise self._error("the event was never recorded", call, condition="invalid_handle",
                              hint=f"record it first ({self.calls.get('record_event', 'record_event')})")
        if event.captured and call != "stream_wait_event":
            raise self._capture_error(event.stream, "the event was recorded during a capture and "
                                      "stands for a graph node, not a point in time", call,
                                      "capture_unsupported")
        return event

    def stream_wait_event(self, stream: Stream, event: Event) -> None:
        """Later work on ``stream`` waits until ``event`` has completed."""
        s = self._stream(stream)
        self._check_event(event, "stream_wait_event")
        for m in event.markers:
            self._wait_marker(s, m)

    def _run_until_host_time(self, device: int) -> float:
        tl = self._timeline(device)
        while tl.step(before=tl.host_time):
            pass
        return tl.host_time

    def query_event(self, event: Event) -> bool:
        """Whether the work before ``event`` has finished *by now*.  The simulator is lazy:
        the query runs the device up to the host's current simulated time and answers
        whether the event's time is at or before it (a query never advances the host)."""
        ev = self._check_event(event, "query_event")
        now = self._run_until_host_time(ev.stream.device)
        t = ev.timestamp()
        done = t is not None and t <= now
        if done:
            self._wait_event(ev, "query_event")       # host sees its effects; time does not move
        return done

    def _wait_event(self, ev: Event, call: str) -> None:
        ctx = self.context(ev.stream.device)
        tl = ctx.device.timeline
        for m in ev.markers:
            try:
                tl.wait(m.sem, m.value)
            except SimError as exc:
                fault = getattr(self.driver, "fault", None)
                raise (fault(ctx, exc, "synchronize") if fault else
                       self._error(str(exc), call, condition="unknown")) from None
        tl.host_time = max(tl.host_time, ev.host_time)

    def event_synchronize(self, event: Event) -> None:
        """The host waits until ``event`` has completed."""
        ev = self._check_event(event, "event_synchronize")
        self._wait_event(ev, "event_synchronize")
        self.counts["host_syncs"] += 1

    def elapsed_time(self, start: Event, end: Event) -> float:
        """Milliseconds of simulated time between two completed events (cudaEventElapsedTime)."""
        for ev in (start, end):
            self._check_event(ev, "elapsed_time")
            if not ev.timing:
                what = ("was created with timing disabled" if self.event_timing == "event" else
                        "comes from a queue without the enable_profiling property")
                raise self._error(f"the event {what}", "elapsed_time", condition="invalid_handle")
        times = []
        for ev in (start, end):
            if not self.query_event(ev):
                if self.elapsed_incomplete != "wait":
                    raise self._error("the work before the event has not completed yet",
                                      "elapsed_time", condition="not_ready",
                                      hint="synchronize the event first")
                self._wait_event(ev, "elapsed_time")
            times.append(ev.timestamp())
        return (times[1] - times[0]) * 1e3

    # -- host-blocking calls -----------------------------------------------------------------
    def _capturing(self, device: int | None = None) -> list[Stream]:
        device = self._device if device is None else device
        return [s for s in self._streams.get(device, []) if s.capture is not None]

    def _capture_error(self, stream: Stream, what: str, call: str, condition: str) -> FornaxError:
        if stream is not None and stream.capture is not None and stream.capture.invalidated is None:
            stream.capture.invalidated = f"{self.calls.get(call, call)}: {what}"
        return self._error(f"{what} (stream {stream.id if stream else '?'} is capturing)", call,
                           condition=condition,
                           hint=f"end the capture ({self.calls.get('end_capture', 'end_capture')}) "
                                "before synchronising or use asynchronous calls")

    def _host_sync(self, call: str) -> None:
        """A call that synchronises the device with the host: illegal while any stream captures."""
        capturing = self._capturing()
        if capturing:
            raise self._capture_error(capturing[0], f"{self.calls.get(call, call)} synchronises "
                                      "the device", call, "capture_unsupported")
        self.synchronize()

    def _maybe_block(self, call: str) -> None:
        if call in self.blocking:
            self._host_sync(call)

    def stream_synchronize(self, stream: Stream | None = None) -> None:
        """The host waits for every command submitted to ``stream``."""
        s = self._stream(stream)
        if s.capture is not None:
            raise self._capture_error(s, "synchronising a capturing stream", "stream_synchronize",
                                      "capture_unsupported")
        for q in s.queues:                             # waits with no command yet become a barrier
            q.synchronize()
        self.counts["host_syncs"] += 1

    # -- memory: a caching allocator per device -------------------------------------------
    def allocator(self, index: int | None = None) -> CachingAllocator:
        index = self._device if index is None else index
        if index not in self._allocators:
            ctx = self.context(index)
            self._allocators[index] = CachingAllocator(
                lambda n: self.driver.allocate(ctx, n), lambda p: self.driver.free(ctx, p),
                lambda: self.driver.memory_info(index), OutOfMemoryError)
        return self._allocators[index]

    def malloc(self, nbytes: int, stream: Stream | None = None) -> int:
        self._check_size(nbytes)
        self._free_deferred()
        self._maybe_block("malloc")
        self.counts["malloc_calls"] += 1
        return self._carve(nbytes, stream)

    def free(self, ptr: int) -> None:
        if any(d.timeline.stepping for d in self.driver.devices):
            # reached from inside a running packet (a finaliser the garbage collector ran):
            # a blocking free would re-enter the timeline, so it happens at the next call
            self._deferred_frees.append(ptr)
            return
        self._free_deferred()
        alloc = self._owner(ptr, self.calls.get("malloc", "malloc"))
        self._maybe_block("free")
        alloc.free(ptr)

    def _free_deferred(self) -> None:
        """Carry out the frees :meth:`free` deferred while a packet was running."""
        while self._deferred_frees:
            ptr = self._deferred_frees.pop()
            try:
                self.free(ptr)
            except FornaxError:        # its context went away meanwhile: nothing left to free
                pass

    def allocate(self, nbytes: int, stream: Stream | None = None) -> int:
        """The framework-facing caching allocator (PyTorch's ``CUDACachingAllocator::raw_alloc``):
        never synchronises the device, whatever the family's ``malloc`` does; a block freed
        with :meth:`deallocate` is reused only by later allocations on the same stream, so
        stream order keeps its old users safe."""
        self._check_size(nbytes)
        self.counts["cached_allocations"] += 1
        return self._carve(nbytes, stream)

    def deallocate(self, ptr: int) -> None:
        """Return a block of :meth:`allocate` to its stream's pool (no synchronisation)."""
        self._owner(ptr, "the caching allocator").free(ptr)

    def _check_size(self, nbytes) -> None:
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
            raise self._error(f"allocation size must be a positive integer, got {nbytes!r}", "malloc")

    def _carve(self, nbytes: int, stream: Stream | None) -> int:
        try:
            return self.allocator().allocate(int(nbytes), stream.id if stream is not None else 0)
        except AllocatorOOM as exc:
            raise self._error(f"out of memory: {exc}", "malloc",
                              hint="free tensors, call empty_cache(), or use a larger spec",
                              condition="out_of_memory") from exc

    def _owner(self, ptr: int, source: str) -> CachingAllocator:
        alloc = next((a for a in self._allocators.values() if a.owns(ptr)), None)
        if alloc is None:
            raise self._error(f"{ptr!r} was not returned by {source} or was already freed", "free")
        return alloc

    def empty_cache(self) -> None:
        """Return every wholly unused cached segment to the driver."""
        for alloc in self._allocators.values():
            alloc.empty_cache()

    def memory_stats(self, index: int | None = None) -> dict:
        """The caching allocator's statistics for a device (PyTorch's memory_stats, flattened)."""
        stats = dict(self.allocator(index).stats)
        if self._host_pool is not None:
            stats.update(self._host_pool.stats)
        return stats

    def memory_summary(self, index: int | None = None) -> str:
        index = self._device if index is None else index
        return self.allocator(index).summary(
            f"{self.facts['runtime']['api']} caching allocator, device {index}")

    # -- pinned host memory ---------------------------------------------------------------------
    @property
    def host_pool(self) -> PinnedHostPool:
        if self._host_pool is None:
            self._host_pool = PinnedHostPool(self)
        return self._host_pool

    def malloc_host(self, nbytes: int) -> np.ndarray:
        """A host buffer (uint8 array of ``nbytes``) backed by page-locked memory from a caching
        pool (cudaHostAlloc / hipHostMalloc / sycl::malloc_host); copies from and to it run
        at the host link's full bandwidth."""
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
            raise self._error(f"allocation size must be a positive integer, got {nbytes!r}",
                              "malloc_host")
        try:
            return self.host_pool.allocate(int(nbytes))
        except FornaxError as exc:
            raise self._error(f"cannot allocate {fmt_bytes(int(nbytes))} of pinned host memory: "
                              f"{exc.message}", "malloc_host", condition="out_of_memory") from None

    def free_host(self, buf: np.ndarray) -> None:
        """Return a pinned buffer to the pool (reused once its pending copies are done)."""
        if not self.host_pool.free(buf):
            raise self._error("the buffer was not returned by "
                              f"{self.calls.get('malloc_host', 'malloc_host')} or was already freed",
                              "free_host")

    def is_pinned(self, arr) -> bool:
        return self._host_pool is not None and self._host_pool.base_of(arr) is not None

    def _host_rate(self, arr) -> float:
        if self.is_pinned(arr):
            self.counts["pinned_copies"] += 1
            return 1.0
        self.counts["pageable_copies"] += 1
        return self.pageable_rate

    # -- copies ------------------------------------------------------------------------------
    def memcpy_h2d(self, dst: int, src: np.ndarray, stream: Stream | None = None,
                   depends_on=()) -> Event:
        """Asynchronous host-to-device copy (cudaMemcpyAsync and kin); returns its event."""
        s = self._stream(stream)
        self.counts["h2d_copies"] += 1
        if s.capture is not None:
            return self._capture_node(s, ("h2d", dst, src))
        q = self._before(s, depends_on)
        q.copy_h2d(dst, src, host_rate=self._host_rate(src))
        ev = self._after(s, q)
        self._record_host_use(src, ev)
        self._maybe_block("memcpy_h2d")
        return ev

    def memcpy_d2h(self, dst: np.ndarray, src: int, stream: Stream | None = None,
                   blocking: bool = True, depends_on=()) -> Event:
        """Device-to-host copy; ``blocking`` waits for the stream (the synchronous form)."""
        s = self._stream(stream)
        if s.capture is not None:
            if blocking:
                raise self._capture_error(s, "a synchronous device-to-host copy", "memcpy",
                                          "capture_unsupported")
            self.counts["d2h_copies"] += 1
            return self._capture_node(s, ("d2h", dst, src))
        q = self._before(s, depends_on)
        q.copy_d2h(dst, src, host_rate=self._host_rate(dst))
        self.counts["d2h_copies"] += 1
        ev = self._after(s, q)
        self._record_host_use(dst, ev)
        if blocking:
            self.stream_synchronize(s)
        return ev

    def _record_host_use(self, arr, ev: Event) -> None:
        if self._host_pool is not None:
            self._host_pool.record_use(arr, ev)

    def memcpy(self, dst, src, stream: Stream | None = None) -> None:
        """The synchronous copy (cudaMemcpy, hipMemcpy, queue.memcpy(...).wait()); the
        direction follows the arguments.  When it returns is the family's
        ``[runtime.sync_copy]`` rule: ``complete`` (the copy is done) or ``staged`` (a
        pageable upload returns once its data sits in the staging buffer: the stream's
        earlier work is done and the DMA is queued, not finished)."""
        s = self._stream(stream)
        if s.capture is not None or self._capturing(s.device) and s.kind == "legacy":
            target = s if s.capture is not None else self._capturing(s.device)[0]
            raise self._capture_error(target, "a synchronous copy", "memcpy", "capture_unsupported")
        if isinstance(dst, np.ndarray) and not isinstance(src, np.ndarray):
            self.memcpy_d2h(dst, src, s, blocking=self.sync_copy.get("d2h", "complete") == "complete")
            return
        if not isinstance(src, np.ndarray):
            raise self._error("memcpy copies between a host array and a device address; got "
                              f"{type(dst).__name__} <- {type(src).__name__}", "memcpy")
        rule = self.sync_copy.get("h2d_pinned" if self.is_pinned(src) else "h2d_pageable", "complete")
        if rule == "staged":
            self.stream_synchronize(s)             # "a stream sync is performed before the copy"
        self.memcpy_h2d(dst, src, s)
        if rule == "complete":
            self.stream_synchronize(s)

    def memcpy_d2d(self, dst: int, src: int, nbytes: int, stream: Stream | None = None,
                   depends_on=()) -> Event:
        """Asynchronous device-to-device copy on a stream (cudaMemcpyAsync DeviceToDevice,
        hipMemcpyAsync, queue.memcpy between USM device pointers); returns its event."""
        s = self._stream(stream)
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
            raise self._error(f"copy size must be a non-negative integer, got {nbytes!r}", "memcpy_d2d")
        self.counts["d2d_copies"] += 1
        if nbytes == 0:
            return self.record_event(s)
        if s.capture is not None:
            return self._capture_node(s, ("d2d", int(dst), int(src), int(nbytes)))
        q = self._before(s, depends_on)
        q.copy_d2d(int(dst), int(src), int(nbytes))
        return self._after(s, q)

    # -- modules and launches ------------------------------------------------------------------
    def load_module(self, binary: KernelBinary) -> Module:
        if not isinstance(binary, KernelBinary):
            raise self._error(f"expected a KernelBinary, got {type(binary).__name__}", "load_module")
        key = (self._device, binary.digest)
        module = self._modules.get(key)
        if module is not None:
            self.counts["module_cache_hits"] += 1
            return module
        module = self.driver.load_module(self.context(), binary)
        self._modules[key] = module
        self.counts["module_loads"] += 1
        return module

    def unload_module(self, module: Module) -> None:
        """Drop a module from the runtime's cache and unload it from the driver
        (cudaLibraryUnload / hipModuleUnload / a kernel bundle's release)."""
        key = next((k for k, m in self._modules.items() if m is module), None)
        if key is None:
            raise self._error("not a module this runtime loaded, or already unloaded",
                              "unload_module", condition="invalid_handle")
        del self._modules[key]
        self.driver.unload_module(module)

    def launch(self, module: Module, entry: str, grid, args: dict, stream: Stream | None = None,
               depends_on=()) -> Event:
        """Launch a kernel on a stream (after ``depends_on`` events); returns its event."""
        s = self._stream(stream)
        self.counts["launches"] += 1
        if s.capture is not None:
            return self._capture_node(s, ("launch", module, entry, tuple(grid), dict(args)))
        q = self._before(s, depends_on)
        q.launch(module, entry, grid, args)
        return self._after(s, q)

    def synchronize(self) -> None:
        """The host waits for all work of the current device (cudaDeviceSynchronize)."""
        capturing = self._capturing()
        if capturing:
            raise self._capture_error(capturing[0], "synchronising the device", "synchronize",
                                      "capture_unsupported")
        for stream in self._streams.get(self._device, []) + self._retiring.pop(self._device, []):
            for q in stream.queues:
                q.synchronize()
        self.counts["host_syncs"] += 1
        self._free_deferred()

    def _live_retiring(self, device: int) -> list[Stream]:
        """Destroyed streams of ``device`` that still have work queued (the rest are forgotten)."""
        live = [s for s in self._retiring.get(device, []) if any(q.hwq.pending for q in s.queues)]
        self._retiring[device] = live
        return live

    # -- graph capture and replay ------------------------------------------------------------
    def begin_capture(self, stream: Stream) -> None:
        """Start recording ``stream``: its launches and asynchronous copies become graph
        nodes instead of running.  The legacy NULL stream cannot be captured."""
        s = self._stream(stream)
        if not self.graph_facts.get("supported", False):
            raise self._error(f"{self.facts['runtime']['api']} has no graph capture", "begin_capture",
                              condition="not_supported")
        if s.kind == "legacy":
            raise self._error("the legacy default stream cannot be captured", "begin_capture",
                              condition="capture_unsupported",
                              hint="capture a stream made with create_stream()")
        if s.capture is not None:
            raise self._error(f"stream {s.id} is already capturing", "begin_capture",
                              condition="invalid_value")
        s.capture = Graph(self, s)

    def _capture_node(self, stream: Stream, node: tuple) -> Event:
        stream.capture.nodes.append(node)
        return Event(False, (), stream, 0.0, True, True)

    def end_capture(self, stream: Stream) -> Graph:
        """Stop recording and return the executable graph (capture end + instantiate)."""
        s = self._stream(stream)
        graph = s.capture
        if graph is None:
            raise self._error(f"stream {s.id} is not capturing", "end_capture",
                              condition="invalid_value")
        s.capture = None
        if graph.invalidated is not None:
            raise self._error(f"the capture was invalidated by an illegal call ({graph.invalidated})",
                              "end_capture", condition="capture_invalidated",
                              hint="capture again without synchronising calls")
        graph.instantiated = True
        self._graphs.add(graph)
        return graph

    def destroy_graph(self, graph: Graph) -> None:
        """Release an instantiated graph (cudaGraphExecDestroy); it can no longer be launched."""
        if not isinstance(graph, Graph) or graph not in self._graphs:
            raise self._error("not an instantiated graph of this runtime, or already destroyed",
                              "destroy_graph", condition="invalid_handle")
        self._graphs.discard(graph)
        graph.instantiated = False
        graph.nodes = []

    def graph_launch(self, graph: Graph, stream: Stream | None = None) -> Event:
        """Submit a captured graph as one launch: the first kernel pays the stream launch
        latency, every further kernel node ``[runtime.graph] node_launch_fraction`` of it."""
        if not isinstance(graph, Graph) or not graph.instantiated or graph.runtime is not self:
            raise self._error("not an instantiated graph of this runtime", "graph_launch",
                              condition="invalid_handle")
        s = self._stream(stream if stream is not None else graph.stream)
        if s.capture is not None:
            raise self._capture_error(s, "launching a graph into a capturing stream", "graph_launch",
                                      "capture_unsupported")
        fraction = float(self.graph_facts.get("node_launch_fraction", 1.0))
        q = self._before(s, ())
        first = True
        try:
            for node in graph.nodes:
                kind = node[0]
                if kind == "launch":
                    q.launch_scale = 1.0 if first else fraction
                    q.launch(*node[1:])
                    first = False
                elif kind == "h2d":
                    q.copy_h2d(node[1], node[2], host_rate=self._host_rate(node[2]))
                elif kind == "d2d":
                    q.copy_d2d(*node[1:])
                else:
                    q.copy_d2h(node[1], node[2], host_rate=self._host_rate(node[1]))
        finally:
            q.launch_scale = 1.0
        graph.replays += 1
        self.counts["graph_replays"] += 1
        self.counts["graph_nodes_replayed"] += len(graph.nodes)
        return self._after(s, q)

    # -- handles and reset -----------------------------------------------------------------------
    def handles(self) -> dict:
        """Live handles: streams made by create_stream, events of create_event, loaded modules,
        instantiated graphs, live device blocks; and the driver's contexts, queues, modules."""
        created = sum(1 for ss in self._streams.values() for s in ss if s.kind == "created")
        blocks = sum(len(a.active) for a in self._allocators.values())
        return {"streams": created, "events": len(self._events), "modules": len(self._modules),
                "graphs": len(self._graphs), "device_blocks": blocks,
                **{f"driver_{k}": v for k, v in self.driver.handles().items()}}

    def device_reset(self, index: int | None = None) -> None:
        """Destroy everything this runtime holds on a device and start it afresh
        (``[runtime.calls] device_reset``: cudaDeviceReset, hipDeviceReset; the SYCL runtime
        makes a new context).  The primary context goes with every allocation, stream, module
        and graph in it: a context made unusable by a sticky error is destroyed, a lost
        device is reset in hardware first (the driver's ``reset``).  Old addresses, streams
        and modules are invalid afterwards; the next call creates a fresh context."""
        index = self._device if index is None else index
        if not isinstance(index, int) or not 0 <= index < self.device_count():
            raise self._error(f"device {index!r} does not exist ({self.device_count()} device(s))",
                              "device_reset", condition="invalid_device")
        ctx = self._contexts.pop(index, None)
        if self.driver.is_lost(index):
            self.driver.reset(index)             # destroys every context on the device
        elif ctx is not None and ctx.live:
            self.driver.destroy_context(ctx)
        self._retiring.pop(index, None)
        for s in self._streams.pop(index, []):
            s.destroyed = True
            if s.capture is not None:
                s.capture = None
        self._defaults = {k: v for k, v in self._defaults.items() if k[0] != index}
        self._modules = {k: m for k, m in self._modules.items() if k[0] != index}
        self._graphs = {g for g in self._graphs if g.stream.device != index}
        self._events = {e for e in self._events if e.stream is None or e.stream.device != index}
        self._allocators.pop(index, None)       # its memory went with the context
        self._deferred_frees.clear()
        self.counts["device_resets"] += 1

    def report(self) -> dict:
        return {"vendor": self.vendor, "api": self.facts["runtime"]["api"],
                "queue_kind": self.facts["runtime"]["queue_name"],
                "default_stream": "per-thread" if self.per_thread else
                ("legacy" if self.legacy_default else "in-order queue"),
                **self.counts, **self.memory_stats()}
