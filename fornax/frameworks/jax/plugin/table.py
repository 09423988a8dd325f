"""The plugin's ``PJRT_Api`` table: one ctypes callback per C API function, the opaque
handles the framework holds, and PJRT errors and events.

Every callback runs the Python implementation of its function under one rule: nothing
escapes into C.  A :class:`~fornax.layers.errors.FornaxError` becomes a ``PJRT_Error``
carrying fornax's message (seam, family, op, the family's error code, the hint) and the
status code its kind maps to (:data:`STATUS`); any other exception becomes an ``INTERNAL``
error naming the function.  A function the plugin does not implement returns an
``UNIMPLEMENTED`` error naming it, never a null pointer the framework would call.

Handles are small integers made to look like pointers: the framework never dereferences a
``PJRT_Client*``, ``PJRT_Buffer*`` or ``PJRT_Event*``, it only hands them back.  The
objects behind them live in :class:`Handles` until the matching ``*_Destroy`` call.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from ....layers.errors import FornaxError
from . import capi

log = logging.getLogger("fornax.jax.plugin")

#: fornax error kind -> PJRT_Error_Code
STATUS = {
    "config": capi.INVALID_ARGUMENT, "unknown_vendor": capi.INVALID_ARGUMENT, "invalid_argument": capi.INVALID_ARGUMENT,
    "format_mismatch": capi.INVALID_ARGUMENT, "graph": capi.INVALID_ARGUMENT, "device": capi.FAILED_PRECONDITION,
    "compile": capi.INTERNAL, "binary": capi.FAILED_PRECONDITION, "invalid_handle": capi.INVALID_ARGUMENT,
    "launch": capi.INTERNAL, "out_of_memory": capi.RESOURCE_EXHAUSTED, "memory_fault": capi.INTERNAL,
    "hang": capi.DEADLINE_EXCEEDED, "device_lost": capi.UNAVAILABLE, "not_supported": capi.UNIMPLEMENTED,
    "library": capi.INTERNAL, "unknown": capi.UNKNOWN, "unimplemented": capi.UNIMPLEMENTED,
}


class PjrtError(FornaxError):
    """An error the plugin returns with an explicit PJRT status code."""

    kind = "plugin"

    def __init__(self, message: str, status: int = capi.INVALID_ARGUMENT, **kw):
        self.status = status
        super().__init__(message, seam="framework", **kw)


class Error:
    """What a ``PJRT_Error*`` points to: a status code and a message the framework reads."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message.encode("utf-8", "replace")


class Event:
    """A ``PJRT_Event``: ``wait`` blocks until the simulated work behind it is done (the
    runtime seam's event or stream synchronisation) and returns the error it ended with."""

    def __init__(self, wait: Callable[[], None] | None = None, error: Error | None = None,
                 probe: Callable[[], bool] | None = None):
        self._wait, self._probe, self.error = wait, probe, error
        self.done = wait is None

    def is_ready(self) -> bool:
        if not self.done and self._probe is not None:
            try:
                return bool(self._probe())
            except Exception:              # a failed query: ready, with the error Await reports
                return True
        return self.done

    def await_(self) -> Error | None:
        if not self.done:
            try:
                assert self._wait is not None
                self._wait()
            except Exception as exc:       # the work failed: the event carries the error
                self.error = to_error(exc, "PJRT_Event_Await")
            self.done = True
        return self.error


class Handles:
    """Opaque handle <-> Python object, for every kind of PJRT object."""

    def __init__(self):
        self._objects: dict[int, Any] = {}
        self._next = itertools.count(0x1000)
        self.lock = threading.RLock()

    def new(self, obj: Any) -> int:
        with self.lock:
            h = next(self._next) * 16
            self._objects[h] = obj
            return h

    def get(self, handle: int | None, kind: type | tuple[type, ...], what: str) -> Any:
        obj = self._objects.get(handle or 0)
        if obj is None or not isinstance(obj, kind):
            raise PjrtError(f"{what} {handle and hex(handle)} is not a live handle of this plugin",
                            capi.INVALID_ARGUMENT)
        return obj

    def drop(self, handle: int | None) -> Any:
        with self.lock:
            return self._objects.pop(handle or 0, None)

    def count(self, kind: type) -> int:
        return sum(isinstance(o, kind) for o in self._objects.values())


def to_error(exc: BaseException, function: str) -> Error:
    if isinstance(exc, PjrtError):
        return Error(exc.status, str(exc))
    if isinstance(exc, FornaxError):
        return Error(STATUS.get(exc.kind, capi.INTERNAL), str(exc))
    return Error(capi.INTERNAL, f"fornax PJRT plugin: {function} failed: {type(exc).__name__}: {exc}")


class Table:
    """The ``PJRT_Api`` struct the framework loads, built from an implementation object whose
    methods are named after the C functions (``Client_Create(args)``); ``args`` is the
    function's argument struct (:data:`capi.ARGS`)."""

    def __init__(self, impl: Any):
        self.handles = Handles()
        self.impl = impl
        self.lock = threading.RLock()
        self.calls: dict[str, int] = {}
        self._keep: list = []
        api = self.api = capi.Api()
        api.struct_size = ctypes.sizeof(capi.Api)
        api.pjrt_api_version.struct_size = ctypes.sizeof(capi.Version)
        api.pjrt_api_version.major_version = capi.API_MAJOR
        api.pjrt_api_version.minor_version = capi.API_MINOR
        for name, struct in capi.ARGS.items():
            fn = self._callback(name, struct)
            self._keep.append(fn)
            setattr(api, "PJRT_" + name, ctypes.cast(fn, ctypes.c_void_p).value)

    # -- errors ------------------------------------------------------------------------------------
    def error(self, err: Error | None) -> int:
        return 0 if err is None else self.handles.new(err)

    def Error_Destroy(self, a) -> None:
        self.handles.drop(a.error)

    def Error_Message(self, a) -> None:
        err = self.handles.get(a.error, Error, "PJRT_Error")
        a.message = ctypes.cast(ctypes.c_char_p(err.message), ctypes.c_void_p).value
        a.message_size = len(err.message)

    def Error_GetCode(self, a) -> None:
        a.code = self.handles.get(a.error, Error, "PJRT_Error").code

    # -- events ------------------------------------------------------------------------------------
    def event(self, ev: Event) -> int:
        return self.handles.new(ev)

    def Event_Destroy(self, a) -> None:
        self.handles.drop(a.event)

    def Event_IsReady(self, a) -> None:
        a.is_ready = self.handles.get(a.event, Event, "PJRT_Event").is_ready()

    def Event_Error(self, a) -> int:
        ev = self.handles.get(a.event, Event, "PJRT_Event")
        return self.error(ev.await_())

    def Event_Await(self, a) -> int:
        return self.error(self.handles.get(a.event, Event, "PJRT_Event").await_())

    def Event_OnReady(self, a) -> None:
        # the simulated device completes work when it is waited for: wait now, then call back
        # (JAX waits forever for an OnReady callback that is never made)
        ev = self.handles.get(a.event, Event, "PJRT_Event")
        err = ev.await_()
        capi.ON_READY(a.callback)(self.error(err) or None, a.user_arg)

    # -- the table ---------------------------------------------------------------------------------
    def _callback(self, name: str, struct: type[ctypes.Structure]):
        ptr_type = ctypes.POINTER(struct)
        own = getattr(self, name, None)
        impl = own if own is not None else getattr(self.impl, name, None)
        fn_name = "PJRT_" + name
        void = name in capi.VOID
        # jaxlib treats a failed *_Destroy as fatal (it aborts the process): a destroy never fails
        quiet = name.endswith("_Destroy")

        def call(address):
            self.calls[name] = self.calls.get(name, 0) + 1
            try:
                if impl is None:
                    raise PjrtError(f"{fn_name} is not implemented by the fornax PJRT plugin",
                                    capi.UNIMPLEMENTED)
                # one call at a time: JAX may call from several threads, the simulator is not
                # thread-safe (the lock is re-entrant: a callback JAX makes from inside a call
                # may call the plugin again)
                with self.lock:
                    result = impl(ctypes.cast(address, ptr_type).contents)
                return None if void else (result or None)
            except BaseException as exc:       # nothing may unwind into C
                if quiet and impl is not None:
                    return self._destroy_again(impl, address, ptr_type, fn_name, exc)
                if void:
                    log.error("%s failed: %s", fn_name, exc)
                    return None
                return self.error(to_error(exc, fn_name))

        return (capi.VOID_FN if void else capi.ERROR_FN)(call)

    def _destroy_again(self, impl, address, ptr_type, fn_name: str, exc: BaseException):
        """A destroy that failed because a Python exception was pending when C called it:
        JAX released the object while raising an error.  A ctypes callback cannot leave that
        error pending (CPython reports a callback that returns with an exception set), so it
        surfaces in Python as ``SystemError: error return without exception set``; its text is
        logged here, and the destroy is done now that nothing is pending."""
        root: BaseException = exc
        while root.__cause__ is not None or root.__context__ is not None:   # the error that was pending
            root = root.__cause__ or root.__context__        # type: ignore[assignment]
        log.warning("fornax PJRT plugin: JAX released an object while raising this error, which "
                    "Python's ctypes callbacks cannot keep pending (it surfaces as SystemError): %s: %s",
                    type(root).__name__, root)
        try:
            with self.lock:
                impl(ctypes.cast(address, ptr_type).contents)
        except BaseException as again:
            log.error("%s failed: %s", fn_name, again)
        return None

    def close(self) -> None:
        """At interpreter exit: point every destroy at a native function that returns a null
        error without entering Python.  JAX releases its last arrays and clients while the
        interpreter is being torn down, when a ctypes callback can no longer run; the process
        is ending, so nothing needs giving back."""
        libc = ctypes.CDLL(None)
        noop = ctypes.cast(libc.sched_yield, ctypes.c_void_p).value   # int sched_yield(void): returns 0
        for name in capi.ARGS:
            if name.endswith("_Destroy"):
                setattr(self.api, "PJRT_" + name, noop)
        self.closed = True

    def capsule(self):
        """A ``PyCapsule`` named ``pjrt_c_api`` holding the table's address: what
        ``xla_client.load_pjrt_plugin_with_c_api`` takes."""
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.api), b"pjrt_c_api", None)
