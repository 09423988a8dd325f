"""Memory effects land at a packet's end time, and the happens-before race detector."""

import numpy as np

from fornax.sim.memory import DeviceMemory
from fornax.sim.race import HOST, RaceDetector, join
from fornax.sim.timeline import Packet, Semaphore, Timeline

F32 = np.dtype(np.float32)


def setup():
    tl = Timeline(copy_engines=2)
    mem = DeviceMemory(1 << 24, 4096)
    space = mem.create_space()
    return tl, space


def writer(tl, space, va, values, duration, name="dst"):
    """Work that stores ``values`` at ``va`` (element scatter, like a kernel's store)."""
    values = np.asarray(values, F32)

    def run():
        space.scatter(va + 4 * np.arange(values.size, dtype=np.int64), values)
        tl.annotate(writes=[(va, va + values.nbytes, name)])
        return duration
    return run


def reader(tl, space, va, n, out, duration, name="src"):
    """Work that loads ``n`` floats at ``va`` into the host list ``out`` (like a copy)."""
    def run():
        out.append(np.frombuffer(space.read(va, 4 * n), F32).copy())
        tl.annotate(reads=[(va, va + 4 * n, name)])
        return duration
    return run


def fill(space, va, values):
    space.write(va, np.asarray(values, F32).tobytes())


def host_read(space, va, n):
    return np.frombuffer(space.read(va, 4 * n), F32)


def test_an_overlapping_reader_sees_old_data_and_a_dependent_one_new_data():
    tl, space = setup()
    m = space.map(4096)
    fill(space, m.va, [1, 2, 3, 4])
    qa, qb, qc = tl.create_queue("a"), tl.create_queue("b"), tl.create_queue("c")
    done = Semaphore("done")
    seen_overlap, seen_after = [], []
    qa.submit(Packet("compute", writer(tl, space, m.va, [10, 20, 30, 40], 5.0), label="w",
                     signals=[(done, 1)]))
    qb.submit(Packet("copy", reader(tl, space, m.va, 4, seen_overlap, 1.0), label="r-free", kind="copy"))
    qc.submit(Packet("copy", reader(tl, space, m.va, 4, seen_after, 1.0), label="r-dep", kind="copy",
                     waits=[(done, 1)]))
    tl.drain()
    r = {rec.label: rec for rec in tl.records}
    assert r["r-free"].start < r["w"].end                       # really overlapped
    np.testing.assert_array_equal(seen_overlap[0], [1, 2, 3, 4])   # the old contents
    assert r["r-dep"].start >= r["w"].end
    np.testing.assert_array_equal(seen_after[0], [10, 20, 30, 40])
    np.testing.assert_array_equal(host_read(space, m.va, 4), [10, 20, 30, 40])
    # one race: the unordered reader; the dependent one is ordered by the semaphore
    assert len(tl.races) == 1
    race = tl.races[0]
    assert race.kind == "read-write"
    assert {race.first.record.label, race.second.record.label} == {"w", "r-free"}
    assert (race.lo, race.hi) == (m.va, m.va + 16)


def test_host_sees_writes_only_once_simulated_time_passes_the_end():
    tl, space = setup()
    m = space.map(4096)
    fill(space, m.va, [0, 0])
    q = tl.create_queue()
    s = Semaphore()
    q.submit(Packet("compute", writer(tl, space, m.va, [7, 8], 2.0), signals=[(s, 1)]))
    q.submit(Packet("compute", writer(tl, space, m.va, [9, 9], 3.0), signals=[(s, 2)]))
    np.testing.assert_array_equal(host_read(space, m.va, 2), [0, 0])     # nothing ran yet
    tl.wait(s, 1)
    assert tl.host_time == 2.0
    np.testing.assert_array_equal(host_read(space, m.va, 2), [7, 8])
    tl.wait(s, 2)
    np.testing.assert_array_equal(host_read(space, m.va, 2), [9, 9])
    assert tl.races == []                                       # one in-order queue


def test_a_packet_that_starts_before_the_host_time_never_reads_the_future():
    """The host waits on a writer only; a reader on another queue that started earlier,
    in simulated time, must still read what memory held then."""
    tl, space = setup()
    m = space.map(4096)
    fill(space, m.va, [5])
    qa, qb = tl.create_queue("a"), tl.create_queue("b")
    s = Semaphore()
    seen = []
    qb.submit(Packet("copy", lambda: 2.0, label="delay", kind="copy"))
    qb.submit(Packet("copy", reader(tl, space, m.va, 1, seen, 1.0), label="late-reader", kind="copy"))
    qa.submit(Packet("compute", writer(tl, space, m.va, [6], 10.0), label="w", signals=[(s, 1)]))
    tl.wait(s, 1)
    np.testing.assert_array_equal(host_read(space, m.va, 1), [6])
    tl.drain()
    assert {r.label: r for r in tl.records}["late-reader"].start == 2.0
    np.testing.assert_array_equal(seen[0], [5])


def test_happens_before_is_transitive_through_a_chain_of_queues():
    tl, space = setup()
    m = space.map(4096)
    q1, q2, q3 = tl.create_queue(), tl.create_queue(), tl.create_queue()
    s1, s2 = Semaphore("s1"), Semaphore("s2")
    seen = []
    q1.submit(Packet("compute", writer(tl, space, m.va, [1, 1], 1.0), label="w", signals=[(s1, 1)]))
    q2.submit(Packet("copy", lambda: 1.0, label="relay", waits=[(s1, 1)], signals=[(s2, 1)]))
    q3.submit(Packet("copy", reader(tl, space, m.va, 2, seen, 1.0), label="r", waits=[(s2, 1)]))
    tl.drain()
    np.testing.assert_array_equal(seen[0], [1, 1])
    assert tl.races == []


def test_write_write_race_and_disjoint_or_adjacent_ranges_do_not_race():
    tl, space = setup()
    m = space.map(4096)
    qa, qb, qc = tl.create_queue("a"), tl.create_queue("b"), tl.create_queue("c")
    qa.submit(Packet("compute", writer(tl, space, m.va, [1] * 4, 1.0), label="wa"))
    qb.submit(Packet("copy", writer(tl, space, m.va + 8, [2] * 4, 1.0), label="wb"))   # overlaps 8 bytes
    qc.submit(Packet("copy", writer(tl, space, m.va + 24, [3] * 4, 1.0), label="wc"))  # adjacent to wb
    tl.drain()
    assert [(r.kind, r.lo - m.va, r.hi - m.va) for r in tl.races] == [("write-write", 8, 16)]
    labels = {tl.races[0].first.record.label, tl.races[0].second.record.label}
    assert labels == {"wa", "wb"}


def test_readers_never_race_with_each_other():
    tl, space = setup()
    m = space.map(4096)
    fill(space, m.va, [4, 4])
    outs = []
    for i in range(3):
        tl.create_queue().submit(Packet("copy", reader(tl, space, m.va, 2, outs, 1.0), label=f"r{i}"))
    tl.drain()
    assert tl.races == []
    assert all(np.array_equal(o, [4, 4]) for o in outs)


def test_host_synchronisation_orders_later_submissions():
    tl, space = setup()
    m = space.map(4096)
    qa, qb = tl.create_queue(), tl.create_queue()
    s = Semaphore()
    seen = []
    qa.submit(Packet("compute", writer(tl, space, m.va, [3], 1.0), label="w", signals=[(s, 1)]))
    tl.wait(s, 1)                                   # the host saw the writer complete ...
    qb.submit(Packet("copy", reader(tl, space, m.va, 1, seen, 1.0), label="r"))   # ... then submits
    tl.drain()
    np.testing.assert_array_equal(seen[0], [3])
    assert tl.races == []


def test_the_access_history_is_dropped_once_the_host_has_seen_everything():
    tl, space = setup()
    m = space.map(4096)
    q = tl.create_queue()
    for i in range(50):
        q.submit(Packet("compute", writer(tl, space, m.va + 4 * (i % 7), [i], 1.0)))
    tl.drain()
    assert tl.race_detector.live == 0
    assert tl.races == []


def test_vector_clock_join_and_ordering_rules():
    a = {0: 3, HOST: 1}
    join(a, {0: 2, 1: 5})
    assert a == {0: 3, 1: 5, HOST: 1}
    rd = RaceDetector()
    c1 = rd.start_packet(0, rd.host_event(), [])
    c2 = rd.start_packet(1, rd.host_event(), [])
    c3 = rd.start_packet(1, {}, [c1])              # waits on queue 0's first packet
    assert c1[0] == 1 and c2.get(0, 0) == 0 and c3[0] == 1 and c3[1] == 2
