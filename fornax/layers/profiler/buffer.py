"""Activity buffers a profiling client provides: records are written into the client's
current buffer until the next one does not fit, then the buffer is handed back to the client
(completed) and a new one is requested — as CUPTI's bufferRequested / bufferCompleted,
rocprofiler-sdk's buffers and PTI's view buffers work.

A buffer is ``size`` bytes; each record takes the family's ``record_bytes`` for its kind.
When the client gives no buffer (a request answers 0 bytes), a buffer too small for the
record, or (``discard``) the buffer is full, the record is dropped and counted (:attr:`ActivityBuffers.dropped`), as CUPTI counts
dropped records.  The records themselves are the client's once delivered: the collector keeps
none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .records import Record

#: asks the client for a buffer: returns its size in bytes (0: none now)
Request = Callable[[], int]
#: hands a full (or flushed) buffer back: the records, in the family's form, and bytes used
Complete = Callable[[list[Any], int], None]


class ActivityBuffers:
    """A client's activity buffers."""

    def __init__(self, request: Request, complete: Complete, size_of: Callable[[Record], int],
                 render: Callable[[Record], Any], watermark: float = 1.0, discard: bool = False):
        self.request = request
        self.complete = complete
        self.size_of = size_of
        self.render = render
        self.watermark = watermark           # deliver once this share of the buffer is used
        self.discard = discard               # a full buffer drops records (else it is delivered)
        self.dropped = 0
        self.delivered = 0                   # buffers handed back
        self._records: list[Any] = []
        self._used = 0
        self._size = 0
        self._open = False

    def _new(self) -> bool:
        size = self.request()
        self._open = isinstance(size, int) and not isinstance(size, bool) and size > 0
        self._size = int(size) if self._open else 0
        self._records, self._used = [], 0
        return self._open

    def add(self, record: Record) -> None:
        size = self.size_of(record)
        if not self._open and not self._new():
            self.dropped += 1
            return
        if self._used + size > self._size:
            if self.discard:
                self.dropped += 1
                return
            self.flush()
            if not self._new() or size > self._size:
                self.dropped += 1
                return
        self._records.append(self.render(record))
        self._used += size
        if self._used >= self.watermark * self._size:
            self.flush()

    def flush(self) -> None:
        """Hand the current buffer back (if it holds records); the next record asks anew."""
        if self._open and self._records:
            records, used = self._records, self._used
            self._records, self._used, self._open = [], 0, False
            self.delivered += 1
            self.complete(records, used)
