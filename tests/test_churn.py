"""Churn without leaks: streams, events, modules, graphs and memory created and released
many times leave nothing behind (a bounded run of the ``make bench`` churn), and a released
handle is an error with the family's code when used again."""

from __future__ import annotations

import numpy as np
import pytest

from fornax.layers.errors import FornaxError
from fornax.scenarios.churn import _graph, churn
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = FAMILIES


@pytest.mark.parametrize("vendor", VENDORS)
def test_churn_leaves_nothing_behind(vendor):
    stack = compose(make_config(vendor))
    r = churn(stack, 150, sample_every=25)
    assert r.wrong == []
    assert r.graphs                                      # every family captures graphs
    assert r.handles_after == r.handles_before, (r.handles_before, r.handles_after)
    assert r.handles_after["driver_contexts"] == 1 and r.handles_after["driver_queues"] == 0
    assert r.device_used_after == 0 and r.allocated_after == 0 and r.reserved_after == 0
    assert r.clean
    # nothing of the 150 streams lingers in the simulator either
    tl = stack.devices[0].timeline
    assert tl.queues == []
    assert len(tl.race_detector.queue_clocks) <= 1       # the last one goes at the next prune
    assert stack.driver.kernel_log.total >= 300


def _module_and_step(stack):
    plan = stack.compiler.compile(_graph(), stack.target)
    return plan, plan.steps[0]


@pytest.mark.parametrize("vendor", VENDORS)
def test_released_handles_are_coded_errors(vendor):
    stack = compose(make_config(vendor))
    rt = stack.runtime
    plan, step = _module_and_step(stack)
    s = rt.create_stream(in_order=True)
    ev = rt.create_event()
    module = rt.load_module(plan.binary)
    ptrs = {n: rt.malloc(256 * 4) for n in ("in0", "in1", "out0")}
    rt.begin_capture(s)
    rt.launch(module, step.entry, step.grid, ptrs, s)
    graph = rt.end_capture(s)
    rt.destroy_graph(graph)
    rt.unload_module(module)
    rt.destroy_event(ev)
    rt.destroy_stream(s)
    uses = {
        "launch of an unloaded module": lambda: rt.launch(module, step.entry, step.grid, ptrs),
        "unload twice": lambda: rt.unload_module(module),
        "record of a destroyed event": lambda: rt.record_event(None, ev),
        "destroy an event twice": lambda: rt.destroy_event(ev),
        "synchronize a destroyed stream": lambda: rt.stream_synchronize(s),
        "destroy a stream twice": lambda: rt.destroy_stream(s),
        "replay a destroyed graph": lambda: rt.graph_launch(graph),
        "destroy a graph twice": lambda: rt.destroy_graph(graph),
        "destroy the default stream": lambda: rt.destroy_stream(rt.default_stream()),
    }
    for what, use in uses.items():
        with pytest.raises(FornaxError) as info:
            use()
        err = info.value
        assert err.code is not None and err.vendor == vendor, what
        assert err.kind in ("invalid_handle", "invalid_argument", "capture"), (what, err.kind, err.code)
    # the runtime still works
    out = np.empty(256, np.float32)
    a = np.arange(256, dtype=np.float32)
    rt.memcpy_h2d(ptrs["in0"], a)
    rt.memcpy_h2d(ptrs["in1"], a)
    m2 = rt.load_module(plan.binary)
    rt.launch(m2, step.entry, step.grid, ptrs)
    rt.memcpy_d2h(out, ptrs["out0"])
    np.testing.assert_array_equal(out, 2 * a)


@pytest.mark.parametrize("vendor", VENDORS)
def test_destroyed_stream_still_completes_its_work(vendor):
    """cudaStreamDestroy returns at once; work already on the stream still runs."""
    stack = compose(make_config(vendor))
    rt = stack.runtime
    plan, step = _module_and_step(stack)
    s = rt.create_stream(in_order=True)
    ptrs = {n: rt.malloc(256 * 4) for n in ("in0", "in1", "out0")}
    a = np.linspace(-1, 1, 256, dtype=np.float32)
    rt.memcpy_h2d(ptrs["in0"], a, s)
    rt.memcpy_h2d(ptrs["in1"], a, s)
    rt.launch(rt.load_module(plan.binary), step.entry, step.grid, ptrs, s)
    rt.destroy_stream(s)
    rt.synchronize()
    out = np.empty(256, np.float32)
    rt.memcpy_d2h(out, ptrs["out0"])
    np.testing.assert_array_equal(out, np.maximum(2 * a, 0))
    assert stack.devices[0].timeline.queues == [q.hwq for q in rt.default_stream().queues]
