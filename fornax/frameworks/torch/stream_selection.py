"""The stream each thread has selected for the ``fornax`` device.

``torch.fornax.set_stream(s)`` and ``with torch.fornax.stream(s):`` (:mod:`.streams`) select a
stream for the calling thread, as in PyTorch; eager ops, copies, allocations and compiled
graphs enqueue on :func:`runtime_stream`: the selected stream's runtime handle when it belongs
to the session asking, else that session runtime's default stream.  A thread that never
selected one (the autograd engine's, for instance) uses the default stream.
"""

from __future__ import annotations

import threading
from typing import Protocol

from ...layers.runtime import Runtime, Stream


class Selectable(Protocol):
    """What a selected stream offers: the session it was made under and its runtime handle."""

    @property
    def session(self) -> object: ...

    @property
    def handle(self) -> Stream: ...


class HasRuntime(Protocol):
    """A session, as far as stream selection needs one: its runtime seam."""

    @property
    def runtime(self) -> Runtime: ...


_local = threading.local()


def selected() -> Selectable | None:
    """The stream this thread selected, or None."""
    stream: Selectable | None = getattr(_local, "stream", None)
    return stream


def select(stream: Selectable | None) -> None:
    """Make ``stream`` this thread's selection (None: back to the default stream)."""
    _local.stream = stream


def runtime_stream(session: HasRuntime) -> Stream:
    """The runtime stream work for ``session`` enqueues on in this thread."""
    s = selected()
    if s is not None and s.session is session:
        return s.handle
    return session.runtime.default_stream()
