"""Collectives over 8 simulated devices: data against numpy, ordering rules, bus bandwidth.

References are computed here with numpy, independently of the library: exact
sums of integer-valued floats (order-free), and for random floats the
summation order ``fornax/layers/collectives.py`` documents (ring: chunk ``c``
summed from rank ``c+1`` round to rank ``c``; tree: pairwise by binomial level).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from fornax.contracts.library import upload_ranks
from fornax.layers.errors import FornaxError
from fornax.stack import compose, make_config
from helpers import FAMILIES

N = 8
VENDORS = list(FAMILIES)
FABRICS = ["switch", "mesh", "ring"]
CALL = {"cuda-like": "ncclAllReduce", "rocm-like": "ncclAllReduce", "xpu-like": "ccl::allreduce"}
GATHER = {"cuda-like": "ncclAllGather", "rocm-like": "ncclAllGather", "xpu-like": "ccl::allgatherv"}
#: (api, name, value) each family reports for: a rank that never joins, disagreeing calls, bad input
MISSING = {"cuda-like": ("ncclResult_t", "ncclRemoteError", 6),
           "rocm-like": ("ncclResult_t", "ncclRemoteError", 6),
           "xpu-like": ("ccl::exception (ccl::status)", "runtime_error", 4)}
MISMATCH = {"cuda-like": ("ncclResult_t", "ncclInvalidUsage", 5),
            "rocm-like": ("ncclResult_t", "ncclInvalidUsage", 5),
            "xpu-like": ("ccl::exception (ccl::status)", "runtime_error", 4)}
INVALID = {"cuda-like": ("ncclResult_t", "ncclInvalidArgument", 4),
           "rocm-like": ("ncclResult_t", "ncclInvalidArgument", 4),
           "xpu-like": ("ccl::exception (ccl::status)", "invalid_arguments", 2)}


@functools.lru_cache(maxsize=None)
def _stack(vendor: str, fabric: str, meta: bool = False):
    return compose(make_config(vendor, spec="tiny", devices=N, topology=fabric, meta=meta))


def comm_for(vendor="cuda-like", fabric="switch", timeout_s=2.0, meta=False):
    return _stack(vendor, fabric, meta).communicator(timeout_s=timeout_s)


def code_of(err):
    return (err.code.api, err.code.name, err.code.value)


put = upload_ranks            # the library contract's helper: one uploaded buffer per rank


def outs(comm, n_elems, dtype="float32"):
    return [comm.malloc(r, n_elems * np.dtype(dtype).itemsize) for r in range(N)]


def get(comm, ptrs, count, dtype="float32"):
    return [comm.download(r, p, count, dtype) for r, p in enumerate(ptrs)]


def ints(count, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, count).astype(dtype) for _ in range(N)]


def ring_order(xs, combine=np.add):
    """The documented ring order: chunk c from rank c+1 round to rank c."""
    out = np.empty_like(xs[0])
    for c, idx in enumerate(np.array_split(np.arange(xs[0].size), N)):
        if idx.size == 0:
            continue
        lo, hi = idx[0], idx[-1] + 1
        acc = xs[(c + 1) % N][lo:hi]
        for k in range(2, N + 1):
            acc = combine(acc, xs[(c + k) % N][lo:hi])
        out[lo:hi] = acc
    return out


def tree_order(xs):
    """Pairwise by binomial level: ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7))."""
    v = list(xs)
    step = 1
    while step < N:
        for i in range(0, N, 2 * step):
            v[i] = v[i] + v[i + step]
        step *= 2
    return v[0]


# -- every collective, every fabric, every family ----------------------------------------------
@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("vendor", VENDORS)
def test_every_collective_returns_numpys_result(vendor, fabric):
    comm = comm_for(vendor, fabric)
    count = 1000                                   # not a multiple of 8: uneven ring chunks
    xs = ints(count, 1)
    send = put(comm, xs)
    total = np.sum(np.stack(xs).astype(np.float64), axis=0)

    for algo in ("ring", "tree"):
        recv = outs(comm, count)
        for r in range(N):
            comm.rank(r).all_reduce(send[r], recv[r], count, "float32", "sum", algorithm=algo)
        for got in get(comm, recv, count):
            np.testing.assert_array_equal(got, total.astype(np.float32))

    big = outs(comm, N * count)
    for r in range(N):
        comm.rank(r).all_gather(send[r], big[r], count)
    for got in get(comm, big, N * count):
        np.testing.assert_array_equal(got, np.concatenate(xs))

    full = ints(N * count, 2)
    fsend, part = put(comm, full), outs(comm, count)
    for r in range(N):
        comm.rank(r).reduce_scatter(fsend[r], part[r], count)
    want = np.sum(np.stack(full).astype(np.float64), axis=0).astype(np.float32)
    for r, got in enumerate(get(comm, part, count)):
        np.testing.assert_array_equal(got, want[r * count:(r + 1) * count])

    for algo in ("ring", "tree"):
        b = outs(comm, count)
        for r in range(N):
            comm.rank(r).broadcast(send[r], b[r], count, root=3, algorithm=algo)
        for got in get(comm, b, count):
            np.testing.assert_array_equal(got, xs[3])

    a2a = outs(comm, N * count)
    for r in range(N):
        comm.rank(r).all_to_all(fsend[r], a2a[r], count)
    for r, got in enumerate(get(comm, a2a, N * count)):
        np.testing.assert_array_equal(
            got, np.concatenate([full[j][r * count:(r + 1) * count] for j in range(N)]))

    dst = comm.malloc(6, count * 4)
    comm.rank(2).send(send[2], count, peer=6)
    comm.rank(6).recv(dst, count, peer=2)
    np.testing.assert_array_equal(comm.download(6, dst, count), xs[2])
    comm.synchronize()


@pytest.mark.parametrize("fabric", FABRICS)
def test_ring_and_tree_sum_random_floats_in_their_documented_order(fabric):
    comm = comm_for("rocm-like", fabric)
    count = 777
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in range(N)]
    send = put(comm, xs)
    ref64 = np.sum(np.stack(xs).astype(np.float64), axis=0)
    for algo, order in (("ring", ring_order(xs)), ("tree", tree_order(xs))):
        recv = outs(comm, count)
        for r in range(N):
            comm.rank(r).all_reduce(send[r], recv[r], count, algorithm=algo)
        for got in get(comm, recv, count):
            np.testing.assert_array_equal(got, order)            # bit-exact, documented order
            np.testing.assert_allclose(got, ref64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int32"])
def test_reductions_and_dtypes(dtype):
    comm = comm_for("xpu-like", "mesh")
    count = 300
    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    xs = [x.astype(npdt) for x in ints(count, 3, np.float64)]
    xs = [(x / 8).astype(npdt) if npdt.kind == "f" else x for x in xs]   # small: exact in fp16
    send = put(comm, xs)
    stack = np.stack([x.astype(np.float64) for x in xs])
    for op, want in (("max", stack.max(0)), ("min", stack.min(0))):
        recv = outs(comm, count, npdt)
        for r in range(N):
            comm.rank(r).all_reduce(send[r], recv[r], count, dtype, op)
        for got in get(comm, recv, count, npdt):
            np.testing.assert_array_equal(got.astype(np.float64), want)
    recv = outs(comm, count, npdt)
    for r in range(N):
        comm.rank(r).all_reduce(send[r], recv[r], count, dtype, "sum", algorithm="ring")
    # low precision: every partial sum of the documented order is rounded to the dtype
    if npdt.itemsize < 4:
        want = ring_order(xs, lambda a, b: (a.astype(np.float32) + b.astype(np.float32)).astype(npdt))
    else:
        want = stack.sum(0).astype(npdt)
    for got in get(comm, recv, count, npdt):
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_avg_and_in_place_and_fewer_elements_than_ranks():
    comm = comm_for("cuda-like", "ring")
    xs = ints(64, 4)
    send = put(comm, xs)
    for r in range(N):                             # in place: send == recv
        comm.rank(r).all_reduce(send[r], send[r], 64, op="avg", algorithm="ring")
    want = (np.sum(np.stack(xs).astype(np.float64), 0) / N).astype(np.float32)
    for got in get(comm, send, 64):
        np.testing.assert_array_equal(got, want)
    tiny = ints(5, 5)                              # 5 elements over 8 ranks: empty chunks
    t = put(comm, tiny)
    for r in range(N):
        comm.rank(r).all_reduce(t[r], t[r], 5, op="max")
    for got in get(comm, t, 5):
        np.testing.assert_array_equal(got, np.max(np.stack(tiny), 0))


# -- time and bus bandwidth -------------------------------------------------------------------
@pytest.mark.parametrize("fabric", FABRICS)
def test_bus_bandwidth_rises_with_message_size(fabric):
    stack = _stack("cuda-like", fabric, True)      # shape-only: costs without data
    comm = stack.communicator()
    spec = stack.spec
    # a ring step on a full mesh is striped over N-1 channels, one per link: all of the port
    link = {"switch": spec.peer_link_achievable, "mesh": spec.peer_link_achievable,
            "ring": spec.peer_link_achievable / 2}[fabric]
    alpha = spec.peer_link_latency_s
    busbw = []
    for k in range(10, 25, 2):                     # 1 KiB .. 16 MiB (the tiny spec has 64 MiB)
        nbytes = 1 << k
        bufs = [comm.malloc(r, nbytes) for r in range(N)]
        for r in range(N):
            comm.rank(r).all_reduce(bufs[r], bufs[r], nbytes // 4, algorithm="ring")
        rec = comm.records[-1]
        assert rec.op == "all_reduce" and rec.bytes == nbytes and rec.algorithm == "ring"
        # 2(N-1) steps, each at least one hop's latency plus a chunk over the ring's link
        assert rec.time_s >= 2 * (N - 1) * (alpha + nbytes / N / link) * (1 - 1e-9)
        assert rec.busbw == pytest.approx(nbytes / rec.time_s * 2 * (N - 1) / N, rel=1e-12)
        busbw.append(rec.busbw)
        for r in range(N):
            stack.runtime.set_device(r)
            stack.runtime.free(bufs[r])
        stack.runtime.set_device(0)
    assert all(b > a for a, b in zip(busbw, busbw[1:])), busbw
    assert busbw[0] < 0.01 * link                  # 1 KiB: latency-bound
    assert 0.6 * link < busbw[-1] <= link          # 16 MiB: near the ring's link bandwidth


def test_small_messages_choose_tree_and_large_ones_ring_on_a_switch():
    comm = comm_for("cuda-like", "switch", meta=True)
    small = [comm.malloc(r, 1024) for r in range(N)]
    large = [comm.malloc(r, 4 << 20) for r in range(N)]
    for r in range(N):
        comm.rank(r).all_reduce(small[r], small[r], 256)
    for r in range(N):
        comm.rank(r).all_reduce(large[r], large[r], 1 << 20)
    a, b = comm.records[-2:]
    assert (a.algorithm, b.algorithm) == ("tree", "ring")
    assert "latency-bound" in a.reason and "bandwidth-bound" in b.reason


def test_collectives_land_in_the_library_report():
    stack = _stack("rocm-like", "switch", False)
    comm = stack.communicator()
    xs = ints(256, 6)
    send = put(comm, xs)
    before = len(stack.library.report()["collectives"])
    for r in range(N):
        comm.rank(r).all_gather(send[r], outs(comm, N * 256)[r], 256)
    rec = stack.library.report()["collectives"][before]
    assert rec["call"] == "ncclAllGather" and rec["bytes"] == N * 256 * 4
    assert rec["busbw"] == pytest.approx(rec["bytes"] / rec["time_s"] * (N - 1) / N, rel=1e-12)
    assert rec["copies"] == N * (N - 1)


# -- ordering rules and the watchdog ----------------------------------------------------------
@pytest.mark.parametrize("vendor", VENDORS)
def test_a_rank_that_skips_a_collective_is_diagnosed_not_hung(vendor):
    comm = comm_for(vendor, "switch", timeout_s=3.0)
    xs = ints(128, 8)
    send = put(comm, xs)
    works = [comm.rank(r).all_reduce(send[r], send[r], 128) for r in range(N) if r != 5]
    comm.rank(5).synchronize()                     # the skipping rank itself is not blocked
    assert not works[0].is_completed()
    with pytest.raises(FornaxError) as err:
        works[0].wait()
    e = err.value
    assert code_of(e) == MISSING[vendor]
    assert f"rank 5 never called {CALL[vendor]}" in e.message
    assert "ranks 0, 1, 2, 3, 4, 6, 7 wait in" in e.message and "call #1" in e.message
    assert "after 3 s of simulated time" in e.message
    # the blocked ranks' streams sat in the collective for the timeout
    tl = _stack(vendor, "switch", False).devices[0].timeline
    rec = [x for x in tl.records if "watchdog" in x.label][-1]
    assert rec.end - rec.start == pytest.approx(3.0)
    with pytest.raises(FornaxError, match="aborted"):   # the communicator stays aborted
        comm.rank(0).all_gather(send[0], send[0], 16)


@pytest.mark.parametrize("vendor", VENDORS)
def test_mismatched_sizes_are_diagnosed_naming_the_rank(vendor):
    comm = comm_for(vendor, "mesh")
    send = [comm.malloc(r, 8192) for r in range(N)]
    for r in range(N):
        comm.rank(r).all_reduce(send[r], send[r], 2048 if r == 3 else 1024)
    with pytest.raises(FornaxError) as err:
        comm.synchronize()
    e = err.value
    assert code_of(e) == MISMATCH[vendor]
    assert "rank 3 waits in" in e.message and "count=2048" in e.message
    assert "ranks 0, 1, 2, 4, 5, 6, 7 wait in" in e.message and "count=1024" in e.message


def test_a_rank_that_skips_one_call_and_makes_the_next_is_a_mismatch():
    comm = comm_for("cuda-like", "ring")
    xs = ints(64, 9)
    send = put(comm, xs)
    big = outs(comm, N * 64)
    for r in range(N):
        if r != 2:
            comm.rank(r).all_reduce(send[r], send[r], 64)
    comm.rank(2).all_gather(send[2], big[2], 64)
    with pytest.raises(FornaxError) as err:
        comm.synchronize()
    assert code_of(err.value) == MISMATCH["cuda-like"]
    assert f"rank 2 waits in {GATHER['cuda-like']}(count=64, float32) (its call #1)" in err.value.message


def test_a_send_without_its_recv_is_diagnosed():
    comm = comm_for("xpu-like", "switch")
    buf = [comm.malloc(r, 256) for r in range(N)]
    w = comm.rank(1).send(buf[1], 64, peer=4)
    with pytest.raises(FornaxError) as err:
        w.wait()
    assert code_of(err.value) == MISSING["xpu-like"]
    assert "rank 1 waits in ccl::send" in err.value.message and "rank 4 has no matching" in err.value.message


@pytest.mark.parametrize("vendor", VENDORS)
def test_bad_arguments_fail_at_the_call(vendor):
    comm = comm_for(vendor, "switch")
    buf = comm.malloc(0, 1024)
    cases = [dict(send=buf, recv=buf, count=64, dtype="int8"),
             dict(send=buf, recv=buf, count=64, op="prod"),
             dict(send=buf, recv=buf, count=1 << 20),                  # past the allocation
             dict(send=buf, recv=buf, count=64, algorithm="butterfly")]
    for kw in cases:
        with pytest.raises(FornaxError) as err:
            comm.rank(0).all_reduce(**kw)
        assert code_of(err.value) == INVALID[vendor], kw
        assert "rank 0" in err.value.message
    with pytest.raises(FornaxError) as err:
        comm.rank(0).broadcast(buf, buf, 16, root=N)
    assert code_of(err.value) == INVALID[vendor]
    with pytest.raises(FornaxError) as err:
        comm.rank(N)
    assert code_of(err.value) == INVALID[vendor]
    with pytest.raises(FornaxError):
        _stack(vendor, "switch", False).communicator(devices=[0, 0])
    comm.synchronize()                             # nothing was enqueued: nothing pending


def test_back_to_back_collectives_on_one_buffer_are_ordered():
    comm = comm_for("cuda-like", "mesh")
    xs = ints(512, 10)
    buf = put(comm, xs)
    for algo in ("tree", "ring", "tree"):         # in place, each reading what the last wrote
        for r in range(N):
            comm.rank(r).all_reduce(buf[r], buf[r], 512, algorithm=algo)
    want = np.sum(np.stack(xs).astype(np.float64), 0) * N * N
    for got in get(comm, buf, 512):
        np.testing.assert_array_equal(got, want.astype(np.float32))
    a, b, c = comm.records[-3:]
    assert b.start_s >= a.start_s + a.time_s and c.start_s >= b.start_s + b.time_s
