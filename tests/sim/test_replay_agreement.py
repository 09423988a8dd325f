"""The interpreter (fornax.sim.interpreter) defines the tile ISA; record and replay
(fornax.sim.replay) must agree with it bit for bit.  Every executor kernel of the sim tests,
and randomly generated small programs over random grids, run through both, launch after
launch on fresh data (the second launch records, later ones replay): memory, counters and
faults are identical."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_execute import (bad_reshape_program, copy_program, elementwise_program, fill_program,
                          grid_ids_program, instance_ids_program, masked_other_program, mixed_dtypes_program,
                          rowsum_program)
from test_fast_paths import CASES as FAST_PATH_CASES
from test_fast_paths import dot_program, spanning_gather
from test_replay import (gather_program, gemm_case, masked_by_data_program, ragged_case, reduce_case,
                         scatter_add_program)
from test_store_reduce import _program as store_reduce_program

from fornax.layers import codegen
from fornax.layers.graph import DType
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.execute import execute
from fornax.sim.faults import ExecutionError, MisalignedAddress, PageFault
from fornax.sim.isa import (Arange, Binary, Const, Convert, Load, Loop, Param, Program, ProgramId, Reduce,
                            Reshape, ScalarArg, Store, StoreReduce, Unary, Where)
from fornax.sim.replay import ReplayCache
from fornax.sim.spec import load_spec

F32 = np.float32
LAUNCHES = 4                      # the first runs plainly, the second records, the rest replay


class Buffers:
    """One fresh device space; each array 64 bytes into a mapping of its own, ending at the
    mapping's end (so an access past it faults)."""

    def __init__(self):
        self.space = Device(load_spec("tiny")).memory.create_space()
        self.live: dict[int, int] = {}          # pointer -> bytes

    def put(self, arr: np.ndarray) -> int:
        m = self.space.map(64 + max(1, arr.nbytes))
        self.space.write(m.va + 64, np.ascontiguousarray(arr).tobytes())
        self.live[m.va + 64] = arr.nbytes
        return m.va + 64

    def free(self, ptr: int) -> None:
        self.space.unmap(ptr - 64)
        del self.live[ptr]

    def snapshot(self) -> list[tuple[int, bytes]]:
        """Every live buffer's bytes."""
        return [(ptr, self.space.read(ptr, n)) for ptr, n in sorted(self.live.items())]


def run(program: Program, grid, make, cache: ReplayCache | None, damage=None):
    """``LAUNCHES`` launches of ``program`` on fresh buffers made by ``make(bufs, t)``; per
    launch: the memory and counters, or the fault (type and message)."""
    bufs, seen = Buffers(), []
    for t in range(LAUNCHES):
        args = make(bufs, t)
        if damage is not None and t == LAUNCHES - 1:
            damage(bufs, args)
        try:
            counters = execute(program, grid, args, bufs.space, cache)
        except (ExecutionError, PageFault, MisalignedAddress) as exc:
            seen.append((type(exc).__name__, str(exc)))
            continue
        seen.append((bufs.snapshot(), counters))
    return seen


def assert_agree(make_program, grid, make, damage=None, recorded: bool | None = None) -> None:
    """The interpreter and record + replay give the same launches, bit for bit."""
    plain = run(make_program(), grid, make, None, damage)
    program, cache = make_program(), ReplayCache()
    replayed = run(program, grid, make, cache, damage)
    assert len(plain) == len(replayed)
    for a, b in zip(plain, replayed):
        assert a == b
    if recorded is not None:
        assert (cache.recordings(program) == 1) == recorded


# ---- the executor kernels of the sim tests -------------------------------------------------
def _rng(t: int) -> np.random.Generator:
    return np.random.default_rng(1000 + t)


def _gemm(dtname: str, dynamic: bool, batch: int = 1, b_batched: bool = False, shape=(37, 53, 29)):
    dt, npdt = {"float32": (DType.FLOAT32, F32), "float16": (DType.FLOAT16, np.float16),
                "bfloat16": (DType.BFLOAT16, ml_dtypes.bfloat16)}[dtname]
    m, n, k = shape
    tile = (32, 32, 16)

    def program():
        if dynamic:
            return codegen.gemm_kernel("gemm_dyn", dt, "m", "n", "k", batch, b_batched, tile, 128)[0]
        return codegen.gemm_kernel("gemm", dt, m, n, k, batch, b_batched, tile, 128)[0]

    def make(bufs, t):
        rng = _rng(t)
        args = {"a": bufs.put(rng.standard_normal((batch, m, k)).astype(npdt)),
                "b": bufs.put(rng.standard_normal((batch, k, n) if b_batched else (k, n)).astype(npdt)),
                "c": bufs.put(np.zeros((batch, m, n), npdt))}
        return args | ({"m": m, "n": n, "k": k} if dynamic else {})

    grid = (math.ceil(n / tile[1]), math.ceil(m / tile[0]), batch)
    if not dynamic:
        grid = codegen.gemm_kernel("gemm", dt, m, n, k, batch, b_batched, tile, 128)[1]
    return program, grid, make


def _elementwise(bufs, t):
    rng = _rng(t)
    return {"x": bufs.put(rng.standard_normal(1000).astype(F32)),
            "y": bufs.put(rng.standard_normal(1000).astype(F32)),
            "out": bufs.put(np.full(1024, 7.0, F32)), "n": 1000}


def _store_reduce(fn: str):
    def make(bufs, t):
        return {"x": bufs.put(_rng(t).standard_normal(1000).astype(F32)),
                "out": bufs.put(np.array([1.5, -2.0, 0.25], F32)), "n": 1000}
    return (lambda: store_reduce_program(fn)), (16, 1, 1), make


def _from_replay_tests(case):
    prog, grid, make, _ = case()
    return (lambda: case()[0]), grid, make


def _gather(bufs, t):
    idx = _rng(t).integers(t, 10 + 3 * t, 16).astype(np.int64)
    return {"idx": bufs.put(idx), "x": bufs.put(np.arange(32, dtype=F32) * 10),
            "out": bufs.put(np.zeros(16, F32))}


def _by_data(bufs, t):
    m = _rng(t).integers(0, 4, 16).astype(np.int64)
    return {"m": bufs.put(m), "x": bufs.put(np.arange(16, dtype=F32)), "out": bufs.put(np.zeros(16, F32))}


def _fast_path(case):
    make_prog, grid, make, _ = FAST_PATH_CASES[case]
    return make_prog, grid, (lambda bufs, t: make(bufs, t)[0])


def _spanning(bufs, t):
    xa, ya = bufs.put(np.arange(16, dtype=F32) + t), bufs.put(np.arange(100, 116, dtype=F32))
    o = np.arange(16, dtype=np.int64)
    o[8:] = (ya - xa) // 4 + np.arange(8)                   # half the lanes read the other mapping
    return {"o": bufs.put(o), "x": xa, "out": bufs.put(np.zeros(16, F32))}


def _dot(bufs, t):
    rng = _rng(t)
    return {"a": bufs.put(rng.standard_normal((4, 8)).astype(F32)),
            "b": bufs.put(rng.standard_normal(32).astype(F32)), "c": bufs.put(np.zeros(16, F32))}


def _rowsum(bufs, t):
    return {"x": bufs.put(_rng(t).standard_normal((13, 40)).astype(F32)),
            "s": bufs.put(np.zeros(13, F32)), "mx": bufs.put(np.zeros(13, F32))}


KERNELS = {
    # test_execute
    "elementwise": ((lambda: elementwise_program(128)), (8, 1, 1), _elementwise),
    "masked other": (masked_other_program, (1, 1, 1),
                     lambda bufs, t: {"x": bufs.put(np.arange(5, dtype=F32) + t), "o": bufs.put(np.zeros(8, F32))}),
    "rowsum": ((lambda: rowsum_program(40, 64)), (13, 1, 1), _rowsum),
    "grid ids": (grid_ids_program, (3, 4, 2), lambda bufs, t: {"o": bufs.put(np.zeros(24, np.int64))}),
    "instance ids": (instance_ids_program, (5000, 1, 1),
                     lambda bufs, t: {"o": bufs.put(np.zeros(5000, np.int32))}),
    "oob load": ((lambda: copy_program("oob", 256)), (1, 1, 1),
                 lambda bufs, t: {"x": bufs.put(np.zeros(100, F32)), "o": bufs.put(np.zeros(256, F32))}),
    "oob store": (fill_program, (1, 1, 1), lambda bufs, t: {"o": bufs.put(np.zeros(100, F32))}),
    "unmapped": ((lambda: copy_program("k", 4)), (1, 1, 1),
                 lambda bufs, t: {"x": 0x1000, "o": bufs.put(np.zeros(4, F32))}),
    "mixed dtypes": (mixed_dtypes_program, (1, 1, 1), lambda bufs, t: {"x": bufs.put(np.zeros(4, F32))}),
    "missing argument": (mixed_dtypes_program, (1, 1, 1), lambda bufs, t: {}),
    "bad reshape": (bad_reshape_program, (1, 1, 1), lambda bufs, t: {}),
    **{f"gemm {dt} {'dynamic' if dyn else 'static'}": _gemm(dt, dyn)
       for dt in ("float32", "float16", "bfloat16") for dyn in (False, True)},
    **{f"batched gemm b_batched={bb}": _gemm("float32", True, 3, bb, (19, 23, 33)) for bb in (False, True)},
    # test_replay
    "ragged": _from_replay_tests(ragged_case),
    "gemm (replay tests)": _from_replay_tests(gemm_case),
    "bucket sum": _from_replay_tests(reduce_case),
    "gather": (gather_program, (1, 1, 1), _gather),
    "masked by data": (masked_by_data_program, (1, 1, 1), _by_data),
    "scatter add": (scatter_add_program, (1, 1, 1), _by_data),
    # test_fast_paths
    **{f"fast path: {case}": _fast_path(case) for case in FAST_PATH_CASES},
    "spanning gather": (spanning_gather, (1, 1, 1), _spanning),
    "dot": ((lambda: dot_program(False)), (1, 1, 1), _dot),
    "dot, broadcast operand": ((lambda: dot_program(True)), (1, 1, 1), _dot),
    # test_store_reduce
    **{f"store_reduce {fn}": _store_reduce(fn) for fn in ("sum", "max", "min")},
}


#: kernels that are never recorded: every launch faults, or what they count depends on the data
NOT_RECORDED = {"oob load", "oob store", "unmapped", "mixed dtypes", "missing argument", "bad reshape",
                "masked by data", "scatter add"}


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_executor_kernel_agrees(name):
    assert_agree(*KERNELS[name], recorded=name not in NOT_RECORDED)


def _freed(bufs, args):
    bufs.free(args[[k for k, v in args.items() if v in bufs.live][-1]])


def _short(bufs, args):
    first = next(k for k, v in args.items() if v in bufs.live)
    args[first] = bufs.put(np.zeros(max(1, bufs.live[args[first]] // 12), np.uint8))


def _misaligned(bufs, args):
    args[[k for k, v in args.items() if v in bufs.live][-1]] += 2


@pytest.mark.parametrize("damage", [_freed, _short, _misaligned], ids=["freed", "short", "misaligned"])
@pytest.mark.parametrize("name", ["elementwise", "rowsum", "gemm float32 dynamic", "fast path: transpose load",
                                  "fast path: transpose store", "fast path: reverse", "fast path: pairs",
                                  "fast path: bias", "gather", "dot"])
def test_a_replayed_launch_faults_like_an_interpreted_one(name, damage):
    """The last launch (a replay) runs on a freed, short or misaligned buffer."""
    assert_agree(*KERNELS[name], damage=damage, recorded=True)


# ---- random programs -------------------------------------------------------------------------
UNARY = ("neg", "exp", "log", "tanh", "sqrt", "rsqrt", "abs", "relu", "sigmoid", "recip", "sin", "cos",
         "erf", "floor", "ceil", "round", "sign", "tf32")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow", "atan2", "mod", "floordiv")


@st.composite
def random_kernels(draw):
    """A small random kernel over a random grid: a (possibly 2-D) block of lanes per instance,
    a ragged masked tail, loads by a run, a reversed run, a broadcast row or loaded indices,
    a chain of vector operations (in float32 and float16), an optional loop (its bound a
    constant, a scalar or loaded), and a store, a reversed store or a store_reduce."""
    grid = (draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    block = draw(st.sampled_from([1, 3, 8, 12]))
    rows = draw(st.sampled_from([1] + [r for r in (2, 3, 4) if block % r == 0]))
    total = math.prod(grid) * block
    n = total - draw(st.integers(0, block))
    c = lambda name, v: Const(name, v, "int64")                       # noqa: E731
    body: list = [ProgramId("%px", 0), ProgramId("%py", 1), ProgramId("%pz", 2),
                  c("%gx", grid[0]), c("%gy", grid[1]), c("%bs", block),
                  Binary("%zy", "mul", "%pz", "%gy"), Binary("%yz", "add", "%zy", "%py"),
                  Binary("%yzx", "mul", "%yz", "%gx"), Binary("%flat", "add", "%yzx", "%px"),
                  Binary("%base", "mul", "%flat", "%bs"), Arange("%lane0", block)]
    body.append(Reshape("%lane", "%lane0", (rows, block // rows)) if rows > 1
                else Reshape("%lane", "%lane0", (block,)))
    body += [Binary("%i", "add", "%base", "%lane"), ScalarArg("%n", "n"), Binary("%m", "lt", "%i", "%n"),
             c("%last", total - 1), Binary("%rev", "sub", "%last", "%i")]
    source = draw(st.sampled_from(["run", "reverse", "broadcast", "gather"]))
    src = {"run": "%i", "reverse": "%rev", "broadcast": "%lane", "gather": "%g"}[source]
    if source == "gather":
        body.append(Load("%g", "idx", "%i", "%m"))
    body += [Load("%x", "x", src, "%m", draw(st.sampled_from([0.0, -1.5]))), Load("%y", "y", "%i", "%m")]
    floats = ["%x", "%y"]
    for k in range(draw(st.integers(0, 6))):
        dst, a, b = f"%v{k}", draw(st.sampled_from(floats)), draw(st.sampled_from(floats))
        kind = draw(st.sampled_from(["unary", "binary", "where", "reduce", "half"]))
        if kind == "unary":
            body.append(Unary(dst, draw(st.sampled_from(UNARY)), a))
        elif kind == "binary":
            body.append(Binary(dst, draw(st.sampled_from(BINARY)), a, b))
        elif kind == "where":
            body += [Binary(f"%c{k}", "lt", a, b), Where(dst, f"%c{k}", b, a)]
        elif kind == "reduce":
            body += [Reduce(f"%r{k}", draw(st.sampled_from(["sum", "max", "min"])), a, -1),
                     Binary(dst, "add", f"%r{k}", b)]
        else:
            body += [Convert(f"%h{k}", a, "float16"), Unary(f"%hu{k}", "exp", f"%h{k}"),
                     Convert(dst, f"%hu{k}", "float32")]
        floats.append(dst)
    result = floats[-1]
    bound = draw(st.sampled_from(["none", "const", "scalar", "loaded"]))
    if bound != "none":
        stop = {"const": 3, "scalar": "%steps", "loaded": "%ld"}[bound]
        if bound == "scalar":
            body.append(ScalarArg("%steps", "steps"))
        elif bound == "loaded":
            body += [c("%zero", 0), Load("%ld", "lsteps", "%zero")]
        body += [Const("%acc", 0.0, "float32"),
                 Loop("%k", 0, stop, 1, (Convert("%kf", "%k", "float32"), Binary("%t", "mul", result, "%kf"),
                                         Binary("%acc", "add", "%acc", "%t"))),
                 Binary("%res", "add", "%acc", result)]
        result = "%res"
    store = draw(st.sampled_from(["run", "reverse", "reduce", "reduce by data"]))
    if store == "run":
        body.append(Store("out", "%i", result, "%m"))
    elif store == "reverse":
        body.append(Store("out", "%rev", result, "%m"))
    else:
        body += [c("%three", 3), Binary("%bucket", "mod", "%flat" if store == "reduce" else "%g2", "%three")]
        if store == "reduce by data":
            body.insert(-1, Load("%g2", "idx", "%i", "%m"))
        body.append(StoreReduce("out", "%bucket", result, draw(st.sampled_from(["sum", "max", "min"])), "%m"))
    params = (Param("idx", "ptr", "int64"), Param("x", "ptr", "float32"), Param("y", "ptr", "float32"),
              Param("lsteps", "ptr", "int64"), Param("out", "ptr", "float32"), Param("n", "scalar", "int64"),
              Param("steps", "scalar", "int64"))
    special = draw(st.booleans())

    def make(bufs, t):
        rng = np.random.default_rng(t)
        x = rng.standard_normal(total).astype(F32)
        if special:
            x[rng.integers(0, total, 2)] = [np.nan, np.inf]
        return {"idx": bufs.put(rng.integers(0, total, total).astype(np.int64)), "x": bufs.put(x),
                "y": bufs.put(rng.standard_normal(total).astype(F32)),
                "lsteps": bufs.put(np.array([rng.integers(0, 3)], np.int64)),
                "out": bufs.put(np.full(total, 0.5, F32)), "n": n, "steps": 2}

    return (lambda: isa.verify(Program("random", params, tuple(body)))), grid, make


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_kernels())
def test_random_kernels_agree(kernel):
    assert_agree(*kernel)
