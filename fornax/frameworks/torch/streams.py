"""``torch.fornax.Stream`` / ``Event``: the runtime seam's streams and events, shaped like
``torch.cuda.Stream`` / ``torch.cuda.Event``.

The current stream is per thread, as in PyTorch; eager ops, copies and compiled graphs
enqueue on it.  A thread that never selected one (the autograd engine's, for instance)
uses the runtime's default stream.
"""

from __future__ import annotations

import contextlib

from ...layers.runtime import Event as RuntimeEvent
from . import stream_selection
from .session import DeviceError, Session, current


def current_runtime_stream(session: Session | None = None):
    """The runtime stream this thread's work for ``session`` (default: the current one)
    enqueues on (see :mod:`.stream_selection`)."""
    return stream_selection.runtime_stream(session or current())


class Stream:
    """A stream (cuda-like / rocm-like) or queue (xpu-like) of the active stack's runtime."""

    def __init__(self, device=None, priority: int = 0, *, _handle=None):
        self.session = current()
        # in order on every family, as PyTorch's streams are (torch.xpu's are in-order SYCL
        # queues); priorities: lower numbers first, clamped to the family's range
        self.handle = _handle if _handle is not None else self.session.runtime.create_stream(
            in_order=True, priority=priority)
        self.device = _device()

    @property
    def priority(self) -> int:
        """The stream's priority after clamping to the family's range."""
        return self.handle.priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority of the active stack's runtime."""
        return current().runtime.stream_priority_range()

    def _check(self) -> None:
        if self.session is not current():
            raise DeviceError("this stream belongs to a previous fornax stack", seam="runtime",
                              hint="create streams after use_stack()")

    def synchronize(self) -> None:
        self._check()
        self.session.runtime.stream_synchronize(self.handle)

    def query(self) -> bool:
        self._check()
        ev = self.session.runtime.record_event(self.handle)
        return self.session.runtime.query_event(ev)

    def wait_event(self, event: "Event") -> None:
        self._check()
        if event.handle is None:
            return                                   # never recorded: nothing to wait for
        self.session.runtime.stream_wait_event(self.handle, event.handle)

    def wait_stream(self, stream: "Stream") -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.handle is self.handle

    def __hash__(self) -> int:
        return id(self.handle)

    def __repr__(self) -> str:
        return f"<torch.fornax.Stream device=fornax:0 id={self.handle.id}>"


class Event:
    """An event; ``enable_timing`` events give ``elapsed_time`` in milliseconds of
    simulated device time."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise DeviceError("interprocess events are not supported by the fornax device",
                              seam="runtime", hint="use a plain Event")
        self.enable_timing = enable_timing
        self.handle: RuntimeEvent | None = None
        self.session = current()

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or current_stream()
        self.handle = self.session.runtime.record_event(stream.handle)
        self.handle_timing = self.enable_timing

    def wait(self, stream: Stream | None = None) -> None:
        (stream or current_stream()).wait_event(self)

    def query(self) -> bool:
        return True if self.handle is None else self.session.runtime.query_event(self.handle)

    def synchronize(self) -> None:
        if self.handle is not None:
            self.session.runtime.event_synchronize(self.handle)

    def elapsed_time(self, end: "Event") -> float:
        if not (self.enable_timing and end.enable_timing):
            raise DeviceError("elapsed_time needs two events created with enable_timing=True",
                              seam="runtime", hint="Event(enable_timing=True)")
        if self.handle is None or end.handle is None:
            raise DeviceError("both events must be recorded before elapsed_time", seam="runtime",
                              hint="call event.record() on a stream first")
        return float(self.session.runtime.elapsed_time(self.handle, end.handle))


def _device():
    import torch
    return torch.device("fornax", 0)


def current_stream(device=None) -> Stream:
    session = current()
    s = stream_selection.selected()
    if isinstance(s, Stream) and s.session is session:
        return s
    return default_stream()


def default_stream(device=None) -> Stream:
    session = current()
    cached = session.default_torch_stream
    if not isinstance(cached, Stream):
        cached = Stream(_handle=session.runtime.default_stream())
        session.default_torch_stream = cached
    return cached


def set_stream(stream: Stream) -> None:
    stream_selection.select(stream)


@contextlib.contextmanager
def stream(s: Stream | None):
    """``with torch.fornax.stream(s):`` — make ``s`` the current stream of this thread."""
    if s is None:
        yield
        return
    prev = stream_selection.selected()
    stream_selection.select(s)
    try:
        yield
    finally:
        stream_selection.select(prev)
