"""cuda-like profiling: a CUPTI-like interface over the shared collector.

- **Callback API**: ``subscribe(callback, userdata)`` makes the one subscriber of the process
  (a second is refused with ``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``, as CUPTI
  refuses it); ``enable_domain`` / ``enable_callback`` choose the calls by domain
  (``CUPTI_CB_DOMAIN_RUNTIME_API``, ``CUPTI_CB_DOMAIN_DRIVER_API``) and callback id
  (``CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel``, ...).  The callback is called as
  ``callback(userdata, domain, cbid, cbdata)``; ``cbdata`` carries ``callbackSite``
  (``CUPTI_API_ENTER`` / ``CUPTI_API_EXIT``), ``functionName``, ``correlationId`` and
  ``correlationData`` (one dict from enter to exit of a call, as CUPTI's per-call
  ``uint64_t`` slot).
- **Activity API**: ``activity_register_callbacks(buffer_requested, buffer_completed)``,
  then ``activity_enable(kind)`` for ``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL``,
  ``..._MEMCPY``, ``..._RUNTIME``, ``..._DRIVER``; records (dicts with CUPTI's field names:
  ``start``, ``end``, ``correlationId``, ...) fill the buffers ``buffer_requested()`` sizes
  and reach ``buffer_completed(records, valid_size)`` when a buffer is full or on
  ``activity_flush_all()``; ``activity_get_num_dropped_records()`` counts what found no room.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...layers.profiler import ApiRecord, Client, ProfilerBase
from ...layers.profiler.buffer import ActivityBuffers


class Subscriber:
    """A CUpti_SubscriberHandle."""

    def __init__(self, client: Client, callback: Callable[..., None], userdata: Any):
        self.client, self.callback, self.userdata = client, callback, userdata
        self.live = True


class CuptiLikeProfiler(ProfilerBase):
    """The CUPTI-like interface of one runtime."""

    def __init__(self, runtime: Any):
        super().__init__(runtime)
        self._activity = Client(self.collector)
        self._requested: Callable[[], int] | None = None
        self._completed: Callable[[list[Any], int], None] | None = None
        self._buffers: ActivityBuffers | None = None
        self._dropped_before = 0

    # -- callback API ------------------------------------------------------------------------
    def subscribe(self, callback: Callable[..., None], userdata: Any = None) -> Subscriber:
        """cuptiSubscribe: the process's one callback subscriber."""
        if not callable(callback):
            raise self.fail("invalid_argument", "the callback is not callable", "cuptiSubscribe")
        held = self.collector.exclusive.get("cupti_subscriber")
        if held is not None:
            raise self.fail("multiple_subscribers", "a callback subscriber already exists in this "
                            "process; CUPTI allows one at a time", "cuptiSubscribe",
                            hint="cuptiUnsubscribe the other subscriber first")
        client = Client(self.collector)
        sub = Subscriber(client, callback, userdata)
        client.on_site = lambda site, rec, data: self._call(sub, site, rec, data)
        self.collector.exclusive["cupti_subscriber"] = sub
        return sub

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """cuptiUnsubscribe: no more callbacks; another subscriber may come."""
        self._check(subscriber, "cuptiUnsubscribe")
        subscriber.live = False
        subscriber.client.callbacks.clear()
        subscriber.client.sync()
        self.collector.exclusive.pop("cupti_subscriber", None)

    def _check(self, subscriber: object, call: str) -> Subscriber:
        if not isinstance(subscriber, Subscriber) or not subscriber.live or \
                self.collector.exclusive.get("cupti_subscriber") is not subscriber:
            raise self.fail("invalid_handle", "not a live subscriber of cuptiSubscribe", call)
        return subscriber

    def enable_domain(self, enable: bool, subscriber: Subscriber, domain: str) -> None:
        """cuptiEnableDomain: every callback of ``domain`` on (or off)."""
        sub = self._check(subscriber, "cuptiEnableDomain")
        generic = self.vocab.domain(domain, "cuptiEnableDomain")
        if enable:
            sub.client.callbacks[generic] = None
        else:
            sub.client.callbacks.pop(generic, None)
        sub.client.sync()

    def enable_callback(self, enable: bool, subscriber: Subscriber, domain: str, cbid: str) -> None:
        """cuptiEnableCallback: one callback id of ``domain`` on (or off)."""
        sub = self._check(subscriber, "cuptiEnableCallback")
        generic = self.vocab.domain(domain, "cuptiEnableCallback")
        call = self.vocab.call_of(generic, cbid, "cuptiEnableCallback")
        calls = sub.client.callbacks.get(generic, set())
        if calls is None:                              # the whole domain is on
            calls = set(self.vocab.calls[generic])
        if enable:
            calls.add(call)
        else:
            calls.discard(call)
        if calls:
            sub.client.callbacks[generic] = calls
        else:
            sub.client.callbacks.pop(generic, None)
        sub.client.sync()

    def _call(self, sub: Subscriber, site: str, rec: ApiRecord, data: dict[str, Any]) -> None:
        cbdata = {"callbackSite": self.site(site), "functionName": rec.name,
                  "correlationId": rec.correlation, "correlationData": data,
                  "threadId": rec.thread}
        sub.callback(sub.userdata, self.vocab.domains[rec.domain],
                     self.vocab.callback_id(rec.domain, rec.name), cbdata)

    # -- activity API ------------------------------------------------------------------------
    def activity_register_callbacks(self, buffer_requested: Callable[[], int],
                                    buffer_completed: Callable[[list[Any], int], None]) -> None:
        """cuptiActivityRegisterCallbacks: where activity buffers come from and go to."""
        if not callable(buffer_requested) or not callable(buffer_completed):
            raise self.fail("invalid_argument", "both buffer callbacks must be callables",
                            "cuptiActivityRegisterCallbacks")
        self._requested, self._completed = buffer_requested, buffer_completed

    def activity_enable(self, kind: str) -> None:
        """cuptiActivityEnable: collect records of ``kind``."""
        generic = self.vocab.kind(kind, "cuptiActivityEnable")
        if self._requested is None or self._completed is None:
            raise self.fail("no_callbacks", "no activity buffer callbacks are registered",
                            "cuptiActivityEnable", hint="call cuptiActivityRegisterCallbacks first")
        if self._buffers is None:
            self._buffers = self.buffers(self._requested, self._completed, "cuptiActivityEnable")
        self._activity.buffers[generic] = self._buffers
        self._activity.sync()

    def activity_disable(self, kind: str) -> None:
        """cuptiActivityDisable."""
        self._activity.buffers.pop(self.vocab.kind(kind, "cuptiActivityDisable"), None)
        self._activity.sync()

    def activity_flush_all(self) -> None:
        """cuptiActivityFlushAll: hand the buffer holding records to buffer_completed.  Work
        the device has not run yet has no record: synchronise first, as with CUPTI."""
        if self._buffers is not None:
            self._buffers.flush()

    def activity_get_num_dropped_records(self) -> int:
        """cuptiActivityGetNumDroppedRecords: records dropped for want of buffer space since
        the last query."""
        total = 0 if self._buffers is None else self._buffers.dropped
        out, self._dropped_before = total - self._dropped_before, total
        return out
