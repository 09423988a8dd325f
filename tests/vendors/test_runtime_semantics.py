"""Runtime semantics where the three families really differ: the legacy NULL stream,
non-blocking and per-thread streams, SYCL out-of-order queues, blocking allocation calls,
events and their errors, pinned copies, synchronous copies, graph capture and OOM codes.
Expected values are written out per family here (from the real stacks' documentation),
so swapping one family's data for another's fails these tests."""

from __future__ import annotations

import numpy as np
import pytest

from families import FAMILY_OBJECTS
from families import family as family_named
from helpers import FAMILIES, scale_program
from fornax.layers.compiler import Target
from fornax.layers.errors import FornaxError
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import get_vendor

N = 64
SRC = np.arange(N, dtype=np.float32) + 1
OLD = np.full(N, -7.0, np.float32)
KLABEL, DLABEL = "scale3", f"d2h {4 * N}B"


def _program(name: str, factor: float) -> isa.Program:
    """dst[i] = src[i] * factor for i < N."""
    return scale_program(name, factor, N)


class Bench:
    """A runtime of one family on the tiny spec, a module with scale3 (x3) and scale2 (x2),
    and three device buffers: src = 1..64, dst = -7 (old contents), tmp."""

    def __init__(self, vendor: str, **kw):
        v = get_vendor(vendor)
        self.spec = load_spec("tiny")
        self.drv = v.driver([Device(self.spec, 0)])
        self.rt = v.runtime(self.drv, **kw)
        props = self.drv.properties(0)
        comp = v.compiler()
        fmt = next(f for f in comp.output_formats() if f in self.drv.loadable_formats(0))
        image = comp.emit([_program("scale3", 3.0), _program("scale2", 2.0)],
                          Target(props.target, fmt, props.compute_units))
        self.module = self.rt.load_module(image)
        self.src, self.dst, self.tmp = (self.rt.malloc(4 * N) for _ in range(3))
        setup = self.rt.create_stream(in_order=True)
        self.rt.memcpy_h2d(self.src, SRC, setup)
        self.rt.memcpy_h2d(self.dst, OLD, setup)
        self.rt.memcpy_h2d(self.tmp, OLD, setup)
        self.rt.stream_synchronize(setup)

    @property
    def timeline(self):
        return self.drv.devices[0].timeline

    @property
    def races(self):
        return self.drv.devices[0].races

    def records(self, label: str):
        return [r for r in self.timeline.records if r.label == label]

    def write(self, stream, src=None, dst=None, depends_on=()):
        return self.rt.launch(self.module, "scale3", (1, 1, 1),
                              {"src": src or self.src, "dst": dst or self.dst}, stream, depends_on)

    def read(self, stream, depends_on=()):
        out = np.zeros(N, np.float32)
        self.rt.memcpy_d2h(out, self.dst, stream, blocking=False, depends_on=depends_on)
        return out

    def finish_writer_then_read(self, writer_stream, reader_stream):
        """Writer kernel on one stream, reader copy on another, nothing explicit between."""
        self.write(writer_stream)
        out = self.read(reader_stream)
        self.rt.synchronize()
        return out

    def assert_ordered(self, out):
        np.testing.assert_array_equal(out, SRC * 3)
        assert self.races == []
        assert self.records(DLABEL)[-1].start >= self.records(KLABEL)[0].end

    def assert_raced(self, out):
        np.testing.assert_array_equal(out, OLD)                  # a real stale read
        (race,) = self.races
        d = race.to_dict()
        assert {d["first"]["label"], d["second"]["label"]} == {KLABEL, DLABEL}
        assert self.records(DLABEL)[-1].start < self.records(KLABEL)[0].end


def code_of(fn):
    with pytest.raises(FornaxError) as info:
        fn()
    return info.value.code.name, info.value.code.value


# -- 1-4: the legacy default stream ----------------------------------------------------------
# which families have one is a capability tag read from the facts (tests/families.py); that the
# facts say so for cuda-like and rocm-like and not for xpu-like is checked here once
def test_the_legacy_default_stream_capability_matches_the_real_stacks():
    legacy = {f.name: f.has("legacy-default-stream") for f in FAMILY_OBJECTS}
    assert legacy == {"cuda-like": True, "rocm-like": True, "xpu-like": False}


def test_default_stream_waits_for_a_blocking_stream_only_where_it_is_legacy(family):
    b = Bench(family.name)
    out = b.finish_writer_then_read(b.rt.create_stream(in_order=True), b.rt.default_stream())
    if family.has("legacy-default-stream"):
        b.assert_ordered(out)                # the NULL stream waited for the blocking stream
        assert b.rt.counts["implicit_waits"] >= 1
    else:
        b.assert_raced(out)                  # an in-order SYCL queue is just another queue
        assert b.rt.counts["implicit_waits"] == 0


def test_blocking_stream_waits_for_prior_default_stream_work_only_where_it_is_legacy(family):
    b = Bench(family.name)
    out = b.finish_writer_then_read(b.rt.default_stream(), b.rt.create_stream(in_order=True))
    (b.assert_ordered if family.has("legacy-default-stream") else b.assert_raced)(out)


def test_non_blocking_stream_opts_out_of_the_legacy_sync(family):
    if not family.has("legacy-default-stream"):
        pytest.skip(f"{family}: no legacy default stream to opt out of")
    b = Bench(family.name)
    b.rt.synchronize()
    before = b.rt.counts["implicit_waits"]
    out = b.finish_writer_then_read(b.rt.create_stream("non_blocking"), b.rt.default_stream())
    b.assert_raced(out)
    assert b.rt.counts["implicit_waits"] == before


def test_per_thread_default_stream(family):
    vendor = family.name
    if not family.has("per-thread-default-stream"):     # SYCL has no per-thread default queue
        code = family.facts["runtime"]["errors"]["conditions"]["not_supported"]
        value = family.facts["runtime"]["errors"]["codes"][code]["value"]
        assert code_of(lambda: Bench(vendor, per_thread_default_stream=True)) == (code, value)
        return
    b = Bench(vendor, per_thread_default_stream=True)
    # the per-thread stream does not sync with other blocking streams ...
    out = b.finish_writer_then_read(b.rt.create_stream(), b.rt.default_stream())
    b.assert_raced(out)
    # ... but the legacy stream still syncs with it (cudaStreamLegacy / hipStreamLegacy)
    b2 = Bench(vendor, per_thread_default_stream=True)
    out = b2.finish_writer_then_read(b2.rt.default_stream(), b2.rt.legacy_stream())
    b2.assert_ordered(out)


# -- 5-6: SYCL out-of-order queues -------------------------------------------------------------
def test_created_queue_order_and_depends_on(family):
    vendor = family.name
    b = Bench(vendor)
    q = b.rt.create_stream()
    out = b.finish_writer_then_read(q, q)      # two commands on the same queue, no event between
    if family.has("out-of-order-queues"):
        assert not q.in_order and len(q.queues) == family.facts["runtime"]["queue_pool"]
        b.assert_raced(out)                    # an out-of-order queue lets them overlap
    else:
        assert q.in_order
        b.assert_ordered(out)
    # an event dependency orders them on every family
    b2 = Bench(vendor)
    q = b2.rt.create_stream()
    ev = b2.write(q)
    out = b2.read(q, depends_on=[ev])
    b2.rt.synchronize()
    b2.assert_ordered(out)


@pytest.mark.parametrize("vendor", FAMILIES)
def test_in_order_on_request(vendor):
    b = Bench(vendor)
    expected = {"cuda-like": ("cudaErrorNotSupported", 801), "rocm-like": ("hipErrorNotSupported", 801)}
    if vendor in expected:                     # CUDA/HIP streams cannot be out of order
        assert code_of(lambda: b.rt.create_stream(in_order=False)) == expected[vendor]
    q = b.rt.create_stream(in_order=True)
    b.assert_ordered(b.finish_writer_then_read(q, q))
    assert b.rt.default_stream().in_order     # what execute_plan runs on, on every family


# -- 7: blocking allocation calls -------------------------------------------------------------
@pytest.mark.parametrize("vendor, malloc_blocks, free_blocks", [
    ("cuda-like", False, True), ("rocm-like", True, True), ("xpu-like", False, False)])
def test_malloc_and_free_block_the_host_per_family(vendor, malloc_blocks, free_blocks):
    b = Bench(vendor)
    s = b.rt.create_stream(in_order=True)
    b.write(s)
    p = b.rt.malloc(1 << 20)
    assert len(b.records(KLABEL)) == (1 if malloc_blocks else 0)   # pending work ran (host waited)
    b.rt.launch(b.module, "scale2", (1, 1, 1), {"src": b.src, "dst": b.tmp}, s)
    b.rt.free(p)
    assert len(b.records("scale2")) == (1 if free_blocks else 0)


# -- 8-10: events ------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", FAMILIES)
def test_elapsed_time_is_the_simulated_kernel_time(vendor):
    b = Bench(vendor)
    s = b.rt.create_stream(in_order=True, enable_profiling=True)
    start = b.rt.record_event(s)
    b.write(s)
    b.rt.launch(b.module, "scale2", (1, 1, 1), {"src": b.src, "dst": b.tmp}, s)
    end = b.rt.record_event(s)
    b.rt.event_synchronize(end)
    k1, k2 = b.records(KLABEL)[0], b.records("scale2")[0]
    assert b.rt.elapsed_time(start, end) == pytest.approx((k2.end - k1.start) * 1e3, rel=1e-12)
    assert k2.end > k1.start
    # timing is disabled differently: an event flag (CUDA/HIP) or the queue property (SYCL)
    if vendor == "xpu-like":
        plain = b.rt.create_stream(in_order=True)          # no enable_profiling
        e1 = b.rt.record_event(plain)
        b.write(plain)
        e2 = b.rt.record_event(plain)
        b.rt.event_synchronize(e2)
        assert code_of(lambda: b.rt.elapsed_time(e1, e2)) == ("invalid", 8)
    else:
        e1 = b.rt.record_event(s, b.rt.create_event(timing=False))
        b.rt.event_synchronize(e1)
        assert code_of(lambda: b.rt.elapsed_time(e1, end))[1] == 400


@pytest.mark.parametrize("vendor, code", [
    ("cuda-like", ("cudaErrorInvalidResourceHandle", 400)),
    ("rocm-like", ("hipErrorInvalidHandle", 400)), ("xpu-like", ("invalid", 8))])
def test_unrecorded_event_codes(vendor, code):
    b = Bench(vendor)
    s = b.rt.create_stream(in_order=True, enable_profiling=True)
    recorded = b.rt.record_event(s)
    assert code_of(lambda: b.rt.elapsed_time(b.rt.create_event(), recorded)) == code
    assert code_of(lambda: b.rt.query_event(b.rt.create_event())) == code


@pytest.mark.parametrize("vendor, not_ready", [
    ("cuda-like", ("cudaErrorNotReady", 600)), ("rocm-like", ("hipErrorNotReady", 600)),
    ("xpu-like", None)])
def test_query_and_elapsed_time_before_completion(vendor, not_ready):
    b = Bench(vendor)
    s = b.rt.create_stream(in_order=True, enable_profiling=True)
    start = b.rt.record_event(s)
    b.write(s)
    end = b.rt.record_event(s)
    assert b.rt.query_event(start)              # nothing before it: complete at once
    assert not b.rt.query_event(end)            # the kernel has not run by the host's time
    if not_ready:
        assert code_of(lambda: b.rt.elapsed_time(start, end)) == not_ready
        b.rt.event_synchronize(end)
    else:                                       # SYCL's get_profiling_info waits for the command
        assert b.rt.elapsed_time(start, end) > 0
    assert b.rt.query_event(end)
    k = b.records(KLABEL)[0]
    assert b.rt.elapsed_time(start, end) == pytest.approx((k.end - k.start) * 1e3, rel=1e-12)


# -- 11-12: graphs -----------------------------------------------------------------------------
NODE_FRACTION = {"cuda-like": 0.25, "rocm-like": 0.5, "xpu-like": 0.5}


def _chain(b, s, n):
    """n kernels ping-ponging between tmp and dst, each depending on the previous one."""
    bufs = [b.dst, b.tmp]
    b.rt.launch(b.module, "scale2", (1, 1, 1), {"src": b.src, "dst": bufs[0]}, s)
    for i in range(1, n):
        b.rt.launch(b.module, "scale2", (1, 1, 1), {"src": bufs[(i - 1) % 2], "dst": bufs[i % 2]}, s)
    return bufs[(n - 1) % 2]


@pytest.mark.parametrize("vendor", FAMILIES)
def test_graph_replay_is_cheaper_per_launch_with_identical_results(vendor):
    n = 6
    eager, graph = Bench(vendor), Bench(vendor)
    s = eager.rt.create_stream(in_order=True)
    last = _chain(eager, s, n)
    out_e = np.zeros(N, np.float32)
    eager.rt.memcpy_d2h(out_e, last, s)
    recs_e = eager.records("scale2")
    span_e = recs_e[-1].end - recs_e[0].start

    g = graph.rt.create_stream(in_order=True)
    graph.rt.begin_capture(g)
    last = _chain(graph, g, n)
    assert graph.records("scale2") == []        # captured, not run
    gr = graph.rt.end_capture(g)
    gr.replay()
    out_g = np.zeros(N, np.float32)
    graph.rt.memcpy_d2h(out_g, last, g)
    recs_g = graph.records("scale2")
    span_g = recs_g[-1].end - recs_g[0].start
    np.testing.assert_array_equal(out_g, out_e)
    np.testing.assert_array_equal(out_g, SRC.astype(np.float64) * 2 ** n)
    saved = (n - 1) * (1 - NODE_FRACTION[vendor]) * graph.spec.launch_latency_s
    assert span_g == pytest.approx(span_e - saved, rel=1e-9)
    assert span_g < span_e
    gr.replay()                                 # replays again with the same effect
    graph.rt.memcpy_d2h(out_g, last, g)
    np.testing.assert_array_equal(out_g, out_e)
    assert graph.rt.counts["graph_replays"] == 2


CAPTURE = {"cuda-like": (("cudaErrorStreamCaptureUnsupported", 900), ("cudaErrorStreamCaptureInvalidated", 901)),
           "rocm-like": (("hipErrorStreamCaptureUnsupported", 900), ("hipErrorStreamCaptureInvalidated", 901)),
           "xpu-like": (("invalid", 8), ("invalid", 8))}


@pytest.mark.parametrize("vendor", FAMILIES)
def test_capture_illegal_operations_give_the_family_code(vendor):
    unsupported, invalidated = CAPTURE[vendor]
    b = Bench(vendor)
    g = b.rt.create_stream(in_order=True)
    b.rt.begin_capture(g)
    b.write(g)
    assert code_of(b.rt.synchronize) == unsupported
    assert code_of(lambda: b.rt.stream_synchronize(g)) == unsupported
    assert code_of(lambda: b.rt.memcpy(np.zeros(N, np.float32), b.dst, g)) == unsupported
    assert code_of(lambda: b.rt.end_capture(g)) == invalidated
    # hipMalloc synchronises the device, so it is illegal during a capture; cudaMalloc is not
    b.rt.begin_capture(g)
    if vendor == "rocm-like":
        assert code_of(lambda: b.rt.malloc(4096)) == unsupported
    else:
        b.rt.malloc(4096)
    if family_named(vendor).has("legacy-default-stream"):   # the legacy stream cannot be captured
        assert code_of(lambda: b.rt.begin_capture(b.rt.default_stream())) == unsupported


# -- 13-14: copies -----------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", FAMILIES)
def test_pinned_copies_run_at_link_bandwidth_pageable_at_the_staging_rate(vendor):
    b = Bench(vendor)
    nbytes = 1 << 20
    dev = b.rt.malloc(nbytes)
    s = b.rt.create_stream(in_order=True)
    pinned = b.rt.malloc_host(nbytes)
    pinned[:] = 7
    b.rt.memcpy_h2d(dev, pinned, s)
    b.rt.memcpy_h2d(dev, np.full(nbytes, 7, np.uint8), s)
    b.rt.stream_synchronize(s)
    pin_rec, page_rec = b.records(f"h2d {nbytes}B")
    spec = b.spec
    assert pin_rec.end - pin_rec.start == pytest.approx(spec.copy_latency_s + nbytes / spec.host_link_bandwidth)
    assert page_rec.end - page_rec.start == pytest.approx(
        spec.copy_latency_s + nbytes / (0.5 * spec.host_link_bandwidth))
    # the pool hands the same pinned buffer back once its copy is done
    b.rt.free_host(pinned)
    again = b.rt.malloc_host(nbytes)
    assert np.shares_memory(again, pinned) and b.rt.memory_stats()["host_cache_hits"] == 1


@pytest.mark.parametrize("vendor, returns_before_dma", [
    ("cuda-like", True), ("rocm-like", False), ("xpu-like", False)])
def test_synchronous_upload_returns_per_family(vendor, returns_before_dma):
    """cudaMemcpy from pageable memory returns once the data is staged; hipMemcpy and
    queue.memcpy().wait() return when the copy is done.  From pinned memory all wait."""
    b = Bench(vendor)
    nbytes = 1 << 20
    dev = b.rt.malloc(nbytes)
    s = b.rt.create_stream(in_order=True)
    b.rt.memcpy(dev, np.ones(nbytes, np.uint8), s)
    returned_at = b.timeline.host_time
    b.rt.stream_synchronize(s)
    (rec,) = b.records(f"h2d {nbytes}B")
    assert (returned_at < rec.end) == returns_before_dma
    pinned = b.rt.malloc_host(nbytes)
    b.rt.memcpy(dev, pinned, s)
    assert b.timeline.host_time >= b.records(f"h2d {nbytes}B")[-1].end
    out = np.zeros(nbytes, np.uint8)
    b.rt.memcpy(out, dev, s)                    # device to host: always complete on return
    assert b.timeline.host_time >= b.records(f"d2h {nbytes}B")[-1].end


# -- 15: out of memory -------------------------------------------------------------------------
@pytest.mark.parametrize("vendor, code", [
    ("cuda-like", ("cudaErrorMemoryAllocation", 2)), ("rocm-like", ("hipErrorOutOfMemory", 2)),
    ("xpu-like", ("memory_allocation", 9))])
def test_out_of_memory_message_and_code(vendor, code):
    b = Bench(vendor)
    total = b.spec.hbm_bytes
    keep = b.rt.malloc(total // 2)
    with pytest.raises(FornaxError) as info:
        b.rt.malloc(total)
    err = info.value
    assert (err.code.name, err.code.value) == code
    msg = str(err)
    stats = b.rt.memory_stats()
    mib = total / 2 ** 20
    assert f"Tried to allocate {mib:.2f} MiB" in msg or f"Tried to allocate {total / 2 ** 30:.2f} GiB" in msg
    assert "is allocated by the runtime" in msg and "reserved but unallocated" in msg and "is free" in msg
    assert stats["num_ooms"] == 1 and stats["allocated_bytes"] >= total // 2
    b.rt.free(keep)


# -- stream priorities ---------------------------------------------------------------------------
@pytest.mark.parametrize("vendor, least, greatest", [
    ("cuda-like", 0, -5), ("rocm-like", 1, -1), ("xpu-like", 1, -1)])
def test_stream_priorities_clamp_to_the_family_range_and_order_ready_work(vendor, least, greatest):
    b = Bench(vendor)
    assert b.rt.stream_priority_range() == (least, greatest)
    assert b.rt.create_stream(in_order=True, priority=-100).priority == greatest   # clamped
    assert b.rt.create_stream(in_order=True, priority=100).priority == least
    with pytest.raises(FornaxError, match="integer"):
        b.rt.create_stream(priority=0.5)

    def order(high_priority: int) -> list[str]:
        """Four low-priority kernels queued, then one on a second stream: which runs when."""
        c = Bench(vendor)
        low = c.rt.create_stream(in_order=True, flags="non_blocking", priority=least)
        high = c.rt.create_stream(in_order=True, flags="non_blocking", priority=high_priority)
        for _ in range(4):
            c.rt.launch(c.module, "scale2", (1, 1, 1), {"src": c.src, "dst": c.tmp}, low)
        c.write(high)
        c.rt.synchronize()
        return [r.label for r in c.timeline.records if r.kind == "kernel"]

    # all five are ready at the same simulated instant (launches take no host time here).
    # Equal priority: the engine takes ready work queue by queue, so the later stream's kernel
    # waits for the whole first queue; a higher priority runs it first
    assert order(least) == ["scale2"] * 4 + [KLABEL]
    assert order(greatest) == [KLABEL] + ["scale2"] * 4
