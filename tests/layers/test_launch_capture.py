"""Captured launch sequences (fornax.layers.launch_capture): a resident plan's second run on
a stream is captured, later runs replay its runtime calls -- with the results, device times,
kernel logs, library records and traces of live runs, on every family."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fornax.frameworks.jax as fj
from fornax.layers.graph import DType
from fornax.scenarios.workloads import mlp
from fornax.sim.trace import chrome_trace
from fornax.stack import BUILTIN_FAMILIES, compose, make_config

CAPTURE_COUNTS = ("plans_captured", "plan_runs_replayed", "plan_captures_refused")


def _programs():
    import jax
    import jax.numpy as jnp
    graph, _ = mlp(0, batch=16, d_in=64, hidden=96, d_out=32)
    params = tuple(np.asarray(v.const) for v in graph.constants)

    def forward(p, x):
        w1, b1, w2, b2 = p
        return jax.nn.relu(x @ w1 + b1) @ w2 + b2

    def grad(p, x):
        return jax.grad(lambda q: jnp.mean(forward(q, x) ** 2))(p)
    return (forward, grad), params


def _run(family: str, replay: bool):
    """Four calls of each program on different inputs; what a report and a trace hold."""
    stack = compose(make_config(family, replay=replay))
    client = fj.Client(stack, f"vendor {family}")
    programs, params = _programs()
    rng = np.random.default_rng(1)
    outs = []
    for fn in programs:
        f = fj.jit(fn, stack=client, numpy=True)
        for _ in range(4):
            x = rng.standard_normal((16, 64)).astype(np.float32)
            outs.append([np.asarray(o).tobytes() for o in np.atleast_1d(f(params, x))]
                        if fn is programs[0] else [np.asarray(o).tobytes() for o in f(params, x)])
    dev = stack.devices[0]
    framework = {k: v for k, v in stack.framework.report().items() if k not in CAPTURE_COUNTS}
    records = [dataclasses.astuple(r) for r in dev.timeline.records]
    return {"outputs": outs, "framework": framework, "runtime": stack.runtime.report(),
            "kernels": [dataclasses.astuple(k) for k in stack.driver.kernel_log],
            "library": stack.library.report(), "records": records,
            "trace": chrome_trace(stack.devices), "busy": dev.timeline.busy_time,
            "power": dev.power.summary(until=dev.timeline.busy_time)}, stack.framework.counts


@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_replayed_runs_are_live_runs_in_every_report_and_trace(family):
    on, counts_on = _run(family, True)
    off, counts_off = _run(family, False)
    assert counts_on["plans_captured"] == 2 and counts_on["plan_runs_replayed"] == 2 * 2
    assert not any(k in counts_off for k in CAPTURE_COUNTS)
    for part in on:
        assert on[part] == off[part], part


def _plan_and_buffers(stack, graph, feeds, n_sets):
    rt = stack.runtime
    plan = stack.framework.prepare(graph)
    sets = []
    for _ in range(n_sets):
        ins = [rt.malloc(int(np.asarray(feeds[v.name]).nbytes)) for v in graph.inputs]
        outs = [rt.malloc(plan.out_nbytes[i]) for i in range(len(graph.outputs))]
        sets.append((ins, outs))
    return plan, sets


def _call(stack, plan, graph, feeds, ins, outs):
    rt = stack.runtime
    for ptr, v in zip(ins, graph.inputs):
        rt.memcpy_h2d(ptr, np.ascontiguousarray(feeds[v.name]))
    plan(ins, outs)
    res = []
    for ptr, v in zip(outs, graph.outputs):
        host = np.empty(v.shape, dtype=v.dtype.numpy)
        rt.memcpy_d2h(host, ptr)
        res.append(host)
    return res


def test_a_replay_follows_buffers_that_moved_since_the_capture():
    graph, feeds = mlp(3, batch=8, d_in=32, hidden=48, d_out=16, dtype=DType.FLOAT32)
    stack = compose(make_config("rocm-like"))
    plan, (a, b) = _plan_and_buffers(stack, graph, feeds, 2)
    _call(stack, plan, graph, feeds, *a)
    assert plan.last_run == "live"                       # the warm-up
    _call(stack, plan, graph, feeds, *a)
    assert plan.last_run == "captured"
    other = {k: np.asarray(v) * 2 for k, v in feeds.items()}
    got = _call(stack, plan, graph, other, *b)           # other addresses, other data
    assert plan.last_run == "replayed"
    ref_stack = compose(make_config("rocm-like", replay=False))
    ref_plan, (r,) = _plan_and_buffers(ref_stack, graph, other, 1)
    want = _call(ref_stack, ref_plan, graph, other, *r)
    assert ref_plan.last_run == "live" and ref_plan.refused == "replay is switched off"
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


def test_a_library_switch_or_another_stream_is_not_replayed_from_an_old_capture():
    """The library's algorithm choice depends on its switches, and a capture is made on one
    stream: either changed, the run is live again (a warm-up, then a new capture)."""
    graph, feeds = mlp(4, batch=8, d_in=32, hidden=48, d_out=16)
    stack = compose(make_config("cuda-like"))
    plan, (a,) = _plan_and_buffers(stack, graph, feeds, 1)
    runs = []
    for _ in range(3):
        _call(stack, plan, graph, feeds, *a)
        runs.append(plan.last_run)
    stack.library.workspace_limit = 0                    # no split-K workspace any more
    for _ in range(3):
        _call(stack, plan, graph, feeds, *a)
        runs.append(plan.last_run)
    assert runs == ["live", "captured", "replayed"] * 2
    stream = stack.runtime.create_stream()
    for ptr, v in zip(a[0], graph.inputs):
        stack.runtime.memcpy_h2d(ptr, np.ascontiguousarray(feeds[v.name]))
    plan(*a, stream)
    assert plan.last_run == "live"
    assert stack.framework.counts["plans_captured"] == 2


def test_relocations_move_buffers_that_overlapped_together_or_refuse():
    from fornax.layers.launch_capture import relocations
    assert relocations([(100, 8, 100), (200, 8, 200)]) == []
    assert relocations([(100, 8, 300), (200, 8, 200)]) == [(100, 8, 300)]
    # an output written in place over its input: one range, moved as one
    assert relocations([(100, 16, 500), (104, 4, 504)]) == [(100, 16, 500)]
    assert relocations([(100, 16, 500), (104, 4, 600)]) is None      # they parted
    assert relocations([(100, 8, 500), (200, 8, 504)]) is None       # they meet now
    assert relocations([(100, 0, 100), (100, 0, 100)]) == []          # empty buffers at one address


def _failing_on(stack, nth):
    """The runtime's ``nth`` next launch raises, as a device fault would."""
    from fornax.layers.errors import FornaxError
    real, seen = stack.runtime.launch, [0]

    def launch(*args, **kwargs):
        seen[0] += 1
        if seen[0] == nth:
            raise FornaxError("injected launch failure", seam="runtime")
        return real(*args, **kwargs)
    stack.runtime.launch = launch


@pytest.mark.parametrize("workload, nth", [("mlp", 1), ("mlp", 2), ("block", 3), ("block", 7)])
def test_a_replay_that_fails_leaves_what_a_live_run_that_fails_leaves(workload, nth):
    """The library's call log up to the failing call, and no temporary held."""
    from fornax.layers.errors import FornaxError
    from fornax.scenarios.workloads import transformer_block
    graph, feeds = (mlp(5, batch=8, d_in=32, hidden=48, d_out=16) if workload == "mlp"
                    else transformer_block(0))
    state = []
    for replay in (True, False):
        stack = compose(make_config("cuda-like", replay=replay))   # GEMMs are library calls
        plan, (a,) = _plan_and_buffers(stack, graph, feeds, 1)
        for _ in range(2):
            _call(stack, plan, graph, feeds, *a)
        before = len(stack.library.calls)
        _failing_on(stack, nth)
        with pytest.raises(FornaxError, match="injected"):
            plan(*a)
        assert plan.last_run == ("replayed" if replay else "live")
        stack.runtime.synchronize()
        alloc = stack.runtime._allocators[0]
        state.append((len(stack.library.calls) - before, [c.routine for c in stack.library.calls],
                      alloc.stats["allocated_bytes"], len(alloc.active)))
    assert state[0] == state[1]
    if workload == "mlp":      # the first GEMM ran (and was logged) before a later launch failed
        assert state[0][0] == (nth > 1)
