"""Churn: create and release every kind of runtime handle many times over, and show that
nothing is left behind.

One cycle, on one composed stack, through the runtime seam only:

- ``malloc``/``free`` of a size that changes every cycle (the caching allocator splits,
  merges and reuses blocks), and a framework-style ``allocate``/``deallocate`` on the
  cycle's stream;
- a stream and an event created, used and destroyed;
- a module loaded, a kernel launched from it, the module unloaded;
- a graph captured from the stream, replayed and destroyed (where the family has graphs).

At the end the device's memory statistics must be back to zero (after ``empty_cache``),
the runtime's and the driver's handle tables empty apart from the primary context and
the default stream, and the results of every sampled cycle right.  Host memory growth is
measured (resident set size after a warm-up and at the end).  The timeline keeps a
bounded history (``record_limit``) as every long-lived user of fornax does.
"""

from __future__ import annotations

import gc
import os
import resource
import time
from dataclasses import dataclass, field

import numpy as np

from ..layers.driver import KernelLog
from ..layers.graph import DType, Graph
from ..stack import Stack

#: packets of timeline history a churning process keeps (its oldest half goes past this)
RECORD_LIMIT = 20_000
N = 256                        # elements of the cycle's kernel


def _graph() -> Graph:
    g = Graph("churn_add_relu")
    a = g.input("a", (N,), DType.FLOAT32)
    b = g.input("b", (N,), DType.FLOAT32)
    g.output(g.op("relu", g.op("add", a, b)), names=["out"])
    return g


def rss_bytes() -> int:
    """The process's resident set size now (Linux ``/proc``; elsewhere the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class ChurnResult:
    vendor: str
    cycles: int
    wall_s: float
    graphs: bool                           # whether the family captured and replayed graphs
    handles_before: dict
    handles_after: dict
    device_used_after: int                 # bytes the device still has mapped
    allocated_after: int                   # the caching allocator's allocated bytes
    reserved_after: int                    # ... and reserved bytes, after empty_cache
    rss_growth: int                        # host bytes, end minus after warm-up
    wrong: list = field(default_factory=list)    # cycles whose sampled result was wrong

    @property
    def clean(self) -> bool:
        return (not self.wrong and self.handles_after == self.handles_before
                and self.device_used_after == 0 and self.allocated_after == 0
                and self.reserved_after == 0)

    def to_dict(self) -> dict:
        return {"vendor": self.vendor, "cycles": self.cycles, "wall_s": self.wall_s,
                "graphs": self.graphs, "handles_before": self.handles_before,
                "handles_after": self.handles_after, "device_used_after": self.device_used_after,
                "allocated_after": self.allocated_after, "reserved_after": self.reserved_after,
                "rss_growth": self.rss_growth, "wrong": self.wrong, "clean": self.clean}


def churn(stack: Stack, cycles: int, *, sample_every: int = 97, seed: int = 0) -> ChurnResult:
    """Run ``cycles`` churn cycles on ``stack`` (see the module docstring)."""
    rt = stack.runtime
    rt.synchronize()
    rt.empty_cache()
    for device in stack.devices:
        device.timeline.record_limit = RECORD_LIMIT
    if isinstance(stack.driver.kernel_log, KernelLog):      # the shared driver's bounded log
        stack.driver.kernel_log.limit = RECORD_LIMIT
    plan = stack.compiler.compile(_graph(), stack.target)     # the format compose negotiated
    step = plan.kernel_steps()[0]
    binary = plan.binary
    assert binary is not None, "the churn graph compiles to a kernel"
    # graph capture where the runtime's family declares it ([runtime.graph] supported)
    graphs = bool(stack.vendors["runtime"].facts.get("runtime", {}).get("graph", {}).get("supported", False))
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    want = np.maximum(a + b, np.float32(0))
    rt.context()                              # the primary context stays, as it does in a process
    handles_before = rt.handles()
    wrong: list[int] = []
    warm = max(1, cycles // 10)
    rss_warm = rss_bytes()
    t0 = time.perf_counter()
    for i in range(cycles):
        if i == warm:
            gc.collect()
            rss_warm = rss_bytes()
        p = rt.malloc(512 * (1 + i % 37))
        rt.free(p)
        s = rt.create_stream(in_order=True)
        q = rt.allocate(4096 + 512 * (i % 5), s)
        rt.deallocate(q)
        ev = rt.create_event()
        ptrs = {name: rt.malloc(N * 4) for name in ("in0", "in1", "out0")}
        rt.memcpy_h2d(ptrs["in0"], a, s)
        rt.memcpy_h2d(ptrs["in1"], b, s)
        module = rt.load_module(binary)
        rt.launch(module, step.entry, step.grid, ptrs, s)
        if graphs:
            rt.begin_capture(s)
            rt.launch(module, step.entry, step.grid, ptrs, s)
            graph = rt.end_capture(s)
            rt.graph_launch(graph, s)
        rt.record_event(s, ev)
        rt.event_synchronize(ev)
        if i % sample_every == 0 or i == cycles - 1:
            out = np.empty(N, np.float32)
            rt.memcpy_d2h(out, ptrs["out0"], s, blocking=True)
            if not np.array_equal(out, want):
                wrong.append(i)
        if graphs:
            rt.destroy_graph(graph)
        rt.unload_module(module)
        rt.destroy_event(ev)
        for ptr in ptrs.values():
            rt.free(ptr)
        rt.destroy_stream(s)
    rt.synchronize()
    wall = time.perf_counter() - t0
    rt.empty_cache()
    gc.collect()
    stats = rt.memory_stats()
    mem = stack.devices[0].memory
    return ChurnResult(rt.vendor, cycles, wall, graphs, handles_before, rt.handles(), mem.used,
                       int(stats["allocated_bytes"]), int(stats["reserved_bytes"]),
                       rss_bytes() - rss_warm, wrong)
