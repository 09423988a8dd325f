"""null runtime: the Runtime protocol with nothing implemented."""

from __future__ import annotations

from .driver import not_implemented


class NullRuntime:
    """Devices, streams, events, memory, copies, modules and launches — to be written."""

    vendor = "null"

    def __init__(self, driver):
        self.driver = driver

    def device_count(self):
        raise not_implemented("runtime.device_count")

    def set_device(self, index):
        raise not_implemented("runtime.set_device")

    def current_device(self):
        raise not_implemented("runtime.current_device")

    def malloc(self, nbytes):
        raise not_implemented("runtime.malloc")

    def free(self, ptr):
        raise not_implemented("runtime.free")

    def memcpy_h2d(self, dst, src, stream=None):
        raise not_implemented("runtime.memcpy_h2d")

    def memcpy_d2h(self, dst, src, stream=None, blocking=True):
        raise not_implemented("runtime.memcpy_d2h")

    def create_stream(self):
        raise not_implemented("runtime.create_stream")

    def default_stream(self):
        raise not_implemented("runtime.default_stream")

    def record_event(self, stream=None):
        raise not_implemented("runtime.record_event")

    def stream_wait_event(self, stream, event):
        raise not_implemented("runtime.stream_wait_event")

    def load_module(self, binary):
        raise not_implemented("runtime.load_module")

    def launch(self, module, entry, grid, args, stream=None):
        raise not_implemented("runtime.launch")

    def synchronize(self):
        raise not_implemented("runtime.synchronize")

    def memory_stats(self):
        raise not_implemented("runtime.memory_stats")

    def report(self):
        raise not_implemented("runtime.report")
