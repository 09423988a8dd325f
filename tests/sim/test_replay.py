"""Record and replay (fornax.sim.replay): a replayed launch is indistinguishable from a
plain run -- same memory, same counters (ranges rebased on the buffers), same faults --
and kernels whose addresses depend on loaded data are never recorded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fornax.layers import codegen
from fornax.layers.graph import DType, Graph
from fornax.sim import execute as ex
from fornax.sim import isa
from fornax.sim import replay as rp
from fornax.sim.device import Device
from fornax.sim.faults import MisalignedAddress, PageFault
from fornax.sim.isa import Arange, Binary, Const, Load, Param, Program, ProgramId, ScalarArg, Store, Unary
from fornax.sim.replay import ReplayCache
from fornax.sim.spec import load_spec
from fornax.sim.timeline import Semaphore
from fornax.stack import compose, make_config

BLOCK = 128


def ragged_program() -> Program:
    """out[i] = x[i] * x[i] + relu(y[i]) for i < n (a masked tail)."""
    return isa.verify(Program("ragged", (Param("x", "ptr", "float32"), Param("y", "ptr", "float32"),
                                         Param("out", "ptr", "float32"), Param("n", "scalar", "int64")), (
        ProgramId("%pid"), Const("%bs", BLOCK, "int64"), Binary("%base", "mul", "%pid", "%bs"),
        Arange("%lane", BLOCK), Binary("%i", "add", "%base", "%lane"), ScalarArg("%n", "n"),
        Binary("%m", "lt", "%i", "%n"), Load("%x", "x", "%i", "%m"), Load("%y", "y", "%i", "%m"),
        Binary("%xx", "mul", "%x", "%x"), Unary("%ry", "relu", "%y"), Binary("%r", "add", "%xx", "%ry"),
        Store("out", "%i", "%r", "%m"))))


def gather_program() -> Program:
    """out[i] = x[idx[i]]: the load's offsets come from memory (never recordable)."""
    return isa.verify(Program("gather", (Param("idx", "ptr", "int64"), Param("x", "ptr", "float32"),
                                         Param("out", "ptr", "float32")), (
        Arange("%i", 16), Load("%j", "idx", "%i"), Load("%v", "x", "%j"), Store("out", "%i", "%v"))))


def reduce_program() -> Program:
    """store_reduce: each instance sums its block into out[pid % 3]."""
    return isa.verify(Program("bucket_sum", (Param("x", "ptr", "float32"), Param("out", "ptr", "float32")), (
        ProgramId("%p"), Const("%B", 32, "int64"), Binary("%base", "mul", "%p", "%B"), Arange("%r", 32),
        Binary("%o", "add", "%base", "%r"), Load("%v", "x", "%o"), Const("%three", 3, "int64"),
        Binary("%bucket", "mod", "%p", "%three"), isa.StoreReduce("out", "%bucket", "%v", "sum"))))


class Buffers:
    """One device space; a kernel's buffers are made fresh (new addresses) for every launch."""

    def __init__(self):
        self.space = Device(load_spec("tiny")).memory.create_space()

    def put(self, arr: np.ndarray) -> int:
        m = self.space.map(max(1, arr.nbytes))
        self.space.write(m.va, np.ascontiguousarray(arr).tobytes())
        return m.va

    def get(self, va: int, n: int, dtype) -> np.ndarray:
        return np.frombuffer(self.space.read(va, n * np.dtype(dtype).itemsize), dtype).copy()


def launches(program, grid, make_args, outputs, cache, times=4):
    """Run ``program`` ``times`` times on fresh buffers with the recordings ``cache``; per
    launch: (outputs, counters with ranges made relative to the launch's pointers)."""
    bufs, seen = Buffers(), []
    for t in range(times):
        args = make_args(bufs, t)
        c = ex.execute(program, grid, args, bufs.space, cache)
        rel = {k: (lo - args[k], hi - args[k]) for k, (lo, hi) in c.read_ranges.items()}
        rel_w = {k: (lo - args[k], hi - args[k]) for k, (lo, hi) in c.write_ranges.items()}
        outs = [bufs.get(args[name], n, dt) for name, n, dt in outputs]
        seen.append((outs, (c.instances, list(c.matrix_flops.items()), list(c.vector_flops.items()),
                            c.bytes_read, c.bytes_written, c.instructions, list(rel.items()),
                            list(rel_w.items()))))
    return seen


def assert_same(a, b):
    assert len(a) == len(b)
    for (outs_a, counts_a), (outs_b, counts_b) in zip(a, b):
        for x, y in zip(outs_a, outs_b):
            assert x.tobytes() == y.tobytes()          # bit for bit
        assert counts_a == counts_b


def ragged_case(n=1000):
    def make(bufs, t):
        rng = np.random.default_rng(t)
        return {"x": bufs.put(rng.standard_normal(n).astype(np.float32)),
                "y": bufs.put(rng.standard_normal(n).astype(np.float32)),
                "out": bufs.put(np.full(n + 8, 7.0, np.float32)), "n": n}
    return ragged_program(), (math.ceil(n / BLOCK), 1, 1), make, [("out", n + 8, np.float32)]


def gemm_case(m=37, n=53, k=29):
    prog, _ = codegen.gemm_kernel("gemm_dyn", DType.FLOAT32, "m", "n", "k", 2, False, (16, 16, 16), 64)
    grid = (math.ceil(n / 16), math.ceil(m / 16), 2)

    def make(bufs, t):
        rng = np.random.default_rng(10 + t)
        return {"a": bufs.put(rng.standard_normal((2, m, k)).astype(np.float32)),
                "b": bufs.put(rng.standard_normal((k, n)).astype(np.float32)),
                "c": bufs.put(np.zeros((2, m, n), np.float32)), "m": m, "n": n, "k": k}
    return prog, grid, make, [("c", 2 * m * n, np.float32)]


def reduce_case():
    def make(bufs, t):
        rng = np.random.default_rng(20 + t)
        return {"x": bufs.put(rng.standard_normal(32 * 7).astype(np.float32)),
                "out": bufs.put(np.array([1.0, 2.0, 3.0], np.float32))}
    return reduce_program(), (7, 1, 1), make, [("out", 3, np.float32)]


@pytest.mark.parametrize("case", [ragged_case, gemm_case, reduce_case], ids=["ragged", "gemm", "store_reduce"])
def test_replayed_launches_match_plain_runs_bit_for_bit(case):
    prog, grid, make, outputs = case()
    off, on = ReplayCache(0), ReplayCache()
    plain = launches(prog, grid, make, outputs, off)
    assert off.recordings(prog) == 0 and len(off) == 0
    prog2, *_ = case()                               # a fresh program object: nothing recorded yet
    replayed = launches(prog2, grid, make, outputs, on)
    assert on.recordings(prog2) == 1                 # recorded at the second launch, replayed after
    assert_same(plain, replayed)
    assert_same(plain, launches(prog, grid, make, outputs, None))     # the interpreter itself


def test_the_reference_numbers_hold_on_replay():
    prog, grid, make, outputs = ragged_case(1000)
    for (outs, counts), t in zip(launches(prog, grid, make, outputs, ReplayCache()), range(4)):
        rng = np.random.default_rng(t)
        x, y = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
        np.testing.assert_array_equal(outs[0][:1000], x * x + np.maximum(y, 0))
        np.testing.assert_array_equal(outs[0][1000:], 7.0)      # the masked tail is untouched
        assert counts[3:5] == (2 * 4 * 1000, 4 * 1000)          # only active lanes count


def test_a_new_scalar_value_gets_its_own_recording():
    prog, cache = ragged_program(), ReplayCache()
    bufs = Buffers()
    for n in (1000, 1000, 1000, 700, 700, 700):
        x = np.arange(1024, dtype=np.float32)
        args = {"x": bufs.put(x), "y": bufs.put(-x), "out": bufs.put(np.zeros(1024, np.float32)), "n": n}
        c = ex.execute(prog, (8, 1, 1), args, bufs.space, cache)
        out = bufs.get(args["out"], 1024, np.float32)
        np.testing.assert_array_equal(out[:n], x[:n] * x[:n])
        np.testing.assert_array_equal(out[n:], 0.0)
        assert c.bytes_written == 4 * n
    assert cache.recordings(prog) == 2


def gather_launches(replay: bool, bad_at: int | None = None):
    """gather_program on fresh data each launch: the indices (and so the range of x read)
    change every time; ``bad_at``: that launch's last index runs past x (a page fault)."""
    cache = ReplayCache(None if replay else 0)
    prog, bufs, seen = gather_program(), Buffers(), []
    for t in range(5):
        idx = np.random.default_rng(t).integers(t, 10 + 3 * t, 16).astype(np.int64)
        if t == bad_at:
            idx[-1] = 40000
        x = np.arange(32, dtype=np.float32) * 10
        args = {"idx": bufs.put(idx), "x": bufs.put(x), "out": bufs.put(np.zeros(16, np.float32))}
        if t == bad_at:
            seen.append(_fault(lambda: ex.execute(prog, (1, 1, 1), args, bufs.space, cache)))
            continue
        c = ex.execute(prog, (1, 1, 1), args, bufs.space, cache)
        out = bufs.get(args["out"], 16, np.float32)
        np.testing.assert_array_equal(out, x[idx])
        assert c.read_ranges["x"] == (args["x"] + 4 * int(idx.min()), args["x"] + 4 * int(idx.max()) + 4)
        seen.append((out.tobytes(), [(k, lo - args[k], hi - args[k]) for k, (lo, hi) in c.read_ranges.items()],
                     [(k, lo - args[k], hi - args[k]) for k, (lo, hi) in c.write_ranges.items()],
                     c.bytes_read, c.bytes_written, c.instructions, list(c.vector_flops.items())))
    return seen, cache.recordings(prog)


@pytest.mark.parametrize("bad_at", [None, 3])
def test_data_dependent_addresses_replay_with_their_range_counted_live(bad_at):
    """A load at offsets read from memory replays the general way: its values, the range it
    read and any fault follow each launch's data exactly as in a plain run."""
    (plain, none), (replayed, held) = (gather_launches(r, bad_at) for r in (False, True))
    assert none == 0 and held == 1
    assert replayed == plain
    if bad_at is None:
        assert len({entry[1][1] for entry in plain}) == len(plain)    # a different range every launch


def masked_by_data_program() -> Program:
    """out[i] = x[i] where m[i] > 0: the mask comes from memory."""
    return isa.verify(Program("masked_by_data", (Param("m", "ptr", "int64"), Param("x", "ptr", "float32"),
                                                  Param("out", "ptr", "float32")), (
        Arange("%i", 16), Load("%m", "m", "%i"), Const("%z", 0, "int64"), Binary("%on", "gt", "%m", "%z"),
        Load("%v", "x", "%i", "%on"), Store("out", "%i", "%v", "%on"))))


def scatter_add_program() -> Program:
    """out[m[i]] += x[i]: the store_reduce targets come from memory."""
    return isa.verify(Program("scatter_add", (Param("m", "ptr", "int64"), Param("x", "ptr", "float32"),
                                              Param("out", "ptr", "float32")), (
        Arange("%i", 16), Load("%m", "m", "%i"), Load("%v", "x", "%i"), isa.StoreReduce("out", "%m", "%v"))))


def test_data_dependent_masks_and_reduction_targets_are_never_recorded():
    """What a masked access or a store_reduce counts depends on the data there: not replayable."""
    masked, scatter_add = masked_by_data_program(), scatter_add_program()
    bufs, cache = Buffers(), ReplayCache()
    for t in range(4):
        m = np.random.default_rng(t).integers(0, 4, 16).astype(np.int64)
        x = np.arange(16, dtype=np.float32)
        a = {"m": bufs.put(m), "x": bufs.put(x), "out": bufs.put(np.zeros(16, np.float32))}
        c = ex.execute(masked, (1, 1, 1), a, bufs.space, cache)
        np.testing.assert_array_equal(bufs.get(a["out"], 16, np.float32), np.where(m > 0, x, 0))
        assert c.bytes_written == 4 * int((m > 0).sum())
        b = {"m": bufs.put(m), "x": bufs.put(x), "out": bufs.put(np.zeros(16, np.float32))}
        ex.execute(scatter_add, (1, 1, 1), b, bufs.space, cache)
        np.testing.assert_array_equal(bufs.get(b["out"], 16, np.float32),
                                      np.bincount(m, weights=x, minlength=16).astype(np.float32))
    assert cache.recordings(masked) == 0 and cache.recordings(scatter_add) == 0 and len(cache) == 0


def _fault(fn):
    with pytest.raises((PageFault, MisalignedAddress)) as info:
        fn()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("damage", ["freed", "short", "misaligned"])
def test_a_replayed_launch_faults_exactly_like_a_plain_one(damage):
    def run(replay: bool):
        cache = ReplayCache(None if replay else 0)
        prog, grid, make, _ = ragged_case(1000)
        bufs = Buffers()
        for t in range(3):                     # the second launch records
            ex.execute(prog, grid, make(bufs, t), bufs.space, cache)
        args = make(bufs, 3)
        if damage == "freed":
            bufs.space.unmap(args["out"])
        elif damage == "short":
            args["y"] = bufs.put(np.zeros(500, np.float32))
        else:
            args["x"] += 2
        out = _fault(lambda: ex.execute(prog, grid, args, bufs.space, cache))
        return out, cache.recordings(prog)

    (plain, none), (replayed, held) = run(False), run(True)
    assert none == 0 and held == 1
    assert replayed == plain                  # same type, address and message (fresh devices)


def test_recordings_stay_within_their_byte_budget():
    cache = ReplayCache(40_000)                           # room for some of 12 recordings
    progs = [ragged_program() for _ in range(12)]
    _, grid, make, _ = ragged_case(1000)
    bufs = Buffers()
    for prog in progs:
        for t in range(2):
            ex.execute(prog, grid, make(bufs, t), bufs.space, cache)
    assert 0 < cache.nbytes <= 40_000
    held = [cache.recordings(p) for p in progs]
    assert 0 < sum(held) < len(progs) and held[-1] == 1      # the least recently used went first
    # an evicted program still runs correctly
    args = make(bufs, 9)
    ex.execute(progs[0], grid, args, bufs.space, cache)
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    np.testing.assert_array_equal(bufs.get(args["out"], 1000, np.float32), x * x + np.maximum(y, 0))


def test_a_kernel_too_large_to_record_runs_plainly():
    prog, grid, make, outputs = gemm_case()
    plain = launches(prog, grid, make, outputs, ReplayCache(0))
    small = ReplayCache(8 * 4096)                         # one recording may hold 4 KiB
    prog2, *_ = gemm_case()
    assert_same(plain, launches(prog2, grid, make, outputs, small))
    assert small.recordings(prog2) == 0 and len(small) == 0


def test_a_cache_forgets_a_program_that_is_gone_and_can_be_cleared():
    """Recordings are the owner's: they go with their program, or all at once with clear()."""
    import gc

    cache = ReplayCache()
    _, grid, make, outputs = ragged_case(300)
    keep, drop = ragged_program(), ragged_program()
    launches(keep, grid, make, outputs, cache, times=2)
    launches(drop, grid, make, outputs, cache, times=2)
    assert len(cache) == 2 and cache.recordings(keep) == cache.recordings(drop) == 1
    held = cache.nbytes
    del drop
    gc.collect()
    assert len(cache) == 1 and 0 < cache.nbytes < held and cache.recordings(keep) == 1
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.recordings(keep) == 0
    launches(keep, grid, make, outputs, cache, times=1)      # a first launch again: not recorded
    assert cache.recordings(keep) == 0


def test_a_stack_with_replay_matches_one_without(monkeypatch):
    """Through all the seams: the timeline, race reports and kernel log are the same."""
    def session(replay: bool):
        if not replay:
            monkeypatch.setattr(rp, "REPLAY_BYTES", 0)       # the devices' caches are made off
        st = compose(make_config("cuda-like", spec="tiny"))
        monkeypatch.undo()
        assert all((d.replays.limit > 0) == replay for d in st.devices)
        fw, rt = st.framework, st.runtime
        g = Graph("add")
        a, b = g.input("a", (64, 64), "float32"), g.input("b", (64, 64), "float32")
        g.output(g.op("add", a, b))
        plan = fw.compiler.compile(g, fw.target, fw.library.ops())
        mod, step = rt.load_module(plan.binary), plan.steps[0]
        p = [rt.malloc(64 * 64 * 4) for _ in range(3)]
        rt.memcpy_h2d(p[0], np.arange(4096, dtype=np.float32).reshape(64, 64))
        rt.memcpy_h2d(p[1], np.ones((64, 64), np.float32))
        s1, s2 = rt.default_stream(), rt.create_stream("non_blocking")
        for _ in range(4):            # in place, and a second stream racing with the first
            rt.launch(mod, step.entry, step.grid, dict(zip(step.args, (p[0], p[1], p[0]))), s1)
            rt.launch(mod, step.entry, step.grid, dict(zip(step.args, (p[1], p[1], p[2]))), s2)
        rt.synchronize()
        out = np.empty((64, 64), np.float32)
        rt.memcpy_d2h(out, p[0])
        rt.synchronize()
        assert (len(st.devices[0].replays) > 0) == replay
        tl = st.devices[0].timeline
        records = [(r.label, r.queue, r.start, r.end, r.reads, r.writes, r.args, r.clock) for r in tl.records]
        return out, records, [r.to_dict() for r in tl.races], st.driver.kernel_log, tl.busy_time

    plain, replayed = session(False), session(True)
    np.testing.assert_array_equal(plain[0], np.arange(4096, dtype=np.float32).reshape(64, 64) + 4)
    assert plain[0].tobytes() == replayed[0].tobytes()
    assert plain[1:] == replayed[1:]
    assert plain[2]                                   # the two streams did race


def test_semaphore_lookups_keep_their_meaning():
    s = Semaphore("s")
    for v, t in ((1, 1.0), (1, 2.0), (3, 3.0), (7, 4.0)):
        s.signal(v, t)
    assert [s.reached_at(v) for v in (0, 1, 2, 3, 4, 7, 8)] == [0.0, 1.0, 3.0, 3.0, 4.0, 4.0, None]
    s.fail(RuntimeError("boom"), 5.0)
    assert s.reached_at(8) == 5.0 and s.reached_at(Semaphore.MAX) == 5.0
