"""Runtime copies: asynchronous host-to-device, device-to-host and device-to-device
copies on a stream, and the synchronous copy whose return follows the family's
``[runtime.sync_copy]`` rule."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from ..driver import HostArray
from .graphs import GraphCapture
from .handles import Event, Stream


class RuntimeCopies(GraphCapture):
    """The runtime's copies."""

    def memcpy_h2d(self, dst: int, src: HostArray, stream: Stream | None = None,
                   depends_on: Iterable[Event] = (), held: bool = False) -> Event:
        """Asynchronous host-to-device copy (cudaMemcpyAsync and kin); returns its event.
        ``held``: the caller keeps ``src`` unchanged until it has waited for the copy, so
        the copy reads ``src`` when it runs instead of staging a copy of it now."""
        s = self._stream(stream)
        self.counts["h2d_copies"] += 1
        if s.capture is not None:
            return self._capture_node(s, ("h2d", dst, src))
        q = self._before(s, depends_on)
        q.copy_h2d(dst, src, host_rate=self._host_rate(src), held=held)
        ev = self._after(s, q)
        self._record_host_use(src, ev)
        self._maybe_block("memcpy_h2d")
        return ev

    def memcpy_d2h(self, dst: HostArray, src: int, stream: Stream | None = None,
                   blocking: bool = True, depends_on: Iterable[Event] = ()) -> Event:
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

    def memcpy(self, dst: int | NDArray[Any], src: int | NDArray[Any],
               stream: Stream | None = None) -> None:
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
        # a host array as the destination too reaches the driver, whose address check names it
        self.memcpy_h2d(cast(int, dst), src, s)
        if rule == "complete":
            self.stream_synchronize(s)

    def memcpy_d2d(self, dst: int, src: int, nbytes: int, stream: Stream | None = None,
                   depends_on: Iterable[Event] = ()) -> Event:
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
