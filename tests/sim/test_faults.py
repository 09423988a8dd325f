"""Deterministic fault injection in the simulator: plans, triggers, and each kind's behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import scale_program
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.faults import (
    DeviceHang,
    DeviceLost,
    EccUncorrectable,
    FaultInjector,
    FaultPlan,
    FaultPlanError,
    FaultSpec,
    LinkFailure,
    PageFault,
    SimError,
)
from fornax.sim.spec import load_spec
from fornax.sim.timeline import Packet, Semaphore
from fornax.sim.topology import Topology

TINY = load_spec("tiny")


def triple() -> isa.Program:
    """dst[i] = src[i] * 3 for i < 64."""
    return scale_program()


def setup(plan: FaultPlan | None = None):
    dev = Device(TINY)
    space = dev.memory.create_space()
    src, dst = space.map(256), space.map(256)
    x = np.arange(64, dtype=np.float32) - 7
    space.write(src.va, x.tobytes())
    if plan is not None:
        dev.inject(plan)
    return dev, space, src.va, dst.va, x


def read(space, va) -> np.ndarray:
    return np.frombuffer(space.read(va, 256), dtype=np.float32).copy()


def kernel(dev, space, src, dst):
    return dev.run_kernel(space, triple(), (1, 1, 1), {"src": src, "dst": dst})


def hits(plan: FaultPlan, ops: list[str], device: int = 0) -> list[tuple]:
    inj = FaultInjector(plan, device)
    out = []
    for i, op in enumerate(ops):
        fault = inj.next(op, f"op{i}")
        out.append((i, None if fault is None else fault.kind))
    return [(r.kind, r.op, r.n) for r in inj.log], out


# -- plans and determinism ----------------------------------------------------------------
def test_same_seed_same_faults_different_seed_different_faults():
    specs = (FaultSpec("ecc_correctable", probability=0.3),
             FaultSpec("link_failure", probability=0.2),
             FaultSpec("hang", probability=0.05))
    ops = ["kernel", "copy", "kernel", "peer", "copy"] * 40
    a = hits(FaultPlan(specs, seed=11), ops)
    b = hits(FaultPlan(specs, seed=11), ops)
    c = hits(FaultPlan(specs, seed=12), ops)
    assert a == b
    assert a != c
    assert a[0], "a 200-operation plan with these probabilities fires"
    # the same plan on another device draws its own stream
    assert hits(FaultPlan(specs, seed=11), ops, device=1) != a


def test_probability_draws_follow_the_seeded_generator():
    """One draw per matching operation from default_rng([seed, device]): hit iff draw < p."""
    p, seed, n = 0.25, 2024, 300
    log, _ = hits(FaultPlan((FaultSpec("ecc_correctable", probability=p),), seed=seed),
                  ["kernel"] * n, device=3)
    draws = np.random.default_rng([seed, 3]).random(n)
    expected = [i + 1 for i in range(n) if draws[i] < p]
    assert [k for _, _, k in log] == expected
    assert 0 < len(expected) < n


def test_at_counts_only_operations_of_its_kind():
    plan = FaultPlan((FaultSpec("ecc_uncorrectable", at=3),                    # 3rd kernel
                      FaultSpec("link_failure", at=2)))                         # 2nd copy
    ops = ["copy", "kernel", "kernel", "copy", "kernel", "kernel", "copy"]
    log, out = hits(plan, ops)
    assert log == [("link_failure", "copy", 2), ("ecc_uncorrectable", "kernel", 3)]
    assert out[3] == (3, "link_failure") and out[4] == (4, "ecc_uncorrectable")
    assert [k for _, k in out].count(None) == 5


def test_a_peer_transfer_counts_as_a_copy_and_as_a_peer():
    log, _ = hits(FaultPlan((FaultSpec("link_failure", at=2, op="peer"),
                             FaultSpec("ecc_correctable", at=3, op="copy"))),
                  ["copy", "peer", "copy", "peer"])
    assert log == [("ecc_correctable", "copy", 3), ("link_failure", "peer", 2)]


@pytest.mark.parametrize("kwargs, words", [
    ({"kind": "meltdown", "at": 1}, "unknown fault kind"),
    ({"kind": "hang"}, "exactly one trigger"),
    ({"kind": "hang", "at": 1, "probability": 0.5}, "exactly one trigger"),
    ({"kind": "hang", "at": 0}, "at must be"),
    ({"kind": "hang", "probability": 1.5}, "probability must be"),
    ({"kind": "hang", "at": 1, "op": "copy"}, "cannot hit a 'copy'"),
    ({"kind": "page_fault", "at": 1, "address": -4}, "address must be"),
])
def test_malformed_specs_are_fault_plan_errors(kwargs, words):
    with pytest.raises(FaultPlanError) as exc:
        FaultSpec(**kwargs)
    assert words in str(exc.value)
    assert isinstance(exc.value, SimError)


def test_parse_reads_kind_at_n_lists():
    plan = FaultPlan.parse("hang@3, ecc_correctable,link_failure@2", seed=5)
    assert [(f.kind, f.at, f.op) for f in plan.faults] == [
        ("hang", 3, "kernel"), ("ecc_correctable", 1, "kernel"), ("link_failure", 2, "copy")]
    assert plan.seed == 5
    for bad in ("hang@", "hang@x", "@3", "hang@-1", "nonsense@1"):
        with pytest.raises(FaultPlanError):
            FaultPlan.parse(bad)


# -- each kind on the device ---------------------------------------------------------------
def test_correctable_ecc_is_counted_and_the_kernel_is_correct():
    dev, space, src, dst, x = setup(FaultPlan((FaultSpec("ecc_correctable", at=1),)))
    kernel(dev, space, src, dst)
    np.testing.assert_array_equal(read(space, dst), (x.astype(np.float64) * 3).astype(np.float32))
    assert dev.ecc_corrected == 1
    stats = dev.stats()
    assert stats["ecc_corrected"] == 1 and stats["lost"] is False
    assert stats["faults"] == [{"kind": "ecc_correctable", "op": "kernel", "n": 1, "label": "triple"}]
    kernel(dev, space, src, dst)                           # fires once only
    assert dev.ecc_corrected == 1


def test_uncorrectable_ecc_fails_the_kernel_before_it_writes():
    dev, space, src, dst, _ = setup(FaultPlan((FaultSpec("ecc_uncorrectable", at=2),)))
    kernel(dev, space, src, dst)                           # the first kernel runs
    space.write(dst, np.zeros(64, np.float32).tobytes())
    with pytest.raises(EccUncorrectable) as exc:
        kernel(dev, space, src, dst)
    assert exc.value.kind == "ecc_uncorrectable" and "kernel #2" in str(exc.value)
    np.testing.assert_array_equal(read(space, dst), np.zeros(64, np.float32))
    assert dev.kernels_executed == 1


def test_page_fault_names_its_address_and_context():
    dev, space, src, dst, _ = setup(FaultPlan((FaultSpec("page_fault", at=1, address=0xDEAD000),)))
    with pytest.raises(PageFault) as exc:
        kernel(dev, space, src, dst)
    assert exc.value.kind == "page_fault"
    assert exc.value.address == 0xDEAD000 and exc.value.context == space.context
    assert "0xdead000" in str(exc.value)


def test_hang_fires_the_watchdog_after_the_timeout_of_simulated_time():
    watchdog = 3.5
    dev, space, src, dst, _ = setup(FaultPlan((FaultSpec("hang", at=2),), watchdog_s=watchdog))
    tl = dev.timeline
    q = tl.create_queue("q")
    sem = Semaphore("s")
    for n in (1, 2, 3):
        q.submit(Packet("compute", lambda: kernel(dev, space, src, dst)[1].duration_s,
                        f"k{n}", "kernel", signals=[(sem, n)]))
    with pytest.raises(DeviceHang) as exc:
        tl.wait(sem, 3)
    assert exc.value.kind == "hang" and exc.value.elapsed_s == watchdog
    first, hung = tl.records
    assert first.error is None and hung.error is not None
    assert hung.start == pytest.approx(first.end)
    assert hung.end - hung.start == pytest.approx(watchdog)
    assert tl.host_time == pytest.approx(first.end + watchdog)   # the host waited it out
    tl.drain()
    after = tl.records[2]
    assert after.start == after.end == pytest.approx(hung.end)   # the failed queue skips it
    assert dev.kernels_executed == 1
    assert tl.busy_time == pytest.approx(first.end + watchdog)


def test_link_failure_stops_the_copy():
    dev, *_ = setup(FaultPlan((FaultSpec("link_failure", at=2),)))
    t1 = dev.copy_duration(4096, "h2d")
    with pytest.raises(LinkFailure) as exc:
        dev.copy_duration(4096, "d2h")
    assert exc.value.kind == "link_failure" and "copy #2" in str(exc.value)
    assert dev.bytes_copied == {"h2d": 4096, "d2h": 0, "d2d": 0}
    assert dev.copy_duration(4096, "h2d") == t1            # later copies work


def test_link_failure_on_a_peer_transfer():
    devs = [Device(TINY, i) for i in range(2)]
    Topology.build(TINY, 2).connect(devs)
    devs[0].inject(FaultPlan((FaultSpec("link_failure", at=1, op="peer"),)))
    with pytest.raises(LinkFailure) as exc:
        devs[0].peer_copy_duration(1 << 20, 1)
    assert "peer #1" in str(exc.value) and devs[0].peer_bytes == 0
    # the fabric is the alpha-beta model: latency + bytes / link bandwidth on a switch
    assert devs[0].peer_copy_duration(1 << 20, 1) == pytest.approx(
        TINY.peer_link_latency_s + (1 << 20) / TINY.peer_link_bandwidth)


def test_device_lost_fails_every_later_operation_until_reset():
    dev, space, src, dst, x = setup(FaultPlan((FaultSpec("device_lost", at=1),)))
    with pytest.raises(DeviceLost) as exc:
        kernel(dev, space, src, dst)
    assert exc.value.kind == "device_lost"
    assert dev.lost is exc.value and dev.stats()["lost"] is True
    with pytest.raises(DeviceLost):
        kernel(dev, space, src, dst)
    with pytest.raises(DeviceLost):
        dev.copy_duration(64, "h2d")
    q = dev.timeline.create_queue("failed")
    q.failure = exc.value
    q.submit(Packet("compute", lambda: 0.0, "stuck"))
    dev.reset()
    assert dev.lost is None and q.failure is None and not q.pending and dev.resets == 1
    kernel(dev, space, src, dst)                           # the plan fired at kernel #1 only
    np.testing.assert_array_equal(read(space, dst), (x.astype(np.float64) * 3).astype(np.float32))


def test_an_empty_plan_changes_nothing():
    runs = []
    for plan in (None, FaultPlan(), FaultPlan((FaultSpec("hang", probability=0.0),), seed=9)):
        dev, space, src, dst, _ = setup(plan)
        q = dev.timeline.create_queue("q")
        sem = Semaphore("s")
        for n in (1, 2):
            q.submit(Packet("compute", lambda: kernel(dev, space, src, dst)[1].duration_s,
                            "k", "kernel", signals=[(sem, 2 * n - 1)]))
            q.submit(Packet("copy", lambda: dev.copy_duration(256, "d2h"), "c", "copy",
                            signals=[(sem, 2 * n)]))
        dev.timeline.wait(sem, 4)
        runs.append((read(space, dst).tobytes(),
                     [(r.start, r.end, r.error) for r in dev.timeline.records],
                     dev.ecc_corrected, dev.kernels_executed))
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][3] == 2


def test_no_plan_means_no_injector():
    dev = Device(TINY)
    assert dev.injector is None
    inj = dev.inject(FaultPlan())
    assert dev.injector is inj
    dev.inject(None)
    assert dev.injector is None
