"""xpu-like profiling: a Level Zero tracing layer-like tracer and PTI-like views over the
shared collector.

- **Tracer** (the Level Zero loader's tracing layer): ``tracer_create(desc)`` with
  ``desc = {"stype": "ZEL_STRUCTURE_TYPE_TRACER_EXP_DESC", "pUserData": ...}`` makes a
  disabled tracer; ``tracer_set_prologues`` / ``tracer_set_epilogues`` take
  ``{api_name: callback}`` for Level Zero calls (``zeCommandListAppendLaunchKernel``, ...:
  the driver seam's calls — the tracer sees Level Zero, not the SYCL runtime above it);
  ``tracer_set_enabled(tracer, True)`` turns it on.  A callback is called as
  ``callback(params, result, tracer_user_data, instance_user_data)``: ``params`` names the
  call and its correlation id, ``result`` is ``ZE_RESULT_SUCCESS`` in a prologue and the
  call's result in an epilogue, ``instance_user_data`` is one dict from prologue to epilogue
  of a call.  Several tracers may be enabled at once; destroying an enabled tracer is
  ``ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE``.
- **Views** (PTI-like): ``view_set_callbacks(buffer_request, buffer_complete)``, then
  ``view_enable(kind)`` for ``PTI_VIEW_DEVICE_GPU_KERNEL``, ``PTI_VIEW_DEVICE_GPU_MEM_COPY``,
  ``PTI_VIEW_RUNTIME_API`` (SYCL) and ``PTI_VIEW_DRIVER_API`` (Level Zero); records carry
  PTI's member names (``_start_timestamp``, ``_correlation_id``, ...) and reach
  ``buffer_complete(records, valid_size)``; ``flush_all_views()`` delivers a partial buffer.
  Enabling a view before setting the callbacks is ``PTI_ERROR_NO_CALLBACKS_SET``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...layers.profiler import ApiRecord, Client, ProfilerBase
from ...layers.profiler.buffer import ActivityBuffers

TRACER_DESC = "ZEL_STRUCTURE_TYPE_TRACER_EXP_DESC"
SUCCESS = "ZE_RESULT_SUCCESS"


class Tracer:
    """A zel_tracer_handle_t."""

    def __init__(self, client: Client, user_data: Any):
        self.client, self.user_data = client, user_data
        self.prologues: dict[str, Callable[..., None]] = {}
        self.epilogues: dict[str, Callable[..., None]] = {}
        self.enabled = False
        self.live = True


class ZelTracerLikeProfiler(ProfilerBase):
    """The Level Zero tracer-like and PTI-like interfaces of one runtime."""

    def __init__(self, runtime: Any):
        super().__init__(runtime)
        self._views = Client(self.collector)
        self._buffers: ActivityBuffers | None = None
        self._tracers: list[Tracer] = []

    # -- the tracer ----------------------------------------------------------------------------
    def tracer_create(self, desc: dict[str, Any]) -> Tracer:
        """zelTracerCreate: a tracer, disabled until zelTracerSetEnabled."""
        if not isinstance(desc, dict) or desc.get("stype") != TRACER_DESC:
            raise self.fail("invalid_argument", f"the tracer descriptor must be a dict with stype "
                            f"{TRACER_DESC}, got {desc!r}", "zelTracerCreate")
        tracer = Tracer(Client(self.collector), desc.get("pUserData"))
        tracer.client.on_site = lambda site, rec, data: self._call(tracer, site, rec, data)
        self._tracers.append(tracer)
        return tracer

    def _tracer(self, tracer: object, call: str) -> Tracer:
        if not isinstance(tracer, Tracer) or not tracer.live or tracer not in self._tracers:
            raise self.fail("invalid_handle", "not a live tracer of zelTracerCreate", call)
        return tracer

    def _set(self, tracer: Tracer, callbacks: dict[str, Callable[..., None]], table: str, call: str) -> None:
        t = self._tracer(tracer, call)
        if not isinstance(callbacks, dict):
            raise self.fail("invalid_argument", "callbacks must be a dict of API name -> callable", call)
        known = self.vocab.callback_ids("driver")
        for name, fn in callbacks.items():
            if name not in known:
                raise self.fail("invalid_call", f"{name!r} is no Level Zero call this driver makes",
                                call, hint=f"known: {', '.join(sorted(known))}")
            if not callable(fn):
                raise self.fail("invalid_argument", f"the callback for {name} is not callable", call)
        setattr(t, table, dict(callbacks))
        names = set(t.prologues) | set(t.epilogues)
        t.client.callbacks = {"driver": {known[n] for n in names}} if names else {}
        t.client.enabled = t.enabled
        t.client.sync()

    def tracer_set_prologues(self, tracer: Tracer, callbacks: dict[str, Callable[..., None]]) -> None:
        """zelTracerSetPrologues: callbacks before each named call (replaces the previous)."""
        self._set(tracer, callbacks, "prologues", "zelTracerSetPrologues")

    def tracer_set_epilogues(self, tracer: Tracer, callbacks: dict[str, Callable[..., None]]) -> None:
        """zelTracerSetEpilogues: callbacks after each named call (replaces the previous)."""
        self._set(tracer, callbacks, "epilogues", "zelTracerSetEpilogues")

    def tracer_set_enabled(self, tracer: Tracer, enable: bool) -> None:
        """zelTracerSetEnabled."""
        t = self._tracer(tracer, "zelTracerSetEnabled")
        t.enabled = t.client.enabled = bool(enable)
        t.client.sync()

    def tracer_destroy(self, tracer: Tracer) -> None:
        """zelTracerDestroy: only a disabled tracer."""
        t = self._tracer(tracer, "zelTracerDestroy")
        if t.enabled:
            raise self.fail("invalid_state", "the tracer is enabled", "zelTracerDestroy",
                            hint="zelTracerSetEnabled(tracer, false) first")
        t.live = False
        self._tracers.remove(t)
        t.client.callbacks = {}
        t.client.sync()

    def _call(self, tracer: Tracer, site: str, rec: ApiRecord, data: dict[str, Any]) -> None:
        name = self.vocab.callback_id(rec.domain, rec.name)
        fn = (tracer.prologues if site == "enter" else tracer.epilogues).get(name)
        if fn is None:
            return
        result = SUCCESS if site == "enter" or rec.error is None else rec.error
        slot = data.setdefault(f"tracer {id(tracer)}", {})
        fn({"api": name, "correlation_id": rec.correlation, "thread_id": rec.thread},
           result, tracer.user_data, slot)

    # -- PTI-like views --------------------------------------------------------------------------
    def view_set_callbacks(self, buffer_request: Callable[[], int],
                           buffer_complete: Callable[[list[Any], int], None]) -> None:
        """ptiViewSetCallbacks; the first buffer is requested now and must hold a record."""
        self._buffers = self.buffers(buffer_request, buffer_complete, "ptiViewSetCallbacks")
        for kind in self._views.buffers:
            self._views.buffers[kind] = self._buffers

    def view_enable(self, kind: str) -> None:
        """ptiViewEnable."""
        generic = self.vocab.kind(kind, "ptiViewEnable")
        if self._buffers is None:
            raise self.fail("no_callbacks", "no view buffer callbacks are set", "ptiViewEnable",
                            hint="call ptiViewSetCallbacks first")
        self._views.buffers[generic] = self._buffers
        self._views.sync()

    def view_disable(self, kind: str) -> None:
        """ptiViewDisable."""
        self._views.buffers.pop(self.vocab.kind(kind, "ptiViewDisable"), None)
        self._views.sync()

    def flush_all_views(self) -> None:
        """ptiFlushAllViews: deliver the records held.  Work the device has not run yet has
        no record: synchronise first."""
        if self._buffers is not None:
            self._buffers.flush()

    def dropped_records(self) -> int:
        """Records that found no room in a view buffer so far."""
        return 0 if self._buffers is None else self._buffers.dropped
