"""The race detector's shadow-memory history finds exactly the races a detector that keeps
every access finds, and stays linear in a long loop of overlapping strided writes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fornax.sim.intervals import IntervalMap
from fornax.sim.race import RaceDetector


class Rec:
    """A stand-in for a timeline Record (what a report describes)."""

    def __init__(self, i):
        self.label, self.kind, self.engine, self.start, self.end = f"p{i}", "kernel", "compute", i, i + 1


ranges = st.tuples(st.integers(0, 60), st.integers(1, 30)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ranges, ranges, st.integers(0, 60))), st.lists(ranges))
def test_interval_map_is_the_latest_paint_per_point(paints, clears):
    m, truth = IntervalMap(), {}
    for k, ((lo, hi), _, _) in enumerate(paints):
        m.assign(lo, hi, k)
        truth.update({x: k for x in range(lo, hi)})
    for lo, hi in clears:
        m.assign(lo, hi, None)
        for x in range(lo, hi):
            truth.pop(x, None)
    got = {x: v for lo, hi, v in m.overlapping(0, 200) for x in range(lo, hi)}
    assert got == truth
    pieces = list(m.overlapping(0, 200))
    assert all(a[1] <= b[0] for a, b in zip(pieces, pieces[1:]))          # disjoint, sorted
    for lo, hi in clears:
        want = {v for x, v in truth.items() if lo <= x < hi}
        assert {v for _, _, v in m.overlapping(lo, hi)} == want


packet = st.tuples(st.integers(0, 2),                         # queue
                   st.lists(st.integers(0, 40), max_size=2),  # waits on earlier packets (by index mod n)
                   st.sampled_from(["no", "join", "prune"]),  # host syncs with everything first
                   st.lists(ranges, max_size=2), st.lists(ranges, max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.lists(packet, min_size=1, max_size=30), st.integers(1, 8))
def test_shadow_history_flags_the_same_packets_as_keeping_every_access(packets, pending):
    """Also with a queue's unpainted packets painted after a few (``MAX_PENDING``) and with
    the history pruned at host syncs: the lazy painting never changes a verdict."""
    det, flagged = RaceDetector(), set()
    det.MAX_PENDING = pending
    report = det._report

    def spy(old, new, lo, hi):
        flagged.add(new.record.label)
        report(old, new, lo, hi)
    det._report = spy
    history, clocks, truth = [], [], set()
    for i, (q, waits, sync, reads, writes) in enumerate(packets):
        if sync != "no":
            det.host_join_all()
        if sync == "prune":
            det.prune()
        carried = det.host_event()
        clock = det.start_packet(q, carried, [clocks[w % len(clocks)] for w in waits] if clocks else [])
        clocks.append(dict(clock))
        rec = Rec(i)
        accs = [(lo, hi, "read") for lo, hi in reads] + [(lo, hi, "write") for lo, hi in writes]
        for lo, hi, mode in accs:
            for (olo, ohi, omode, oq, oepoch) in history:
                if oq != q and olo < hi and lo < ohi and "write" in (mode, omode) and oepoch > clock.get(oq, 0):
                    truth.add(rec.label)
        history += [(lo, hi, mode, q, clock[q]) for lo, hi, mode in accs]
        det.observe(rec, clock, q, f"q{q}", [(lo, hi, "x") for lo, hi in reads], [(lo, hi, "y") for lo, hi in writes])
    assert flagged == truth


def test_a_long_loop_of_overlapping_strided_writes_stays_linear(monkeypatch):
    """Each write of a row of a (5, N, 3) tensor spans most of the buffer, so every write
    overlaps every earlier one; the old history compared each with all of them (quadratic).
    Counted: the history pieces the checks visit, on two queues that keep syncing."""
    visited = [0]
    plain = IntervalMap.overlapping

    def counting(self, lo, hi):
        for piece in plain(self, lo, hi):
            visited[0] += 1
            yield piece
    monkeypatch.setattr(IntervalMap, "overlapping", counting)

    def run(n):
        det, visited[0] = RaceDetector(), 0
        for i in range(n):
            q = i % 2
            det.host_join_all()                          # ordered: no race, only history to search
            clock = det.start_packet(q, det.host_event(), [])
            lo = ((i * 7) % 2000) * 12
            det.observe(Rec(i), clock, q, f"q{q}", reads=[(i * 12, i * 12 + 4 * 24000 + 12, "src")],
                        writes=[(lo, lo + 4 * 24000 + 12, "dst")])
        assert det.races_total == 0
        return visited[0]
    small, big = run(1000), run(4000)
    assert small >= 1000                 # the checks did search the history
    assert big <= 6 * small             # linear (4x) with slack, where the old history was 16x
