"""A writer on one queue and a reader on another, in every vendor family's own ordering
vocabulary: without the dependency the reader really reads the old contents and the
race detector names both commands; with it, fresh data and no race."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import FAMILIES, scale_program
from fornax import report as report_mod
from fornax.layers.compiler import Target
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import compose, get_vendor, make_config

N = 64
OLD = np.full(N, -7.0, np.float32)          # what the destination holds before the writer runs
SRC = np.arange(N, dtype=np.float32) + 1
NEW = SRC * 3                               # what the writer stores


def _program(name: str, factor: float) -> isa.Program:
    """dst[i] = src[i] * factor for i < N."""
    return scale_program(name, factor, N)


def setup(vendor: str):
    drv = get_vendor(vendor).driver([Device(load_spec("tiny"), 0)])
    ctx = drv.create_context(0)
    comp = get_vendor(vendor).compiler()
    props = drv.properties(0)
    fmt = next(f for f in comp.output_formats() if f in drv.loadable_formats(0))
    image = comp.emit([_program("scale3", 3.0), _program("readback", 1.0)],
                      Target(props.target, fmt, props.compute_units))
    module = drv.load_module(ctx, image)
    src, dst, out = (drv.allocate(ctx, 4 * N) for _ in range(3))
    q0 = drv.create_queue(ctx)
    q0.copy_h2d(src, SRC)
    q0.copy_h2d(dst, OLD)
    q0.copy_h2d(out, np.zeros(N, np.float32))
    q0.synchronize()                          # the old contents are in place, seen by the host
    return drv, ctx, module, src, dst, out


def races_of(drv):
    return [r for d in drv.devices for r in d.races]


def assert_race_names(race, writer_label: str, reader_label: str, dst: int, writer_q, reader_q):
    d = race.to_dict()
    sides = {d["first"]["label"]: d["first"], d["second"]["label"]: d["second"]}
    assert set(sides) == {writer_label, reader_label}
    assert sides[writer_label]["access"] == "write" and sides[reader_label]["access"] == "read"
    assert sides[writer_label]["queue"] == writer_q.hwq.id
    assert sides[reader_label]["queue"] == reader_q.hwq.id
    assert d["kind"] == "read-write"
    assert d["range"] == [dst, dst + 4 * N]
    assert sides[writer_label]["end_s"] > sides[writer_label]["start_s"]
    assert writer_label in d["message"] and reader_label in d["message"]


# -- stream / AQL queue / immediate command list: record + wait --------------------------------
@pytest.mark.parametrize("vendor", FAMILIES)
@pytest.mark.parametrize("ordered", [False, True])
def test_kernel_writer_and_copy_reader_on_two_queues(vendor, ordered):
    drv, ctx, module, src, dst, _out = setup(vendor)
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    qa.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    if ordered:
        qb.wait(qa.record())                  # cudaStreamWaitEvent / barrier-AND / event wait
    got = np.full(N, 99.0, np.float32)
    qb.copy_d2h(got, dst)
    qb.synchronize()
    qa.synchronize()
    recs = {r.label: r for r in drv.devices[0].timeline.records}
    if ordered:
        np.testing.assert_array_equal(got, NEW)
        assert races_of(drv) == []
        assert recs[f"d2h {4 * N}B"].start >= recs["scale3"].end
    else:
        assert recs[f"d2h {4 * N}B"].start < recs["scale3"].end      # they overlapped
        np.testing.assert_array_equal(got, OLD)                      # a real stale read
        (race,) = races_of(drv)
        assert_race_names(race, "scale3", f"d2h {4 * N}B", dst, qa, qb)
    # either way the writer's data is in memory once the host has waited for it
    final = np.zeros(N, np.float32)
    qa.copy_d2h(final, dst)
    qa.synchronize()
    np.testing.assert_array_equal(final, NEW)


def test_rocm_like_wait_is_a_barrier_and_packet_that_orders_the_reader():
    from fornax.vendors.rocm_like.driver import PACKET_TYPE_BARRIER_AND
    drv, ctx, module, src, dst, _out = setup("rocm-like")
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    qa.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    before = qb.write_index
    qb.wait(qa.record())
    assert qb.write_index == before + 1
    slot = before % qb.slots
    assert qb.ring[slot * 64] == PACKET_TYPE_BARRIER_AND
    got = np.zeros(N, np.float32)
    qb.copy_d2h(got, dst)
    qb.synchronize()
    np.testing.assert_array_equal(got, NEW)
    assert races_of(drv) == []
    assert any(r.label == "barrier-and" for r in drv.devices[0].timeline.records)


@pytest.mark.parametrize("vendor", FAMILIES)
@pytest.mark.parametrize("ordered", [False, True])
def test_copy_writer_and_kernel_reader_on_two_queues(vendor, ordered):
    drv, ctx, module, src, dst, out = setup(vendor)
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    qa.copy_h2d(src, np.full(N, 5.0, np.float32))            # overwrite the kernel's input
    if ordered:
        qb.wait(qa.record())
    qb.launch(module, "readback", (1, 1, 1), {"src": src, "dst": out})
    qb.synchronize()
    qa.synchronize()
    got = np.zeros(N, np.float32)
    qb.copy_d2h(got, out)
    qb.synchronize()
    if ordered:
        np.testing.assert_array_equal(got, np.full(N, 5.0, np.float32))
        assert races_of(drv) == []
    else:
        np.testing.assert_array_equal(got, SRC)                 # the input before the copy
        (race,) = races_of(drv)
        d = race.to_dict()
        assert {d["first"]["label"], d["second"]["label"]} == {f"h2d {4 * N}B", "readback"}
        assert d["range"] == [src, src + 4 * N]


# -- xpu-like regular command lists with pool events ------------------------------------------
@pytest.mark.parametrize("ordered", [False, True])
def test_xpu_like_regular_command_lists_with_pool_events(ordered):
    drv, ctx, module, src, dst, out = setup("xpu-like")
    pool = drv.create_event_pool(ctx, 2)
    ev = pool.event(0)
    # the reader's command queue exists first: with nothing ordering them, the device
    # is free to run the reader before the writer even though the host executed it later
    cq_read, cq_write = drv.create_command_queue(ctx), drv.create_command_queue(ctx)
    writer = drv.create_command_list(ctx)
    writer.append_launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst}, signal=ev)
    writer.close()
    reader = drv.create_command_list(ctx)
    reader.append_launch(module, "readback", (1, 1, 1), {"src": dst, "dst": out},
                         waits=(ev,) if ordered else ())
    reader.close()
    fw, fr = cq_write.create_fence(), cq_read.create_fence()
    cq_write.execute([writer], fw)
    cq_read.execute([reader], fr)
    fr.host_synchronize()
    fw.host_synchronize()
    got = np.zeros(N, np.float32)
    imm = drv.create_queue(ctx)
    imm.copy_d2h(got, out)
    imm.synchronize()
    if ordered:
        np.testing.assert_array_equal(got, NEW)
        assert races_of(drv) == []
    else:
        np.testing.assert_array_equal(got, OLD)
        (race,) = races_of(drv)
        assert_race_names(race, "scale3", "readback", dst, cq_write.lane, cq_read.lane)


# -- rules that hold in every family --------------------------------------------------------
@pytest.mark.parametrize("vendor", ["cuda-like", "xpu-like"])
def test_two_readers_never_race(vendor):
    drv, ctx, module, src, dst, out = setup(vendor)
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    qa.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    got = np.zeros(N, np.float32)
    qb.copy_d2h(got, src)
    qa.synchronize()
    qb.synchronize()
    np.testing.assert_array_equal(got, SRC)
    assert races_of(drv) == []


@pytest.mark.parametrize("vendor", ["cuda-like", "rocm-like"])
def test_write_after_write_race(vendor):
    drv, ctx, module, src, dst, out = setup(vendor)
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    qa.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    qb.copy_h2d(dst, np.zeros(N, np.float32))
    qa.synchronize()
    qb.synchronize()
    (race,) = races_of(drv)
    d = race.to_dict()
    assert d["kind"] == "write-write"
    assert {d["first"]["label"], d["second"]["label"]} == {"scale3", f"h2d {4 * N}B"}
    assert d["first"]["access"] == d["second"]["access"] == "write"


@pytest.mark.parametrize("vendor", FAMILIES)
def test_host_synchronisation_between_submits_is_happens_before(vendor):
    drv, ctx, module, src, dst, out = setup(vendor)
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    qa.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst})
    qa.synchronize()
    got = np.zeros(N, np.float32)
    qb.copy_d2h(got, dst)
    qb.copy_h2d(dst, OLD)                               # and a later write: ordered too
    qb.synchronize()
    np.testing.assert_array_equal(got, NEW)
    assert races_of(drv) == []


def test_a_composed_run_has_no_races_and_reports_the_list():
    stack = compose(make_config("cuda-like"))
    from fornax.scenarios.workloads import get_workload
    wl = get_workload("mlp")
    graph, feeds = wl.build(0)
    result = stack.run(graph, feeds)
    rep = report_mod.build(stack, wl.name, result)
    assert rep["races"] == []
    assert rep["seams"]["driver"]["races"] == []


def test_races_reach_the_run_report_and_its_rendering():
    from io import StringIO

    from rich.console import Console
    stack = compose(make_config("cuda-like", spec="tiny"))
    drv, rt = stack.driver, stack.runtime
    ctx = rt.context()
    qa, qb = drv.create_queue(ctx), drv.create_queue(ctx)
    buf = drv.allocate(ctx, 4 * N)
    qa.copy_h2d(buf, SRC)
    got = np.zeros(N, np.float32)
    qb.copy_d2h(got, buf)
    qa.synchronize()
    qb.synchronize()
    rep = report_mod.build(stack, "hand-made")
    (race,) = rep["races"]
    assert race["range"] == [buf, buf + 4 * N] and race["kind"] == "read-write"
    assert rep["seams"]["driver"]["races"] == rep["races"]
    text = StringIO()
    report_mod.render(rep, Console(file=text, width=200))
    assert "race" in text.getvalue() and f"d2h {4 * N}B" in text.getvalue()
