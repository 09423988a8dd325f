"""The one profiling collector of a driver: what the runtime and driver seams report, fanned
out to the clients subscribed to it (:class:`Sink`).

Nothing is collected, and the seams do no profiling work beyond a ``None`` check, until a
client subscribes: :meth:`Collector.subscribe` attaches the collector to the driver
(``driver.collector``) and puts a traced wrapper, as an instance attribute, over each API
call the runtime and driver seams name in their facts (``[runtime.calls]``,
``[driver.calls]``: on the runtime, the driver and every driver queue).  When the last
client leaves, the wrappers and the collector go again.

- **API calls**: a wrapper fires the clients' enter callbacks, runs the call, fires the exit
  callbacks and hands the :class:`~.records.ApiRecord` to the clients that collect API
  activity.  Only the outermost call of a seam on a thread is a record (a runtime copy that
  synchronises its stream is one runtime call); a call made inside another shares its
  correlation id, so a runtime launch, the driver launch it makes and the kernel all carry
  one id.
- **device work**: the driver queue stamps each kernel and copy with the correlation id of
  the call that submitted it; when the work runs on the device timeline the collector makes
  a :class:`~.records.KernelActivity` (with the kernel's metrics, :mod:`.metrics`) or a
  :class:`~.records.CopyActivity` with its simulated start and end.

Every record goes straight to the clients; the collector keeps none, so it never grows.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .metrics import kernel_metrics
from .records import ApiRecord, CopyActivity, KernelActivity, Record

#: driver queue methods a traced driver wraps on each queue (the names are [driver.calls] keys)
QUEUE_CALLS = ("launch", "copy_h2d", "copy_d2h", "copy_d2d", "copy_peer", "prefetch", "synchronize")


class Sink(Protocol):
    """A client of the collector (a family's profiling interface, or a recorder)."""

    def wants_callback(self, domain: str, call: str) -> bool:
        """Whether to call :meth:`on_callback` for this API call."""

    def on_callback(self, site: str, record: ApiRecord, data: dict[str, Any]) -> None:
        """``site`` is ``enter`` or ``exit``; ``data`` lives from enter to exit of one call."""

    def wants_activity(self, kind: str) -> bool:
        """Whether to pass records of ``kind`` (kernel, memcpy, runtime, driver) to :meth:`on_record`."""

    def on_record(self, record: Record) -> None: ...


class _Open:
    """A traced call in progress."""

    __slots__ = ("record", "wall", "data")

    def __init__(self, record: ApiRecord):
        self.record = record
        self.wall = time.perf_counter_ns()
        self.data: dict[str, Any] = {}


class Collector:
    """The shared collector of one driver (and the runtime over it)."""

    def __init__(self, driver: Any):
        self.driver = driver
        self.runtimes: list[Any] = []
        self.sinks: list[Sink] = []
        self._ids = itertools.count(1)
        self._threads: dict[int, int] = {}
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._wrapped: list[tuple[Any, str]] = []
        #: what a family's interface holds exclusively in the process (CUPTI: one subscriber)
        self.exclusive: dict[str, object] = {}

    @classmethod
    def of(cls, runtime: Any) -> "Collector":
        """The collector of ``runtime``'s driver (made on first use; attached on subscribe)."""
        driver = runtime.driver
        col = getattr(driver, "collector", None) or getattr(driver, "_profiling_collector", None)
        if col is None:
            col = cls(driver)
            driver._profiling_collector = col
        if runtime not in col.runtimes:
            col.runtimes.append(runtime)
            if col.sinks:
                col._wrap_runtime(runtime)
        return col

    # -- subscribers ---------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self.sinks)

    def subscribe(self, sink: Sink) -> None:
        if sink in self.sinks:
            return
        self.sinks.append(sink)
        if len(self.sinks) == 1:
            self._attach()

    def unsubscribe(self, sink: Sink) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)
            if not self.sinks:
                self._detach()

    def _attach(self) -> None:
        d = self.driver
        d.collector = self
        for call in d.calls:
            if call != "create_queue" and callable(getattr(type(d), call, None)):
                self._wrap(d, "driver", call, d.calls[call])
        if callable(getattr(type(d), "create_queue", None)):
            self._wrap(d, "driver", "create_queue", d.calls.get("create_queue", "create_queue"),
                       after=self._wrap_queue)
        for ctx in list(getattr(d, "contexts", ())):
            for q in list(ctx.queues):
                self._wrap_queue(q)
        for rt in self.runtimes:
            self._wrap_runtime(rt)

    def _detach(self) -> None:
        for obj, name in self._wrapped:
            obj.__dict__.pop(name, None)
        self._wrapped = []
        self.driver.collector = None

    def _wrap_runtime(self, rt: Any) -> None:
        for call, name in rt.calls.items():
            if callable(getattr(type(rt), call, None)):
                self._wrap(rt, "runtime", call, name)

    def _wrap_queue(self, queue: Any) -> Any:
        if "launch" in vars(queue):                   # wrapped already
            return queue
        for call in QUEUE_CALLS:
            if callable(getattr(type(queue), call, None)):
                self._wrap(queue, "driver", call, self.driver.calls.get(call, call))
        return queue

    def _wrap(self, obj: Any, domain: str, call: str, name: str,
              after: Callable[[Any], Any] | None = None) -> None:
        fn = getattr(obj, call)
        enter, leave = self.enter, self.exit

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            opened = enter(domain, call, name)
            try:
                out = fn(*args, **kwargs)
            except BaseException as exc:
                if opened is not None:
                    opened.record.error = str(exc)
                raise
            finally:
                if opened is not None:
                    leave(opened)
            return out if after is None else after(out)

        setattr(obj, call, traced)
        self._wrapped.append((obj, call))

    # -- API calls -------------------------------------------------------------------------------
    def _stack(self) -> list[_Open]:
        stack: list[_Open] | None = getattr(self._tls, "stack", None)
        if stack is None:
            stack = self._tls.stack = []
        return stack

    def _host_time(self) -> float:
        return max((dev.timeline.host_time for dev in self.driver.devices), default=0.0)

    def correlation(self) -> int:
        """The correlation id of the API call running on this thread (0 outside any)."""
        stack = self._stack()
        return stack[-1].record.correlation if stack else 0

    def enter(self, domain: str, call: str, name: str) -> _Open | None:
        """A traced call begins (None when it is nested in a call of the same seam)."""
        stack = self._stack()
        if any(o.record.domain == domain for o in stack):
            return None
        ident = threading.get_ident()
        with self._lock:
            thread = self._threads.setdefault(ident, len(self._threads) + 1)
            corr = stack[0].record.correlation if stack else next(self._ids)
        now = self._host_time()
        opened = _Open(ApiRecord(domain, call, name, corr, thread, now, now))
        stack.append(opened)
        for sink in list(self.sinks):
            if sink.wants_callback(domain, call):
                sink.on_callback("enter", opened.record, opened.data)
        return opened

    def exit(self, opened: _Open) -> None:
        stack = self._stack()
        if stack and stack[-1] is opened:
            stack.pop()
        rec = opened.record
        rec.end_s = max(rec.start_s, self._host_time())
        rec.wall_ns = time.perf_counter_ns() - opened.wall
        for sink in list(self.sinks):
            if sink.wants_callback(rec.domain, rec.call):
                sink.on_callback("exit", rec, opened.data)
        self._emit(rec)

    def _emit(self, record: Record) -> None:
        kind = record.domain if isinstance(record, ApiRecord) else record.kind
        for sink in list(self.sinks):
            if sink.wants_activity(kind):
                sink.on_record(record)

    # -- device work (called by the driver queue) -------------------------------------------------
    def kernel(self, queue: Any, name: str, grid: tuple[int, int, int], launch: int, correlation: int,
               counters: Any, cost: Any, duration_s: float) -> None:
        """A kernel ran (from inside its packet: the device timeline's ``now`` is its start)."""
        if not any(s.wants_activity("kernel") for s in self.sinks):
            return
        device = queue.device
        start = device.timeline.now
        self._emit(KernelActivity(name, device.index, queue.hwq.id, start, start + duration_s,
                                  correlation, grid, launch,
                                  kernel_metrics(device.spec, counters, cost, duration_s),
                                  sum(counters.matrix_flops.values()) + sum(counters.vector_flops.values())))

    def copy_work(self, queue: Any, work: Callable[[], float], direction: str,
                  nbytes: int) -> Callable[[], float]:
        """``work`` of a copy, made to report a :class:`CopyActivity` when it runs."""
        corr = self.correlation()
        device = queue.device

        def run() -> float:
            start = device.timeline.now
            duration = work()
            self._emit(CopyActivity(direction, int(nbytes), device.index, queue.hwq.id, start,
                                    start + duration, corr))
            return duration

        return run
