"""The executor's fast paths (fornax.sim.interpreter, fornax.sim.replay): loads and stores that index one mapping
directly, replayed accesses laid out as n-d boxes, data-dependent accesses in a replay, and
matrix products that skip an operand copy.  Each must give, bit for bit, the memory,
counters and errors of the general path it stands in for."""

from __future__ import annotations

import numpy as np
import pytest

from fornax.sim import execute as ex
from fornax.sim import isa
from fornax.sim import replay as rp
from fornax.sim.device import Device
from fornax.sim.interpreter import Interpreter
from fornax.sim.faults import MisalignedAddress, PageFault
from fornax.sim.isa import (Arange, Binary, Broadcast, Const, Dot, Load, Param, Program, ProgramId, Reshape,
                            Store)
from fornax.sim.lanes import Lanes, box_index, find_box, one_to_one
from fornax.sim.replay import ReplayCache
from fornax.sim.spec import load_spec
from helpers import FAMILIES

F32 = np.float32


class Buffers:
    """Each array 64 bytes into a mapping of its own (as in an allocator's pool), ending at
    the mapping's end."""

    def __init__(self):
        self.space = Device(load_spec("tiny")).memory.create_space()

    def put(self, arr: np.ndarray) -> int:
        m = self.space.map(64 + max(1, arr.nbytes))
        self.space.write(m.va + 64, np.ascontiguousarray(arr).tobytes())
        return m.va + 64

    def get(self, va: int, n: int, dtype) -> np.ndarray:
        return np.frombuffer(self.space.read(va, n * np.dtype(dtype).itemsize), dtype).copy()


def pointwise(name: str, params: tuple, block: int, body: tuple) -> Program:
    """A one-block-per-instance kernel: ``%i`` is the lane's global index."""
    head = (ProgramId("%pid"), Const("%bs", block, "int64"), Binary("%base", "mul", "%pid", "%bs"),
            Arange("%lane", block), Binary("%i", "add", "%base", "%lane"))
    return isa.verify(Program(name, params, head + body))


def const(name: str, value: int) -> Const:
    return Const(name, value, "int64")


R, C = 24, 40             # a 24 x 40 matrix: 960 elements, 4 blocks of 256 (the last one ragged)


def transpose_load() -> Program:
    """out (C x R) = x (R x C) transposed: a box load (strides 1 and C), a run store."""
    return pointwise("t_load", (Param("x", "ptr", "float32"), Param("out", "ptr", "float32")), 256, (
        const("%n", R * C), Binary("%m", "lt", "%i", "%n"), const("%R", R), const("%C", C),
        Binary("%c", "floordiv", "%i", "%R"), Binary("%r", "mod", "%i", "%R"),
        Binary("%rc", "mul", "%r", "%C"), Binary("%src", "add", "%rc", "%c"),
        Load("%v", "x", "%src", "%m"), Store("out", "%i", "%v", "%m")))


def transpose_store() -> Program:
    """The same transpose the other way round: a run load, a one-to-one box store."""
    return pointwise("t_store", (Param("x", "ptr", "float32"), Param("out", "ptr", "float32")), 320, (
        const("%C", C), const("%R", R),
        Binary("%r", "floordiv", "%i", "%C"), Binary("%c", "mod", "%i", "%C"),
        Binary("%cr", "mul", "%c", "%R"), Binary("%dst", "add", "%cr", "%r"),
        Load("%v", "x", "%i"), Store("out", "%dst", "%v")))


def bias_add() -> Program:
    """out[i] = x[i] + b[i % C]: the bias load repeats its elements (a box with stride 0)."""
    return pointwise("bias", (Param("x", "ptr", "float32"), Param("b", "ptr", "float32"),
                              Param("out", "ptr", "float32")), 320, (
        const("%C", C), Binary("%col", "mod", "%i", "%C"), Load("%x", "x", "%i"), Load("%b", "b", "%col"),
        Binary("%y", "add", "%x", "%b"), Store("out", "%i", "%y")))


def reverse() -> Program:
    """out[N-1-i] = 2 * x[N-1-i] with lanes walking backwards: negative strides."""
    return pointwise("rev", (Param("x", "ptr", "float32"), Param("out", "ptr", "float32")), 320, (
        const("%last", R * C - 1), Binary("%j", "sub", "%last", "%i"), Load("%v", "x", "%j"),
        Binary("%w", "add", "%v", "%v"), Store("out", "%j", "%w")))


def pairs() -> Program:
    """out[i // 2] = x[i]: two lanes store to each element (not a one-to-one box)."""
    return pointwise("pairs", (Param("x", "ptr", "float32"), Param("out", "ptr", "float32")), 320, (
        const("%two", 2), Binary("%h", "floordiv", "%i", "%two"), Load("%v", "x", "%i"),
        Store("out", "%h", "%v")))


def scatter() -> Program:
    """out[p[i]] = x[i]: a store at offsets read from memory."""
    return pointwise("scatter", (Param("p", "ptr", "int64"), Param("x", "ptr", "float32"),
                                 Param("out", "ptr", "float32")), 320, (
        Load("%p", "p", "%i"), Load("%v", "x", "%i"), Store("out", "%p", "%v")))


def _data(t: int):
    rng = np.random.default_rng(t)
    x = rng.standard_normal(R * C).astype(F32)
    return rng, x


def _cases():
    def t_load(bufs, t):
        _, x = _data(t)
        return {"x": bufs.put(x), "out": bufs.put(np.zeros(R * C + 5, F32))}, x.reshape(R, C).T.ravel()

    def t_store(bufs, t):
        _, x = _data(t)
        return {"x": bufs.put(x), "out": bufs.put(np.zeros(R * C, F32))}, x.reshape(R, C).T.ravel()

    def bias(bufs, t):
        rng, x = _data(t)
        b = rng.standard_normal(C).astype(F32)
        return ({"x": bufs.put(x), "b": bufs.put(b), "out": bufs.put(np.zeros(R * C, F32))},
                (x.reshape(R, C) + b).ravel())

    def rev(bufs, t):
        _, x = _data(t)
        return {"x": bufs.put(x), "out": bufs.put(np.zeros(R * C, F32))}, x + x

    def pair(bufs, t):
        _, x = _data(t)
        return {"x": bufs.put(x), "out": bufs.put(np.zeros(R * C // 2, F32))}, None

    def scat(bufs, t):
        rng, x = _data(t)
        p = rng.permutation(R * C).astype(np.int64)
        want = np.zeros(R * C, F32)
        want[p] = x
        return {"p": bufs.put(p), "x": bufs.put(x), "out": bufs.put(np.zeros(R * C, F32))}, want

    return {"transpose load": (transpose_load, (4, 1, 1), t_load, R * C + 5),
            "transpose store": (transpose_store, (3, 1, 1), t_store, R * C),
            "bias": (bias_add, (3, 1, 1), bias, R * C),
            "reverse": (reverse, (3, 1, 1), rev, R * C),
            "pairs": (pairs, (3, 1, 1), pair, R * C // 2),
            "scatter": (scatter, (3, 1, 1), scat, R * C)}


CASES = _cases()


def run_launches(make_prog, grid, make, n_out, cache, times=4):
    """Launch a fresh program ``times`` times on fresh buffers with the recordings ``cache``
    (None: the interpreter alone): per launch, the output and the counters (ranges relative
    to the launch's pointers)."""
    prog, bufs, seen = make_prog(), Buffers(), []
    for t in range(times):
        args, want = make(bufs, t)
        c = ex.execute(prog, grid, args, bufs.space, cache)
        out = bufs.get(args["out"], n_out, F32)
        if want is not None:
            np.testing.assert_array_equal(out[:want.size], want)
        seen.append((out.tobytes(), c.instances, list(c.matrix_flops.items()), list(c.vector_flops.items()),
                     c.bytes_read, c.bytes_written, c.instructions,
                     [(k, lo - args[k], hi - args[k]) for k, (lo, hi) in c.read_ranges.items()],
                     [(k, lo - args[k], hi - args[k]) for k, (lo, hi) in c.write_ranges.items()]))
    return seen, prog


@pytest.mark.parametrize("case", list(CASES))
def test_direct_access_and_replay_match_the_general_path(case, monkeypatch):
    make_prog, grid, make, n_out = CASES[case]
    direct, _ = run_launches(make_prog, grid, make, n_out, None)
    monkeypatch.setattr(Interpreter, "_direct", lambda self, *a: None)     # byte addresses, gather/scatter
    general, _ = run_launches(make_prog, grid, make, n_out, ReplayCache(0))
    monkeypatch.undo()
    cache = ReplayCache()
    replayed, prog = run_launches(make_prog, grid, make, n_out, cache)
    assert cache.recordings(prog) == 1
    assert direct == general
    assert replayed == general


def test_a_store_takes_a_box_only_when_it_writes_each_element_once():
    """Two lanes storing to one element stay an index store (the plain path's write order);
    a load may repeat elements, and a transposing store is a box."""
    f32, pairs = np.dtype(F32), np.repeat(np.arange(8), 2)
    load = Lanes.of("x", pairs, (1, 16), None, f32)
    store = Lanes.of("x", pairs, (1, 16), None, f32, (1, 16), store=True)
    assert load.box == ((8, 2), (4, 0)) and load.index is None
    assert store.box is None and store.index.tolist() == pairs.tolist()
    t = Lanes.of("x", np.arange(960).reshape(24, 40).T.ravel(), (4, 240), None, f32, (4, 240), store=True)
    assert t.box == ((40, 24), (4, 160)) and t.index is None
    assert (t.lo, t.hi, t.start, t.count) == (0, 4 * 959, 0, 960)


def test_a_replayed_transpose_keeps_no_index_arrays():
    """The lanes of a transpose are an n-d box: the recording holds no per-lane addresses
    (two index arrays would take 16 bytes a lane; the masks of the ragged block remain)."""
    make_prog, grid, make, n_out = CASES["transpose load"]
    cache = ReplayCache()
    _, prog = run_launches(make_prog, grid, make, n_out, cache, times=2)
    assert cache.recordings(prog) == 1
    assert cache.nbytes < 4 * R * C


@pytest.mark.parametrize("index,shape,strides", [
    (np.arange(5, 29), (24,), (1,)),
    (np.arange(960).reshape(24, 40).T.ravel() + 7, (40, 24), (1, 40)),
    (np.tile(np.arange(40), 24), (24, 40), (0, 1)),
    (np.arange(100, 60, -2), (20,), (-2,)),
    (np.arange(2 * 3 * 4).reshape(2, 3, 4).transpose(2, 0, 1).ravel(), (4, 6), (1, 4)),
    (np.array([3, 3, 3]), (3,), (0,)),
])
def test_box_layouts_reproduce_their_index(index, shape, strides):
    found = find_box(index.astype(np.int64))
    assert found == (shape, strides)
    np.testing.assert_array_equal(box_index(int(index[0]), *found), index)


@pytest.mark.parametrize("index", [
    np.random.default_rng(0).permutation(64),
    np.array([0, 1, 2, 3, 4, 5, 10, 11, 12, 20]),          # runs of different lengths
    np.array([0, 1, 2, 10, 11, 12, 20, 21, 22, 31, 32, 33]),   # the last row shifted by one
    np.array([0, 2, 1]),
    np.array([0, 1, 5, 6, 10, 11, 15, 17]),                  # rows of one box but the last
])
def test_what_is_not_a_box_is_not_taken_for_one(index):
    assert find_box(index.astype(np.int64)) is None


def test_one_to_one_boxes():
    assert one_to_one((24, 40), (40, 1)) and one_to_one((40, 24), (1, 40))
    assert one_to_one((4, 5), (-5, 1)) and one_to_one((3, 2, 2), (1, 6, 3))
    assert not one_to_one((24, 40), (0, 1))          # a repeated row
    assert not one_to_one((4, 5), (3, 1))            # rows overlap
    assert not one_to_one((2, 3), (1, 1))


def spanning_gather() -> Program:
    """out[i] = x[o[i]] with offsets given, so they can reach another buffer's mapping."""
    return pointwise("span", (Param("o", "ptr", "int64"), Param("x", "ptr", "float32"),
                              Param("out", "ptr", "float32")), 16, (
        Load("%o", "o", "%i"), Load("%v", "x", "%o"), Store("out", "%i", "%v")))


def _fault(fn):
    with pytest.raises((PageFault, MisalignedAddress)) as info:
        fn()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("how", ["two mappings", "misaligned", "guard page", "freed"])
def test_accesses_the_direct_path_cannot_take_behave_as_before(how, monkeypatch):
    """An access spanning two mappings reads both; a misaligned pointer, a guard page or a
    freed buffer fault with the general path's error, address and message."""
    def session(direct: bool):
        if not direct:
            monkeypatch.setattr(Interpreter, "_direct", lambda self, *a: None)
        bufs, prog = Buffers(), spanning_gather()
        x = np.arange(16, dtype=F32)
        y = np.arange(100, 116, dtype=F32)
        xa, ya = bufs.put(x), bufs.put(y)
        o = np.arange(16, dtype=np.int64)
        if how == "two mappings":
            o[8:] = (ya - xa) // 4 + np.arange(8)
        elif how == "guard page":
            o[-1] = (ya - 64 - xa) // 4 - 1          # just before y's mapping
        args = {"o": bufs.put(o), "x": xa + (2 if how == "misaligned" else 0), "out": bufs.put(np.zeros(16, F32))}
        if how == "freed":
            bufs.space.unmap(args["out"] - 64)
        if how != "two mappings":
            got = _fault(lambda: ex.execute(prog, (1, 1, 1), args, bufs.space))
        else:
            c = ex.execute(prog, (1, 1, 1), args, bufs.space)
            got = (bufs.get(args["out"], 16, F32).tobytes(), c.bytes_read, c.read_ranges["x"] == (xa, ya + 32))
        monkeypatch.undo()
        return got

    direct, general = session(True), session(False)
    assert direct == general
    if how == "two mappings":
        assert direct[0] == np.concatenate([np.arange(8), np.arange(100, 108)]).astype(F32).tobytes()


def dot_program(broadcast_b: bool) -> Program:
    """c (4x4) = a (4x8) @ b (8x4); b is either loaded or a row broadcast to 8x4 (a view
    with a zero stride, which the product must copy first, as before)."""
    b_tile = ((Arange("%bj", 4), Reshape("%brow", "%bj", (1, 4)), Load("%b1", "b", "%brow"),
               Broadcast("%b", "%b1", (8, 4))) if broadcast_b else
              (Arange("%bj", 32), Reshape("%bidx", "%bj", (8, 4)), Load("%b", "b", "%bidx")))
    return isa.verify(Program("dot", (Param("a", "ptr", "float32"), Param("b", "ptr", "float32"),
                                      Param("c", "ptr", "float32")), (
        Arange("%aj", 32), Reshape("%aidx", "%aj", (4, 8)), Load("%a", "a", "%aidx"), *b_tile,
        Const("%z", 0.0, "float32"), Broadcast("%acc", "%z", (4, 4)), Dot("%acc1", "%a", "%b", "%acc"),
        Dot("%acc2", "%a", "%b", "%acc1"), Arange("%cj", 16), Reshape("%cidx", "%cj", (4, 4)),
        Store("c", "%cidx", "%acc2"))))


@pytest.mark.parametrize("broadcast_b", [False, True])
def test_matrix_products_keep_the_numerics_of_copied_operands(broadcast_b):
    """The product is the same BLAS call on the same strides and values as when the
    executor copied both operands first: equal bit for bit, plain and replayed."""
    prog, bufs, cache = dot_program(broadcast_b), Buffers(), ReplayCache()
    for t in range(3):
        rng = np.random.default_rng(t)
        a = rng.standard_normal((4, 8)).astype(F32)
        b = rng.standard_normal(32).astype(F32)
        args = {"a": bufs.put(a), "b": bufs.put(b), "c": bufs.put(np.zeros(16, F32))}
        c = ex.execute(prog, (1, 1, 1), args, bufs.space, cache)
        bt = np.broadcast_to(b[:4], (8, 4)) if broadcast_b else b.reshape(8, 4)
        prod = np.matmul(a[None], np.array(bt)[None])        # contiguous float32 copies, as before
        want = (np.zeros((1, 4, 4), F32) + prod) + prod       # two accumulating steps in float32
        assert bufs.get(args["c"], 16, F32).tobytes() == want.tobytes()
        assert c.matrix_flops == {"float32": 2 * 2.0 * 4 * 4 * 8}
    assert cache.recordings(prog) == 1


@pytest.mark.parametrize("case", ["transpose load", "transpose store", "reverse", "pairs"])
@pytest.mark.parametrize("damage", ["short input", "short output", "misaligned output"])
def test_a_replayed_box_or_index_access_faults_like_a_plain_one(case, damage):
    """The replay's fallback rebuilds the addresses from the recorded layout: the same
    fault, at the same address, with the same message as a plain launch."""
    make_prog, grid, make, n_out = CASES[case]

    def session(replay: bool):
        cache = ReplayCache(None if replay else 0)
        prog, bufs = make_prog(), Buffers()
        for t in range(2):                       # the second launch records
            ex.execute(prog, grid, make(bufs, t)[0], bufs.space, cache)
        args, _ = make(bufs, 2)
        if damage == "short input":
            args["x"] = bufs.put(np.zeros(R * C // 2, F32))
        elif damage == "short output":
            args["out"] = bufs.put(np.zeros(n_out // 3, F32))
        else:
            args["out"] += 2
        got = _fault(lambda: ex.execute(prog, grid, args, bufs.space, cache))
        return got, cache.recordings(prog)

    (plain, none), (replayed, held) = session(False), session(True)
    assert none == 0 and held == 1
    assert replayed == plain


@pytest.mark.parametrize("vendor", FAMILIES)
def test_a_stack_runs_the_same_with_and_without_replay(vendor, monkeypatch):
    """Each vendor's library GEMM (a K loop of tile loads and products), a transpose and a
    broadcast add through all the seams, with deferred writes and race checks: outputs,
    timeline records and the kernel log are the same with replay as without."""
    from fornax.layers.graph import Graph
    from fornax.stack import compose, make_config

    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((64, 96)).astype(F32), "w": rng.standard_normal((96, 80)).astype(F32),
             "b": rng.standard_normal(64).astype(F32)}

    def session(replay: bool):
        if not replay:
            monkeypatch.setattr(rp, "REPLAY_BYTES", 0)       # the devices' caches are made off
        g = Graph("mm_t")
        x, w, b = (g.input(k, v.shape, "float32") for k, v in feeds.items())
        g.output(g.op("add", g.op("transpose", g.op("matmul", x, w), perm=(1, 0)), b))
        st = compose(make_config(vendor, spec="tiny"))
        outs = [st.run(g, feeds).outputs[0].tobytes() for _ in range(4)]
        tl = st.devices[0].timeline
        records = [(r.label, r.queue, r.start, r.end, r.reads, r.writes, r.args) for r in tl.records]
        monkeypatch.undo()
        return outs, records, st.driver.kernel_log, tl.busy_time, len(st.devices[0].replays)

    plain = session(False)
    assert plain[-1] == 0
    replayed = session(True)
    assert replayed[-1] >= 2                     # the GEMM and the transposing add replayed
    plain, replayed = plain[:-1], replayed[:-1]
    want = (feeds["x"].astype(np.float64) @ feeds["w"]).T + feeds["b"]
    got = np.frombuffer(plain[0][-1], F32).reshape(80, 64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert replayed == plain


def test_float32_erf_is_the_double_erf_rounded_bit_for_bit():
    """The interpreter's float32 erf (PyTorch's double erf, rounded) gives SciPy's float32
    erf's bits: over a spread of magnitudes, denormals, signed zeros, infinities and NaN."""
    from scipy.special import erf

    from fornax.sim.interpreter import UNARY
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(200_000) * s for s in (1e-3, 0.3, 1.0, 2.5, 4.0)]
                       + [np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 1e-38, 3.4e38])]
                       ).astype(F32)
    got = UNARY["erf"](x)
    assert got.dtype == F32
    assert np.array_equal(got.view(np.uint32), erf(x).view(np.uint32))
    wide = x.astype(np.float64)
    assert np.array_equal(UNARY["erf"](wide), erf(wide), equal_nan=True)
