"""Runtime events: create, record, wait, query, synchronise and time them, and the
ordering of each command on its stream (implicit syncs and explicit event
dependencies)."""

from __future__ import annotations

from ...sim.faults import SimError
from collections.abc import Iterable

from ..driver import FaultMapping, Queue
from .handles import Event, Stream
from .streams import StreamRules


class EventRules(StreamRules):
    """Events, and the before/after of every command on a stream."""

    def _before(self, stream: Stream, depends_on: Iterable[Event] | None) -> Queue:
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
        # what the stream's queues were told to wait for since their last command counts too
        # (a library that orders its own queue, a collective's completion)
        waits = {(m.sem.id, m.value): m for q in s.queues for m in (*q.waiting(), *s._waits)}
        ev.markers = tuple(q.record() for q in s.queues) + tuple(waits.values())
        ev.captured = False
        ev.host_time = self._timeline(s.device).host_time
        ev.timing = ev.timing and s.profiling
        return ev

    def _check_event(self, event: object, call: str) -> Event:
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

    def _device_of(self, ev: Event) -> int:
        """The device of a recorded event (recording gives it its stream)."""
        if ev.stream is None:
            raise self._error("the event was never recorded", "query_event",
                              condition="invalid_handle")
        return ev.stream.device

    def _run_until_host_time(self, device: int) -> float:
        tl = self._timeline(device)
        while tl.step(before=tl.host_time):
            pass
        now: float = tl.host_time
        return now

    def query_event(self, event: Event) -> bool:
        """Whether the work before ``event`` has finished *by now*.  The simulator is lazy:
        the query runs the device up to the host's current simulated time and answers
        whether the event's time is at or before it (a query never advances the host)."""
        ev = self._check_event(event, "query_event")
        now = self._run_until_host_time(self._device_of(ev))
        t = ev.timestamp()
        done = t is not None and t <= now
        if done:
            self._wait_event(ev, "query_event")       # host sees its effects; time does not move
        return done

    def _wait_event(self, ev: Event, call: str) -> None:
        ctx = self.context(self._device_of(ev))
        tl = ctx.device.timeline
        for m in ev.markers:
            try:
                tl.wait(m.sem, m.value)
            except SimError as exc:
                driver = self.driver
                raise (driver.fault(ctx, exc, "synchronize") if isinstance(driver, FaultMapping)
                       else self._error(str(exc), call, condition="unknown")) from None
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
        times: list[float] = []
        for ev in (start, end):
            if not self.query_event(ev):
                if self.elapsed_incomplete != "wait":
                    raise self._error("the work before the event has not completed yet",
                                      "elapsed_time", condition="not_ready",
                                      hint="synchronize the event first")
                self._wait_event(ev, "elapsed_time")
            t = ev.timestamp()           # reached now: the query said so, or the host waited
            if t is None:
                raise self._error("the work before the event has not completed yet",
                                  "elapsed_time", condition="not_ready")
            times.append(t)
        return (times[1] - times[0]) * 1e3
