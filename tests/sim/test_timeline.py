"""The device timeline: semaphores, in-order queues, cross-queue waits, hangs, failures."""

import threading

import pytest

from fornax.sim.faults import DeviceHang, PageFault, SimError
from fornax.sim.timeline import Packet, Semaphore, Timeline


def work(duration, log=None, tag=None):
    def run():
        if log is not None:
            log.append(tag)
        return duration
    return run


def records_by_label(tl):
    return {r.label: r for r in tl.records}


def run_bounded(fn, seconds=10.0):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not return."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:          # noqa: BLE001 - handed back to the test
            box["error"] = exc
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the call hung"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def test_semaphore_is_monotonic():
    s = Semaphore("s")
    assert s.value == 0 and s.reached_at(0) == 0.0 and s.reached_at(1) is None
    s.signal(3, at=1.5)
    s.signal(3, at=2.0)                       # same value again is fine
    assert s.value == 3
    with pytest.raises(ValueError, match="monotonic"):
        s.signal(2, at=3.0)
    assert s.value == 3
    with pytest.raises(ValueError):
        s.signal(1 << 64, at=3.0)
    with pytest.raises(ValueError):
        s.signal(-1, at=3.0)
    s.signal((1 << 64) - 1, at=4.0)
    assert s.value == (1 << 64) - 1
    assert s.reached_at(1) == 1.5 and s.reached_at(3) == 1.5 and s.reached_at(4) == 4.0


def test_packets_on_one_queue_run_in_order():
    tl = Timeline(copy_engines=2)
    q = tl.create_queue()
    log = []
    done = Semaphore()
    for i, d in enumerate([1.0, 2.0, 3.0]):
        q.submit(Packet("compute", work(d, log, i), label=f"p{i}",
                        signals=[(done, i + 1)]))
    tl.wait(done, 3)
    assert log == [0, 1, 2]
    r = records_by_label(tl)
    assert (r["p0"].start, r["p0"].end) == (0.0, 1.0)
    assert (r["p1"].start, r["p1"].end) == (1.0, 3.0)
    assert (r["p2"].start, r["p2"].end) == (3.0, 6.0)
    assert tl.host_time == 6.0
    assert done.reached_at(1) == 1.0 and done.reached_at(2) == 3.0


def test_copy_packets_in_one_queue_stay_in_order_across_engines():
    tl = Timeline(copy_engines=2)
    q = tl.create_queue()
    for i in range(3):
        q.submit(Packet("copy", work(1.0), label=f"c{i}"))
    tl.drain()
    r = records_by_label(tl)
    assert r["c1"].start >= r["c0"].end and r["c2"].start >= r["c1"].end


def test_cross_queue_wait_starts_after_signal():
    tl = Timeline()
    consumer_q = tl.create_queue("consumer")     # created (and submitted) first on purpose
    producer_q = tl.create_queue("producer")
    ready, finished = Semaphore("ready"), Semaphore("finished")
    log = []
    consumer_q.submit(Packet("compute", work(1.0, log, "consumer"), label="consumer",
                             waits=[(ready, 1)], signals=[(finished, 1)]))
    producer_q.submit(Packet("copy", work(5.0, log, "producer"), label="producer",
                             signals=[(ready, 1)]))
    tl.wait(finished, 1)
    r = records_by_label(tl)
    assert log == ["producer", "consumer"]
    assert r["producer"].end == 5.0
    assert r["consumer"].start >= r["producer"].end
    assert r["consumer"].end == r["consumer"].start + 1.0
    assert tl.host_time == r["consumer"].end


def test_independent_queues_overlap_on_different_engines():
    tl = Timeline(copy_engines=1)
    qa, qb = tl.create_queue(), tl.create_queue()
    qa.submit(Packet("compute", work(4.0), label="k"))
    qb.submit(Packet("copy", work(4.0), label="c"))
    tl.drain()
    r = records_by_label(tl)
    assert r["k"].start == 0.0 and r["c"].start == 0.0
    assert tl.busy_time == 4.0


def test_unsatisfiable_wait_raises_device_hang():
    tl = Timeline()
    q = tl.create_queue()
    never, out = Semaphore("never"), Semaphore("out")
    ran = []
    q.submit(Packet("compute", work(1.0, ran, "x"), waits=[(never, 1)], signals=[(out, 1)]))
    with pytest.raises(DeviceHang) as info:
        run_bounded(lambda: tl.wait(out, 1))
    assert "out" in str(info.value)
    assert ran == []
    with pytest.raises(DeviceHang):
        run_bounded(tl.drain)
    # waiting on a semaphore nothing at all signals
    with pytest.raises(DeviceHang):
        run_bounded(lambda: Timeline().wait(Semaphore(), 1))


def test_wait_for_higher_value_than_signalled_hangs():
    tl = Timeline()
    q = tl.create_queue()
    s = Semaphore()
    q.submit(Packet("compute", work(1.0), signals=[(s, 1)]))
    with pytest.raises(DeviceHang):
        run_bounded(lambda: tl.wait(s, 2))
    assert s.value == 1


def test_failed_work_fails_its_semaphores_and_host_wait_reraises():
    tl = Timeline()
    q, q2 = tl.create_queue(), tl.create_queue()
    s, later, dependent = Semaphore("s"), Semaphore("later"), Semaphore("dependent")
    fault = PageFault(0xDEAD000, "read", 1, "test fault")
    ran = []

    def bad():
        raise fault
    q.submit(Packet("compute", bad, label="bad", signals=[(s, 1)]))
    q.submit(Packet("compute", work(1.0, ran, "after"), label="after", signals=[(later, 1)]))
    q2.submit(Packet("compute", work(1.0, ran, "dep"), label="dep", waits=[(s, 1)],
                     signals=[(dependent, 1)]))
    with pytest.raises(PageFault) as info:
        tl.wait(s, 1)
    assert info.value is fault
    assert s.failure is fault
    # the failure travels: the next packet on the queue and a waiter on another queue
    with pytest.raises(PageFault):
        tl.wait(later, 1)
    with pytest.raises(PageFault):
        tl.wait(dependent, 1)
    assert ran == []                             # their work never ran
    r = records_by_label(tl)
    assert r["bad"].error is not None and "0xdead000" in r["bad"].error


def test_host_time_advances_to_signal_time():
    tl = Timeline()
    q = tl.create_queue()
    s = Semaphore()
    q.submit(Packet("compute", work(2.5), signals=[(s, 1)]))
    q.submit(Packet("compute", work(4.0), signals=[(s, 2)]))
    assert tl.host_time == 0.0                   # submission is asynchronous
    tl.wait(s, 1)
    assert tl.host_time == 2.5
    tl.wait(s, 2)
    assert tl.host_time == 6.5
    tl.wait(s, 1)                                # an old value never moves time back
    assert tl.host_time == 6.5
    # work submitted now cannot start before the host submitted it
    q2 = tl.create_queue()
    q2.submit(Packet("copy", work(1.0), label="late"))
    tl.drain()
    assert records_by_label(tl)["late"].start == 6.5
    assert tl.host_time == 7.5


def test_lower_late_signal_never_rolls_back():
    tl = Timeline()
    q1, q2 = tl.create_queue(), tl.create_queue()
    s = Semaphore()
    q1.submit(Packet("compute", work(1.0), signals=[(s, 5)]))
    q2.submit(Packet("copy", work(3.0), signals=[(s, 2)]))
    tl.drain()
    assert s.value == 5


def test_sim_error_subclass_catchable_as_sim_error():
    assert issubclass(DeviceHang, SimError) and issubclass(PageFault, SimError)
