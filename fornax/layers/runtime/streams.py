"""Runtime streams: creating and destroying them, the default stream (the legacy NULL
stream, the per-thread stream, or an in-order queue), the legacy stream's implicit
synchronisation, and the host waits on streams and on the device."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..driver import Marker
from ..errors import FornaxError
from .core import RuntimeCore
from .handles import BLOCKING, NON_BLOCKING, Stream


class StreamRules(RuntimeCore):
    """Streams and their ordering rules."""

    if TYPE_CHECKING:
        # carried out by the memory rules (RuntimeMemory), which a synchronise runs
        def _free_deferred(self) -> None: ...

    def _new_stream(self, kind: str, blocking: bool, in_order: bool, profiling: bool,
                    priority: int = 0) -> Stream:
        streams = self._streams.setdefault(self._device, [])
        ctx = self.context()
        n = 1 if in_order else self.queue_pool
        queues = tuple(self.driver.create_queue(ctx, priority) for _ in range(n))
        stream = Stream(next(self._stream_ids), queues[0], self._device, blocking, in_order, kind,
                        profiling, queues, priority=priority)
        streams.append(stream)
        self.counts["streams"] += 1
        return stream

    def default_stream(self) -> Stream:
        """The stream work goes to when none is named: the legacy NULL stream (cuda-like,
        rocm-like), the calling thread's own stream in per-thread mode, or an in-order queue
        (xpu-like).  It is in order on every family, so a launch plan may rely on it."""
        key: tuple[int, str] | tuple[int, str, int]
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
                      enable_profiling: bool = False, priority: int = 0) -> Stream:
        """A new stream/queue.  ``flags``: ``blocking`` (default; synchronises with the legacy
        NULL stream) or ``non_blocking``; ``in_order``: None for the family's default, True
        for an in-order queue, False for an out-of-order one where the family has them;
        ``enable_profiling``: the SYCL queue property that event timing needs there;
        ``priority``: lower numbers first, clamped to :meth:`stream_priority_range` as
        every family's create-with-priority call clamps it."""
        if flags not in (BLOCKING, NON_BLOCKING):
            raise self._error(f"stream flags must be {BLOCKING!r} or {NON_BLOCKING!r}, got {flags!r}",
                              "create_stream")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise self._error(f"a stream priority is an integer, got {type(priority).__name__} {priority!r}",
                              "create_stream", hint=f"use {self.priority_range[1]} (highest) to "
                              f"{self.priority_range[0]} (lowest)")
        least, greatest = self.priority_range
        priority = min(max(priority, greatest), least)
        if in_order is None:
            in_order = self.queue_order == "in_order"
        if not in_order and not self.out_of_order:
            raise self._error(f"{self.facts['runtime']['queue_name']} is always in order; an "
                              "out-of-order queue does not exist in this family", "create_stream",
                              condition="not_supported", hint="use several streams and events")
        return self._new_stream("created", flags == BLOCKING, bool(in_order),
                                bool(enable_profiling) or self.event_timing != "queue", priority)

    def stream_priority_range(self) -> tuple[int, int]:
        """(least, greatest) stream priority of this family (cudaDeviceGetStreamPriorityRange
        and its twins); the greatest is the lowest number."""
        return self.priority_range

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

    def _live_retiring(self, device: int) -> list[Stream]:
        """Destroyed streams of ``device`` that still have work queued (the rest are forgotten)."""
        live = [s for s in self._retiring.get(device, []) if any(q.hwq.pending for q in s.queues)]
        self._retiring[device] = live
        return live

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
