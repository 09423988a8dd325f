"""What creating and summing a 1 GiB tensor exercises (``benchmarks/big_tensor.py``), at test size.

* The interpreter's shortcuts (index registers held unmade, accesses to one run of elements
  as slices, loads read in place while a packet runs) agree bit for bit with the plain path
  they stand in for: memory and counters, in a packet and out of one.
* The write log keeps a repeated value once and an owned write without a copy; the bytes
  that land are the same.  A host-to-device copy is staged at the call unless the caller
  holds its source.
* torch: device sums of 2**22 elements are numpy's sum of the same tile; host -> device ->
  host round trips are exact for every storable dtype, views and strided destinations.
* An H2D copy of N bytes grows the host's resident set by about N (the simulated HBM), at
  most 1.5 N (a fresh process, 256 MiB).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.sim import interpreter as interp
from fornax.sim import memory as mem
from fornax.sim import registers
from fornax.sim.device import Device
from fornax.sim.interpreter import Interpreter, interpret
from fornax.sim.isa import (Arange, Binary, Const, Load, Param, Program, ProgramId, Reduce, Store, Where,
                            verify)
from fornax.sim.spec import load_spec
from fornax.stack import compose, make_config

F32, I64 = "float32", "int64"


# -- hand-written kernels shaped like the ones a 1 GiB create + sum launches -----------------
def _head(block: int) -> tuple:
    return (ProgramId("%pid"), Const("%bs", block, I64), Binary("%base", "mul", "%pid", "%bs"),
            Arange("%lane", block), Binary("%i", "add", "%base", "%lane"))


def fill(n: int, block: int) -> tuple[Program, tuple[int, int, int]]:
    """out[i] = in[0] for i < n (torch.ones' kernel: a masked broadcast load, a run store)."""
    body = _head(block) + (Const("%n", n, I64), Binary("%m", "lt", "%i", "%n"), Const("%z", 0, I64),
                           Load("%v", "in0", "%z", "%m", 0.0), Store("out0", "%i", "%v", "%m"))
    return verify(Program("fill", (Param("in0", "ptr", F32), Param("out0", "ptr", F32)), body)), \
        (math.ceil(n / block), 1, 1)


def scale_index(n: int, block: int) -> tuple[Program, tuple[int, int, int]]:
    """out[i] = x[i] * 2 + i for i < n: the flat index is also read as a value (it gets made)."""
    body = _head(block) + (Const("%n", n, I64), Binary("%m", "lt", "%i", "%n"),
                           Load("%x", "x", "%i", "%m", 0.0), Const("%two", 2.0, F32),
                           Binary("%y", "mul", "%x", "%two"), Store("out", "%i", "%y", "%m"),
                           Store("idx", "%i", "%i", "%m"))
    params = (Param("x", "ptr", F32), Param("out", "ptr", F32), Param("idx", "ptr", I64))
    return verify(Program("scale_index", params, body)), (math.ceil(n / block), 1, 1)


def row_sum(length: int, fn: str = "sum", pad: float | None = None) -> tuple[Program, tuple[int, int, int]]:
    """out[0] = the reduction of x[0:length] as one tile (a reduction kernel's single row; past
    the row the tile holds the reduction's identity, or ``pad``, as a where of the bounds mask
    sets it)."""
    width = 1 << max(0, length - 1).bit_length()
    identity = 0.0 if fn == "sum" else float("-inf")
    body: tuple = (ProgramId("%pid"), Arange("%col", width))
    if width != length:
        body += (Const("%len", length, I64), Binary("%m", "lt", "%col", "%len"),
                 Load("%l", "x", "%col", "%m", identity),
                 Const("%pad", identity if pad is None else pad, F32), Where("%x", "%m", "%l", "%pad"))
    else:
        body += (Load("%x", "x", "%col"),)
    body += (Reduce("%s", fn, "%x", -1), Const("%z", 0, I64), Store("out", "%z", "%s"))
    return verify(Program(f"row_{fn}", (Param("x", "ptr", F32), Param("out", "ptr", F32)), body)), (1, 1, 1)


class Memory:
    """A device's address space with each array in a mapping of its own, 64 bytes in."""

    def __init__(self):
        self.space = Device(load_spec("h100-like")).memory.create_space()
        self.at: dict[str, tuple[int, int, np.dtype]] = {}

    def put(self, name: str, arr: np.ndarray) -> None:
        m = self.space.map(64 + arr.nbytes + 64)
        self.space.write(m.va + 64, np.ascontiguousarray(arr).tobytes())
        self.at[name] = (m.va + 64, arr.size, arr.dtype)

    def zeros(self, name: str, n: int, dtype) -> None:
        self.put(name, np.zeros(n, dtype))

    def args(self) -> dict[str, int]:
        return {name: va for name, (va, _, _) in self.at.items()}

    def get(self, name: str) -> bytes:
        va, n, dtype = self.at[name]
        return self.space.read(va, n * dtype.itemsize)


def _run(program, grid, arrays, outputs, packet: bool):
    memory = Memory()
    for name, arr in arrays.items():
        memory.put(name, arr)
    for name, (n, dtype) in outputs.items():
        memory.zeros(name, n, dtype)
    if packet:                       # as a timeline packet runs it: writes land at commit
        log = mem.begin_capture()
        try:
            counters = interpret(program, grid, memory.args(), memory.space)
        finally:
            mem.end_capture()
        log.commit()
    else:
        counters = interpret(program, grid, memory.args(), memory.space)
    return counters, {name: memory.get(name) for name in (*arrays, *outputs)}


def _took(monkeypatch) -> dict[str, int]:
    """Counts of the shortcuts taken from now on: runs loaded and stored as slices."""
    taken = {"load": 0, "store": 0}
    load, store = Interpreter._load_run, Interpreter._store_run

    def counted_load(self, *args):
        got = load(self, *args)
        taken["load"] += got is not None
        return got

    def counted_store(self, *args):
        got = store(self, *args)
        taken["store"] += bool(got)
        return got
    monkeypatch.setattr(Interpreter, "_load_run", counted_load)
    monkeypatch.setattr(Interpreter, "_store_run", counted_store)
    return taken


def _agree(monkeypatch, program, grid, arrays, outputs):
    """The launch with shortcuts and without, in a packet and out of one: the same memory and
    counters every way."""
    runs = {}
    for shortcuts in (True, False):
        monkeypatch.setattr(Interpreter, "shortcuts", shortcuts)
        for packet in (False, True):
            runs[shortcuts, packet] = _run(program, grid, arrays, outputs, packet)
    reference = runs[False, False]
    for key, got in runs.items():
        assert got[0] == reference[0], key
        assert got[1] == reference[1], key
    return reference


@pytest.fixture
def small_thresholds(monkeypatch):
    """Shortcuts at test sizes: unmade Aranges from 2048 lanes, unmade sums from 1024."""
    monkeypatch.setattr(interp, "LAZY_RANGE", 2048)
    monkeypatch.setattr(registers, "LAZY_SUM", 1024)
    monkeypatch.setattr(registers, "RUN_MIN", 64)
    monkeypatch.setattr(mem, "_REPEATED", 64)


@pytest.mark.parametrize("n, block, chunk, runs", [
    (4096, 256, None, 1),          # one chunk, every lane in bounds: one run stored
    (5000, 256, None, 1),          # one ragged chunk: a prefix of its lanes stored
    (300, 1024, None, 0),          # one instance: the index is no larger than its lane range
    (1 << 14, 64, None, 1),
    (6000, 64, 2048, 3),           # chunks of 32, 32 and 30 instances, the last one ragged
])
def test_fill_agrees_with_the_plain_path(monkeypatch, small_thresholds, n, block, chunk, runs):
    if chunk is not None:
        monkeypatch.setattr(interp, "CHUNK_ELEMENTS", chunk)
    program, grid = fill(n, block)
    taken = _took(monkeypatch)
    _, got = _agree(monkeypatch, program, grid, {"in0": np.array([1.5], np.float32)},
                    {"out0": (n + 7, np.float32)})
    out = np.frombuffer(got["out0"], np.float32)
    assert (out[:n] == 1.5).all() and (out[n:] == 0).all()
    assert taken["store"] == 2 * runs          # (with shortcuts: in a packet and out of one)


@pytest.mark.parametrize("n, block", [(4096, 256), (4000, 512)])
def test_an_index_read_as_a_value_is_made_exactly(monkeypatch, small_thresholds, n, block):
    program, grid = scale_index(n, block)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    _, got = _agree(monkeypatch, program, grid, {"x": x}, {"out": (n, np.float32), "idx": (n, np.int64)})
    assert np.array_equal(np.frombuffer(got["out"], np.float32), x * np.float32(2))
    assert np.array_equal(np.frombuffer(got["idx"], np.int64), np.arange(n))


@pytest.mark.parametrize("length, fn, pad", [(4096, "sum", None), (3000, "sum", None), (3000, "sum", -0.0),
                                             (8192, "max", None), (5000, "max", 2.5), (1000, "max", None)])
def test_a_row_reduction_agrees_with_the_plain_path(monkeypatch, small_thresholds, length, fn, pad):
    program, grid = row_sum(length, fn, pad)
    x = (np.random.default_rng(length).standard_normal(length) * 100).astype(np.float32)
    taken = _took(monkeypatch)
    _, got = _agree(monkeypatch, program, grid, {"x": x}, {"out": (1, np.float32)})
    # an unmade Arange, all of it or a prefix (the bounds mask): read as one run
    width = 1 << (length - 1).bit_length()
    assert taken["load"] == (2 if width >= interp.LAZY_RANGE else 0)
    tile = np.full((1, width), (0.0 if fn == "sum" else -np.inf) if pad is None else pad, np.float32)
    tile[0, :length] = x
    want = (np.sum if fn == "sum" else np.max)(tile, axis=-1, keepdims=True)
    assert got["out"] == want.tobytes()


def test_a_full_size_row_sum_reads_in_place_and_agrees(monkeypatch):
    """At the real threshold (4 Mi lanes): the row is read without an index array."""
    length = registers.LAZY_RANGE
    program, grid = row_sum(length)
    x = np.random.default_rng(1).standard_normal(length).astype(np.float32)
    taken = _took(monkeypatch)
    counters, got = _agree(monkeypatch, program, grid, {"x": x}, {"out": (1, np.float32)})
    assert taken["load"] == 2
    assert got["out"] == np.sum(x[None, :], axis=-1, keepdims=True).tobytes()
    assert counters.bytes_read == x.nbytes


def test_a_run_past_its_mapping_faults_as_the_plain_path_does(monkeypatch, small_thresholds):
    from fornax.sim.faults import PageFault
    program, grid = fill(4096, 256)
    for shortcuts in (True, False):
        monkeypatch.setattr(Interpreter, "shortcuts", shortcuts)
        with pytest.raises(PageFault):
            _run(program, grid, {"in0": np.ones(1, np.float32)}, {"out0": (4000, np.float32)}, False)


# -- the write log and host copies --------------------------------------------------------
def test_a_deferred_fill_keeps_one_value_and_lands_the_same_bytes():
    space = Device(load_spec("h100-like")).memory.create_space()
    m = space.map(1 << 20)
    dtype = np.dtype(np.float32)
    for values, compact in ((np.full(1 << 17, np.float32(-0.0)), True),
                            (np.full(1 << 17, np.nan, np.float32), True),
                            (np.arange(1 << 17, dtype=np.float32), False)):
        log = mem.begin_capture()
        space.store_elements(m, dtype, slice(10, 10 + values.size), values)
        mem.end_capture()
        kept = log.effects[0][1][3]
        assert (kept.size == 1) == compact
        log.commit()
        got = space.elements(m, dtype)[10: 10 + values.size]
        assert got.tobytes() == values.tobytes()


def test_an_owned_write_is_kept_without_a_copy_and_a_plain_one_is_copied():
    space = Device(load_spec("tiny")).memory.create_space()
    m = space.map(4096)
    data = np.arange(256, dtype=np.uint8)
    log = mem.begin_capture()
    space.write(m.va, data, owned=True)
    space.write(m.va + 256, data)
    mem.end_capture()
    assert np.shares_memory(log.effects[0][1][2], data)
    assert not np.shares_memory(log.effects[1][1][2], data)
    data[:] = 7                                   # the plain write took its copy at the call
    log.commit()
    assert space.read(m.va + 256, 256) == np.arange(256, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("held", [False, True])
def test_a_host_to_device_copy_is_staged_unless_held(held):
    stack = compose(make_config("cuda-like"))
    rt = stack.runtime
    src = np.arange(1024, dtype=np.float32)
    ptr = rt.malloc(src.nbytes)
    stream = rt.create_stream()
    rt.memcpy_h2d(ptr, src, stream, held=held)
    if not held:
        src[:] = -1                               # after the call: the staged bytes are kept
    rt.stream_synchronize(stream)
    back = np.empty_like(src)
    rt.memcpy_d2h(back, ptr, stream)
    assert np.array_equal(back, np.arange(1024, dtype=np.float32))
    rt.free(ptr)


# -- torch: the paths a 1 GiB create + sum takes, at 2**22 elements --------------------------
@pytest.fixture(scope="module")
def device():
    ft.use_stack("cuda-like")
    return "fornax"


N = 1 << 22


def test_device_sums_are_numpys_sum_of_the_same_tile(device):
    x = torch.randn(N, generator=torch.Generator().manual_seed(0)) * 3
    want = np.sum(x.numpy()[None, :], axis=-1, keepdims=True)[0, 0]
    assert x.to(device).sum().item() == want
    assert torch.ones(N, device=device).sum().item() == float(N)
    assert torch.full((N,), 0.1, device=device).sum().item() == np.sum(np.full((1, N), 0.1, np.float32),
                                                                      axis=-1)[0]
    # a length that is not a power of two: the padded tile
    y = x[: N - 3]
    tile = np.zeros((1, N), np.float32)
    tile[0, : N - 3] = y.numpy()
    assert y.to(device).sum().item() == np.sum(tile, axis=-1)[0]


def test_a_device_factory_fills_every_element(device):
    t = torch.ones(N + 5, device=device)
    assert torch.equal(t.cpu(), torch.ones(N + 5))
    z = torch.full((N,), -0.0, device=device).cpu()
    assert torch.equal(z.view(torch.int32), torch.full((N,), -0.0).view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int8, torch.uint8, torch.bool, torch.complex64])
def test_host_device_host_round_trips_are_exact(device, dtype):
    g = torch.Generator().manual_seed(3)
    if dtype == torch.bool:
        x = torch.rand(N // 4, generator=g) > 0.5
    elif dtype.is_complex:
        x = torch.randn(N // 4, generator=g, dtype=dtype)
    elif dtype.is_floating_point:
        x = (torch.randn(N // 4, generator=g) * 1e3).to(dtype)
    else:
        x = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (N // 4,), generator=g).to(dtype)
    d = x.to(device)
    back = d.cpu()
    assert back.dtype == dtype and torch.equal(back, x)
    back[0] = back[1]                             # the copy is the caller's own, resizable tensor
    back.resize_(N // 2)
    assert torch.equal(d.cpu(), x)


def test_views_and_strided_writes_round_trip(device):
    x = torch.randn(512, 1024, generator=torch.Generator().manual_seed(4))
    d = x.to(device)
    assert torch.equal(d[3:-2].cpu(), x[3:-2])
    assert torch.equal(d[:, ::3].cpu(), x[:, ::3])
    assert torch.equal(d.t().cpu(), x.t())
    d[:, 5:9] = torch.arange(4.0)                 # a strided destination: read, modify, write
    x[:, 5:9] = torch.arange(4.0)
    assert torch.equal(d.cpu(), x)
    d.copy_(x.t().contiguous().t())               # a non-contiguous source
    assert torch.equal(d.cpu(), x)
    src = torch.randn(1024, 512).t()
    d.copy_(src)
    assert torch.equal(d.cpu(), src)


# -- host memory of a host-to-device copy --------------------------------------------------
def test_a_host_to_device_copy_grows_the_host_by_about_its_size():
    from benchmarks.big_tensor import measure
    elements = 1 << 26                            # 256 MiB of float32
    row = measure("cuda-like", "copy", elements)
    assert row["sum_ok"]
    assert row["rss_growth_bytes"] <= 1.5 * row["tensor_bytes"], row
