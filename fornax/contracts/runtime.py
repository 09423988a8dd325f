"""The runtime seam's contract, clause by clause."""

from __future__ import annotations

import numpy as np

from ..layers.compiler import KernelStep
from ..layers.errors import NotSupportedError
from .base import Subject, add_relu_graph, clause, expect_error, require, rng_arrays

SEAM = "runtime"
N = 257


@clause(SEAM, "R01", "selects devices and refuses a missing one")
def devices(s: Subject) -> None:
    rt = s.runtime()
    require(rt.device_count() == len(s.devices), f"device_count() is {rt.device_count()}")
    rt.set_device(1)
    require(rt.current_device() == 1, "set_device(1) did not make device 1 current")
    expect_error(lambda: rt.set_device(len(s.devices)), "set_device(device_count())")
    require(rt.current_device() == 1, "a failed set_device changed the current device")


@clause(SEAM, "R02", "allocates and frees, refusing bad sizes and double frees")
def malloc_free(s: Subject) -> None:
    rt = s.runtime()
    p, q = rt.malloc(1000), rt.malloc(1000)
    require(isinstance(p, int) and isinstance(q, int) and p != q, "two live allocations share an address")
    rt.free(p)
    expect_error(lambda: rt.free(p), "double free")
    expect_error(lambda: rt.free(12345), "freeing an address malloc never returned")
    expect_error(lambda: rt.malloc(0), "malloc(0)")
    rt.free(q)


@clause(SEAM, "R03", "keeps memory statistics that follow malloc and free")
def memory_stats(s: Subject) -> None:
    rt = s.runtime()
    before = rt.memory_stats()
    for key in ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes"):
        require(key in before, f"memory_stats() has no {key!r}")
    p = rt.malloc(1 << 20)
    mid = rt.memory_stats()
    require(mid["allocated_bytes"] >= before["allocated_bytes"] + (1 << 20), "allocated_bytes did not grow")
    rt.free(p)
    after = rt.memory_stats()
    require(after["allocated_bytes"] == before["allocated_bytes"], "allocated_bytes did not return after free")
    require(after["peak_allocated_bytes"] >= mid["allocated_bytes"], "peak_allocated_bytes forgot the peak")


@clause(SEAM, "R04", "copies host->device->host")
def memcpy(s: Subject) -> None:
    rt = s.runtime()
    data = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    p = rt.malloc(data.nbytes)
    rt.memcpy_h2d(p, data)
    out = np.empty_like(data)
    rt.memcpy_d2h(out, p)
    require(np.array_equal(out, data), "the data came back different")


def _launch(s: Subject, rt, stream_a, stream_b):
    plan = s.binaries(add_relu_graph(N))[0]
    step = next(st for st in plan.steps if isinstance(st, KernelStep))
    module = rt.load_module(plan.binary)
    a, b = rng_arrays(N, seed=3)
    ptrs = {n: rt.malloc(N * 4) for n in ("in0", "in1", "out0")}
    rt.memcpy_h2d(ptrs["in0"], a, stream_a)
    rt.memcpy_h2d(ptrs["in1"], b, stream_a)
    rt.launch(module, step.entry, step.grid, ptrs, stream_a)
    rt.stream_wait_event(stream_b, rt.record_event(stream_a))
    out = np.empty(N, np.float32)
    rt.memcpy_d2h(out, ptrs["out0"], stream_b)
    return plan, out, np.maximum(a.astype(np.float64) + b, 0)


@clause(SEAM, "R05", "launches kernels and orders streams with events")
def streams_events(s: Subject) -> None:
    rt = s.runtime()
    a, b = rt.create_stream(in_order=True), rt.create_stream(in_order=True)
    _, out, ref = _launch(s, rt, a, b)
    require(np.allclose(out, ref, rtol=1e-6, atol=1e-6),
            "a copy on stream B after an event recorded on stream A did not see A's kernel")


@clause(SEAM, "R06", "caches loaded modules")
def module_cache(s: Subject) -> None:
    rt = s.runtime()
    plan = s.binaries(add_relu_graph(N))[0]
    m1 = rt.load_module(plan.binary)
    m2 = rt.load_module(plan.binary)
    require(m1 is m2, "loading the same binary twice loaded it twice")


@clause(SEAM, "R07", "synchronize completes the work of every stream")
def synchronize(s: Subject) -> None:
    rt = s.runtime()
    stream = rt.create_stream(in_order=True)
    data = np.arange(N, dtype=np.float32)
    p = rt.malloc(data.nbytes)
    rt.memcpy_h2d(p, data, stream)
    out = np.zeros_like(data)
    rt.memcpy_d2h(out, p, stream, blocking=False)
    rt.synchronize()
    require(np.array_equal(out, data), "after synchronize() a non-blocking copy had not completed")


@clause(SEAM, "R08", "reports what it did")
def report(s: Subject) -> None:
    rt = s.runtime()
    p = rt.malloc(64)
    rt.free(p)
    rep = rt.report()
    require(isinstance(rep, dict) and rep.get("vendor") == s.vendor.name,
            f"report() must be a dict naming the vendor, got {str(rep)[:80]}")


@clause(SEAM, "R09", "times events on the simulated clock and refuses unrecorded ones")
def events(s: Subject) -> None:
    rt = s.runtime()
    stream = rt.create_stream(in_order=True, enable_profiling=True)
    data = np.arange(N, dtype=np.float32)
    p = rt.malloc(data.nbytes)
    start = rt.record_event(stream)
    rt.memcpy_h2d(p, data, stream)
    end = rt.record_event(stream)
    rt.event_synchronize(end)
    require(rt.query_event(end), "query_event() is false after event_synchronize()")
    copy = [r for d in s.devices for r in d.timeline.records if r.kind == "copy"][-1]
    ms = rt.elapsed_time(start, end)
    require(abs(ms - (copy.end - copy.start) * 1e3) <= 1e-9 * max(1.0, ms),
            f"elapsed_time() is {ms} ms; the copy between the events took "
            f"{(copy.end - copy.start) * 1e3} ms of simulated time")
    expect_error(lambda: rt.elapsed_time(rt.create_event(), end), "elapsed_time of an unrecorded event")


@clause(SEAM, "R10", "pools pinned host memory and copies through it")
def pinned_host(s: Subject) -> None:
    rt = s.runtime()
    stream = rt.create_stream(in_order=True)
    buf = rt.malloc_host(N * 4)
    host = buf.view(np.float32)
    host[:] = np.arange(N, dtype=np.float32)
    p = rt.malloc(N * 4)
    rt.memcpy_h2d(p, host, stream)
    back = rt.malloc_host(N * 4).view(np.float32)
    rt.memcpy_d2h(back, p, stream)
    require(np.array_equal(back, host), "a copy through pinned buffers came back different")
    rt.free_host(buf)
    again = rt.malloc_host(N * 4)
    require(np.shares_memory(again, buf), "a freed pinned buffer of the same size was not reused")
    expect_error(lambda: rt.free_host(np.zeros(4)), "free_host of a pageable array")


@clause(SEAM, "R11", "captures a stream into a graph and replays it (or, where the family "
                    "declares no graph capture, refuses it with its not-supported code)")
def graphs(s: Subject) -> None:
    rt = s.runtime()
    plan = s.binaries(add_relu_graph(N))[0]
    step = next(st for st in plan.steps if isinstance(st, KernelStep))
    module = rt.load_module(plan.binary)
    a, b = rng_arrays(N, seed=5)
    ptrs = {n: rt.malloc(N * 4) for n in ("in0", "in1", "out0")}
    stream = rt.create_stream(in_order=True)
    if not s.vendor.facts.get("runtime", {}).get("graph", {}).get("supported", False):
        # [runtime.graph] supported = false: capture is refused the family's way, and the
        # stream it was asked on keeps working
        expect_error(lambda: rt.begin_capture(stream), "begin_capture() on a family without graph capture",
                     (NotSupportedError,))
        rt.memcpy_h2d(ptrs["in0"], a, stream)
        rt.memcpy_h2d(ptrs["in1"], b, stream)
        rt.launch(module, step.entry, step.grid, ptrs, stream)
        out = np.empty(N, np.float32)
        rt.memcpy_d2h(out, ptrs["out0"], stream)
        require(np.allclose(out, np.maximum(a.astype(np.float64) + b, 0), rtol=1e-6, atol=1e-6),
                "the stream computed the wrong result after the refused capture")
        return
    rt.begin_capture(stream)
    rt.memcpy_h2d(ptrs["in0"], a, stream)
    rt.memcpy_h2d(ptrs["in1"], b, stream)
    rt.launch(module, step.entry, step.grid, ptrs, stream)
    expect_error(rt.synchronize, "synchronize() during a capture")
    expect_error(lambda: rt.end_capture(stream), "end_capture() after an illegal call")
    rt.begin_capture(stream)
    rt.memcpy_h2d(ptrs["in0"], a, stream)
    rt.memcpy_h2d(ptrs["in1"], b, stream)
    rt.launch(module, step.entry, step.grid, ptrs, stream)
    graph = rt.end_capture(stream)
    require(not any(r.kind == "kernel" for d in s.devices for r in d.timeline.records),
            "a captured launch ran during the capture")
    graph.replay()
    out = np.empty(N, np.float32)
    rt.memcpy_d2h(out, ptrs["out0"], stream)
    require(np.allclose(out, np.maximum(a.astype(np.float64) + b, 0), rtol=1e-6, atol=1e-6),
            "replaying the graph did not compute relu(a + b)")
