"""null runtime: the Runtime protocol with nothing implemented."""

from __future__ import annotations

from fornax.layers.errors import ErrorTable

from .driver import not_implemented
from .facts import FACTS


class NullRuntime:
    """Devices, streams, events, memory, pinned host memory, copies, modules, launches and
    graph capture — to be written."""

    vendor = FACTS["name"]

    def __init__(self, driver):
        self.driver = driver
        # the family's vocabulary, from vendor.toml: [runtime.calls] (call -> API name) and
        # [runtime.errors] (codes; fornax.layers.errors.ErrorTable)
        self.calls: dict = {}
        self.errors = ErrorTable(FACTS["name"], {}, {}, seam="runtime", vendor=FACTS["name"])

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

    def malloc_host(self, nbytes):
        raise not_implemented("runtime.malloc_host")

    def free_host(self, buf):
        raise not_implemented("runtime.free_host")

    def memcpy(self, dst, src, stream=None):
        raise not_implemented("runtime.memcpy")

    def memcpy_h2d(self, dst, src, stream=None, depends_on=(), held=False):
        raise not_implemented("runtime.memcpy_h2d")

    def memcpy_d2h(self, dst, src, stream=None, blocking=True, depends_on=()):
        raise not_implemented("runtime.memcpy_d2h")

    def create_stream(self, flags="blocking", in_order=None, enable_profiling=False, priority=0):
        raise not_implemented("runtime.create_stream")

    def stream_priority_range(self):
        raise not_implemented("runtime.stream_priority_range")

    def default_stream(self):
        raise not_implemented("runtime.default_stream")

    def create_event(self, timing=True):
        raise not_implemented("runtime.create_event")

    def record_event(self, stream=None, event=None):
        raise not_implemented("runtime.record_event")

    def stream_wait_event(self, stream, event):
        raise not_implemented("runtime.stream_wait_event")

    def query_event(self, event):
        raise not_implemented("runtime.query_event")

    def event_synchronize(self, event):
        raise not_implemented("runtime.event_synchronize")

    def elapsed_time(self, start, end):
        raise not_implemented("runtime.elapsed_time")

    def stream_synchronize(self, stream=None):
        raise not_implemented("runtime.stream_synchronize")

    def load_module(self, binary):
        raise not_implemented("runtime.load_module")

    def launch(self, module, entry, grid, args, stream=None, depends_on=()):
        raise not_implemented("runtime.launch")

    def begin_capture(self, stream):
        raise not_implemented("runtime.begin_capture")

    def end_capture(self, stream):
        raise not_implemented("runtime.end_capture")

    def synchronize(self):
        raise not_implemented("runtime.synchronize")

    def memory_stats(self):
        raise not_implemented("runtime.memory_stats")

    def report(self):
        raise not_implemented("runtime.report")

    def destroy_stream(self, stream):
        raise not_implemented("runtime.destroy_stream")

    def destroy_event(self, event):
        raise not_implemented("runtime.destroy_event")

    def unload_module(self, module):
        raise not_implemented("runtime.unload_module")

    def destroy_graph(self, graph):
        raise not_implemented("runtime.destroy_graph")

    def empty_cache(self):
        raise not_implemented("runtime.empty_cache")

    def handles(self):
        raise not_implemented("runtime.handles")

    def device_reset(self, index=None):
        raise not_implemented("runtime.device_reset")

    def profiler(self):
        raise not_implemented("runtime.profiler")

    def allocate(self, nbytes, stream=None):
        raise not_implemented("runtime.allocate")

    def context(self, index=None):
        raise not_implemented("runtime.context")

    def deallocate(self, ptr):
        raise not_implemented("runtime.deallocate")

    def graph_launch(self, graph, stream=None):
        raise not_implemented("runtime.graph_launch")

    def memcpy_d2d(self, dst, src, nbytes, stream=None, depends_on=()):
        raise not_implemented("runtime.memcpy_d2d")

    def memory_summary(self, index=None):
        raise not_implemented("runtime.memory_summary")
