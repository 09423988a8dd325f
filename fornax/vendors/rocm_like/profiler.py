"""rocm-like profiling: a rocprofiler-sdk-like interface over the shared collector.

A tool creates a **context** (``create_context``), configures **services** on it while it is
stopped, and starts it:

- ``create_buffer(context, size, watermark, policy, callback)``: a buffer of ``size`` bytes
  delivered to ``callback(context, buffer, records, drop_count)`` once ``watermark`` bytes are
  used (or on ``flush_buffer``); ``ROCPROFILER_BUFFER_POLICY_LOSSLESS`` hands a full buffer
  over and goes on, ``ROCPROFILER_BUFFER_POLICY_DISCARD`` drops what does not fit;
- ``configure_buffer_tracing_service(context, kind, operations, buffer)`` for
  ``ROCPROFILER_BUFFER_TRACING_KERNEL_DISPATCH``, ``..._MEMORY_COPY``,
  ``..._HIP_RUNTIME_API``, ``..._HSA_CORE_API``;
- ``configure_callback_tracing_service(context, kind, operations, callback, data)`` for
  ``ROCPROFILER_CALLBACK_TRACING_HIP_RUNTIME_API`` / ``..._HSA_CORE_API``: ``callback(record,
  user_data, data)`` at ``ROCPROFILER_CALLBACK_PHASE_ENTER`` and ``..._EXIT``; ``user_data``
  is one dict from enter to exit of a call.

``operations`` names calls by operation id (``ROCPROFILER_HIP_RUNTIME_API_ID_hipLaunchKernel``,
...); empty means every operation.  Records carry rocprofiler's member names
(``start_timestamp``, ``end_timestamp``, ``correlation_id``, ...).  Configuring a started
context is ``ROCPROFILER_STATUS_ERROR_CONFIGURATION_LOCKED``; a kind configured twice on a
context is ``ROCPROFILER_STATUS_ERROR_SERVICE_ALREADY_CONFIGURED``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ...layers.profiler import ApiRecord, Client, ProfilerBase
from ...layers.profiler.buffer import ActivityBuffers

POLICIES = ("ROCPROFILER_BUFFER_POLICY_DISCARD", "ROCPROFILER_BUFFER_POLICY_LOSSLESS")


class ContextId:
    """A rocprofiler_context_id_t."""

    def __init__(self, handle: int, client: Client):
        self.handle, self.client = handle, client
        self.started = False
        self.kinds: set[str] = set()


class BufferId:
    """A rocprofiler_buffer_id_t."""

    def __init__(self, handle: int, context: ContextId, buffers: ActivityBuffers):
        self.handle, self.context, self.buffers = handle, context, buffers


class RocprofilerLikeProfiler(ProfilerBase):
    """The rocprofiler-sdk-like interface of one runtime."""

    def __init__(self, runtime: Any):
        super().__init__(runtime)
        self._contexts: dict[int, ContextId] = {}
        self._buffers: dict[int, BufferId] = {}
        self._next = 1

    def _handle(self) -> int:
        self._next += 1
        return self._next - 1

    def _context(self, context: object, call: str, configure: bool = False) -> ContextId:
        if not isinstance(context, ContextId) or self._contexts.get(context.handle) is not context:
            raise self.fail("invalid_handle", "not a context of rocprofiler_create_context", call)
        if configure and context.started:
            raise self.fail("invalid_state", f"context {context.handle} is started; services are "
                            "configured before rocprofiler_start_context", call,
                            hint="rocprofiler_stop_context it first")
        return context

    def create_context(self) -> ContextId:
        """rocprofiler_create_context."""
        ctx = ContextId(self._handle(), Client(self.collector))
        ctx.client.enabled = False
        self._contexts[ctx.handle] = ctx
        return ctx

    def create_buffer(self, context: ContextId, size: int, watermark: int, policy: str,
                      callback: Callable[[ContextId, BufferId, list[Any], int], None]) -> BufferId:
        """rocprofiler_create_buffer."""
        call = "rocprofiler_create_buffer"
        ctx = self._context(context, call)
        if policy not in POLICIES:
            raise self.fail("invalid_argument", f"unknown buffer policy {policy!r}", call,
                            hint=f"use {' or '.join(POLICIES)}")
        if isinstance(size, bool) or not isinstance(size, int):
            raise self.fail("invalid_argument", f"the buffer size must be a whole number of bytes, got {size!r}",
                            call)
        if isinstance(watermark, bool) or not isinstance(watermark, int) or not 0 <= watermark <= size:
            raise self.fail("invalid_argument", f"watermark {watermark!r} must be 0..size ({size!r})", call)
        if not callable(callback):
            raise self.fail("invalid_argument", "the buffer callback is not callable", call)
        holder: list[BufferId] = []
        bufs = self.buffers(lambda: int(size),
                            lambda records, used: callback(ctx, holder[0], records, holder[0].buffers.dropped),
                            call, watermark=(watermark / size) if watermark else 1.0,
                            discard=policy.endswith("DISCARD"))
        buf = BufferId(self._handle(), ctx, bufs)
        holder.append(buf)
        self._buffers[buf.handle] = buf
        return buf

    def _operations(self, domain: str, operations: Iterable[str], call: str) -> set[str] | None:
        ops = list(operations or ())
        if not ops:
            return None
        return {self.vocab.call_of(domain, op, call) for op in ops}

    def configure_buffer_tracing_service(self, context: ContextId, kind: str,
                                         operations: Iterable[str], buffer: BufferId) -> None:
        """rocprofiler_configure_buffer_tracing_service."""
        call = "rocprofiler_configure_buffer_tracing_service"
        ctx = self._context(context, call, configure=True)
        generic = self.vocab.kind(kind, call)
        if not isinstance(buffer, BufferId) or self._buffers.get(buffer.handle) is not buffer:
            raise self.fail("invalid_buffer", "not a buffer of rocprofiler_create_buffer", call)
        if kind in ctx.kinds:
            raise self.fail("already_configured", f"{kind} is already configured on context "
                            f"{ctx.handle}", call)
        if generic in ("runtime", "driver"):                # API records of these operations only
            ctx.client.operations[generic] = self._operations(generic, operations, call)
        ctx.kinds.add(kind)
        ctx.client.buffers[generic] = buffer.buffers

    def configure_callback_tracing_service(self, context: ContextId, kind: str,
                                           operations: Iterable[str],
                                           callback: Callable[[dict[str, Any], dict[str, Any], Any], None],
                                           data: Any = None) -> None:
        """rocprofiler_configure_callback_tracing_service."""
        call = "rocprofiler_configure_callback_tracing_service"
        ctx = self._context(context, call, configure=True)
        domain = self.vocab.domain(kind, call)
        if kind in ctx.kinds:
            raise self.fail("already_configured", f"{kind} is already configured on context "
                            f"{ctx.handle}", call)
        if not callable(callback):
            raise self.fail("invalid_argument", "the tracing callback is not callable", call)
        ctx.kinds.add(kind)
        ctx.client.callbacks[domain] = self._operations(domain, operations, call)
        previous = ctx.client.on_site

        def on_site(site: str, rec: ApiRecord, user: dict[str, Any]) -> None:
            if rec.domain == domain:
                callback(self._record(rec, site), user, data)
            elif previous is not None:
                previous(site, rec, user)

        ctx.client.on_site = on_site

    def _record(self, rec: ApiRecord, site: str) -> dict[str, Any]:
        return {"kind": self.vocab.domains[rec.domain],
                "operation": self.vocab.callback_id(rec.domain, rec.name),
                "phase": self.site(site), "correlation_id": rec.correlation,
                "thread_id": rec.thread}

    def start_context(self, context: ContextId) -> None:
        """rocprofiler_start_context."""
        ctx = self._context(context, "rocprofiler_start_context")
        ctx.started = True
        ctx.client.enabled = True
        ctx.client.sync()

    def stop_context(self, context: ContextId) -> None:
        """rocprofiler_stop_context."""
        ctx = self._context(context, "rocprofiler_stop_context")
        ctx.started = False
        ctx.client.enabled = False
        ctx.client.sync()

    def flush_buffer(self, buffer: BufferId) -> None:
        """rocprofiler_flush_buffer: deliver the records the buffer holds.  Work the device
        has not run yet has no record: synchronise first."""
        if not isinstance(buffer, BufferId) or self._buffers.get(buffer.handle) is not buffer:
            raise self.fail("invalid_buffer", "not a buffer of rocprofiler_create_buffer",
                            "rocprofiler_flush_buffer")
        buffer.buffers.flush()
