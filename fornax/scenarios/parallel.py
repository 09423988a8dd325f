"""Data- and tensor-parallel runs of a graph workload over the devices of one stack.

``fornax compose --devices N --parallel dp|tp`` runs every rank for real: rank
``r`` is device ``r`` with its own in-order stream (the communicator's stream of
that rank), its own copy of the compiled plan (one compile, loaded on every
device) and its own buffers; the ranks' results meet through the stack
library's collectives (:mod:`fornax.layers.collectives`), whose copies and
reduction kernels really move and combine the data over the topology.

The two workloads that run split, and how:

``mlp`` (``y = relu(x W1 + b1) W2 + b2``, a forward pass)
    ``dp``: the batch of 64 rows is split into ``N`` equal shards; each rank
    runs the whole MLP on its shard and the shards' outputs are all-gathered,
    so every rank holds the full ``y``.  ``tp``: Megatron's split -- ``W1`` and
    ``b1`` by columns (``hidden / N`` each), ``W2`` by rows; each rank computes
    a partial ``relu(x W1_r + b1_r) W2_r``, an all-reduce sums the partials,
    and every rank adds ``b2`` after it.
``transformer-block`` (a pre-norm block, a forward pass over one sequence)
    ``dp``: a global batch of ``N`` sequences, one per rank (rank 0's is the
    workload's input, the others are drawn from the seed); every rank runs the
    block on its sequence and the outputs are all-gathered.  ``tp``: the
    attention's heads are split (``W_q``, ``W_k``, ``W_v`` by columns, ``W_o``
    by rows) and so is the SwiGLU MLP (``W1``, ``W3`` by columns, ``W2`` by
    rows); an all-reduce follows each row-parallel product, the norms and
    residuals run replicated.

Both workloads are forward-only (they have no loss), so ``dp`` gathers outputs
rather than reducing gradients.  Every result is checked against the float64
reference of the unsplit workload, and every rank's copy of it against rank
0's.  :func:`run` returns the run result, the numerics rows and the report's
``parallel`` section (:func:`section`): per rank its simulated time, compute,
communication and exposed communication, every collective the communicator
ran, and the scaling against the same workload on one device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..layers.errors import ConfigError
from ..layers.framework import ResidentPlan, RunResult
from ..layers.graph import DType, Graph, Value
from .workloads import TOLERANCE, _rms_norm, mlp, transformer_block

#: graph workloads that run split over the devices, and what each split needs of N
SUPPORTED = ("mlp", "transformer-block")


def check(workload: str, framework: str, devices: int, mode: str, meta: bool) -> None:
    """A :class:`ConfigError` naming what is wrong with ``--parallel mode`` for this run."""
    if framework != "graph":
        raise ConfigError(f"--parallel runs graph workloads only, not --framework {framework}",
                          hint=f"drop --framework, and pick one of: {', '.join(SUPPORTED)}")
    if workload == "llama70b-step":
        raise ConfigError("workload llama70b-step sets its own parallelism (tensor-parallel within "
                          "a node, data-parallel across nodes); drop --parallel")
    if workload not in SUPPORTED:
        raise ConfigError(f"workload {workload} does not run split over devices; --parallel runs "
                          f"{', '.join(SUPPORTED)}")
    if devices < 2:
        raise ConfigError(f"--parallel {mode} splits the work over the stack's devices, but it has "
                          f"{devices}", hint="add --devices N with N >= 2")
    if meta:
        raise ConfigError(f"--parallel {mode} runs every rank on real data and checks the result; "
                          "a shape-only (--meta) stack holds none", hint="drop --meta")
    need = _divisors(workload, mode)
    if need and need % devices:
        what = {("mlp", "dp"): "the batch of 64 rows", ("mlp", "tp"): "the 512 hidden columns",
                ("transformer-block", "tp"): "the 4 attention heads"}[(workload, mode)]
        ok = [n for n in range(2, need + 1) if need % n == 0]
        raise ConfigError(f"--parallel {mode} of {workload} splits {what} evenly over the devices; "
                          f"{devices} does not divide {need}",
                          hint=f"use --devices {', '.join(map(str, ok[:6]))}")


def _divisors(workload: str, mode: str) -> int:
    """The size ``N`` must divide (0: any N works)."""
    if workload == "mlp":
        return 64 if mode == "dp" else 512
    return 4 if mode == "tp" else 0


# ---- shard graphs ---------------------------------------------------------------------------------
def _consts(g: Graph) -> dict[str, np.ndarray]:
    return {v.name: np.asarray(v.const) for v in g.constants}


def _mlp_partial(batch: int, d_in: int, hidden: int, d_out: int) -> Graph:
    """One rank's MLP shard: ``relu(x W1_r + b1_r) W2_r`` (weights are inputs: one plan for all)."""
    f32 = DType.FLOAT32
    g = Graph("mlp-tp-shard")
    x = g.input("x", (batch, d_in), f32)
    w1, b1 = g.input("w1", (d_in, hidden), f32), g.input("b1", (hidden,), f32)
    w2 = g.input("w2", (hidden, d_out), f32)
    h = g.op("relu", g.op("add", g.op("matmul", x, w1), b1))
    g.output(g.op("matmul", h, w2), names=["partial"])
    return g


def _add(shape: tuple[int, ...], name: str) -> Graph:
    """``y = a + b`` (a bias or a residual after an all-reduce)."""
    g = Graph(name)
    a = g.input("a", shape, DType.FLOAT32)
    b = g.input("b", shape[-1:] if name.endswith("bias") else shape, DType.FLOAT32)
    g.output(g.op("add", a, b), names=["y"])
    return g


def _attention_partial(seq: int, d: int, heads: int, hd: int) -> Graph:
    """One rank's attention shard: ``heads`` of the block's heads, ending in ``o_r @ W_o,r``."""
    f32 = DType.FLOAT32
    g = Graph("block-tp-attention")
    x = g.input("x", (seq, d), f32)
    gain = g.input("norm1", (d,), f32)
    w = {n: g.input(n, shape, f32) for n, shape in (("wq", (d, heads * hd)), ("wk", (d, heads * hd)),
                                                   ("wv", (d, heads * hd)), ("wo", (heads * hd, d)))}
    eps = g.constant(np.array(1e-5, np.float32), "eps")
    scale = g.constant(np.array(1 / np.sqrt(hd), np.float32), "scale")

    def split_heads(v: Value) -> Value:
        return g.op("transpose", g.op("reshape", v, shape=(seq, heads, hd)), perm=(1, 0, 2))

    h = _rms_norm(g, x, gain, eps)
    q, k, v = (split_heads(g.op("matmul", h, w[n])) for n in ("wq", "wk", "wv"))
    scores = g.op("mul", g.op("matmul", q, g.op("transpose", k, perm=(0, 2, 1))), scale)
    attn = g.op("matmul", g.op("softmax", scores, axis=-1), v)
    merged = g.op("reshape", g.op("transpose", attn, perm=(1, 0, 2)), shape=(seq, heads * hd))
    g.output(g.op("matmul", merged, w["wo"]), names=["partial"])
    return g


def _mlp_block_partial(seq: int, d: int, ff: int) -> Graph:
    """One rank's SwiGLU shard after the attention all-reduce: ``h1 = x + attn`` and
    ``(silu(rms(h1) W1_r) * (rms(h1) W3_r)) W2_r``."""
    f32 = DType.FLOAT32
    g = Graph("block-tp-mlp")
    x, attn = g.input("x", (seq, d), f32), g.input("attn", (seq, d), f32)
    gain = g.input("norm2", (d,), f32)
    w1, w3 = g.input("w1", (d, ff), f32), g.input("w3", (d, ff), f32)
    w2 = g.input("w2", (ff, d), f32)
    eps = g.constant(np.array(1e-5, np.float32), "eps")
    h1 = g.op("add", x, attn)
    n2 = _rms_norm(g, h1, gain, eps)
    a = g.op("matmul", n2, w1)
    gate = g.op("mul", g.op("mul", a, g.op("sigmoid", a)), g.op("matmul", n2, w3))
    g.output(h1, g.op("matmul", gate, w2), names=["h1", "partial"])
    return g


# ---- ranks ------------------------------------------------------------------------------------------
@dataclass
class _Ranks:
    """The communicator over the stack's devices, and each rank's compiled plans."""

    stack: Any
    comm: Any
    plans: dict[tuple[str, int], ResidentPlan] = field(default_factory=dict)
    buffers: list[tuple[int, int]] = field(default_factory=list)      # (rank, address)

    @property
    def size(self) -> int:
        return int(self.comm.size)

    def plan(self, graph: Graph, r: int) -> ResidentPlan:
        """``graph`` compiled (once: the compile cache serves the other ranks) and bound to
        rank ``r``'s device."""
        key = (graph.name, r)
        if key not in self.plans:
            rt = self.stack.runtime
            prev = rt.current_device()
            rt.set_device(self.comm.devices[r])
            try:
                self.plans[key] = self.stack.framework.prepare(graph, self.comm.streams[r])
            finally:
                rt.set_device(prev)
        return self.plans[key]

    def put(self, r: int, array: np.ndarray) -> int:
        ptr = self.comm.malloc(r, max(int(array.nbytes), 4))
        self.buffers.append((r, ptr))
        self.comm.upload(r, ptr, np.ascontiguousarray(array, np.float32))
        return ptr

    def empty(self, r: int, nbytes: int) -> int:
        ptr = self.comm.malloc(r, max(int(nbytes), 4))
        self.buffers.append((r, ptr))
        return ptr

    def call(self, graph: Graph, r: int, ins: list[int], outs: list[int]) -> None:
        """Run ``graph`` on rank ``r`` (its device, its stream): enqueued, not waited for."""
        plan = self.plan(graph, r)
        rt = self.stack.runtime
        prev = rt.current_device()
        rt.set_device(self.comm.devices[r])
        try:
            plan(ins, outs, self.comm.streams[r])
        finally:
            rt.set_device(prev)

    def release(self) -> None:
        rt = self.stack.runtime
        prev = rt.current_device()
        try:
            for plan in self.plans.values():
                plan.release()
            for r, ptr in self.buffers:
                rt.set_device(self.comm.devices[r])
                rt.free(ptr)
        finally:
            rt.set_device(prev)


def _shards(w: np.ndarray, n: int, axis: int) -> list[np.ndarray]:
    return [np.ascontiguousarray(s) for s in np.split(w, n, axis=axis)]


def _mlp_dp(ranks: _Ranks, seed: int) -> tuple[np.ndarray, list[np.ndarray], Graph, dict]:
    g, feeds = mlp(seed)
    n = ranks.size
    x = feeds["x"]
    b = x.shape[0] // n
    shard, _ = mlp(seed, batch=b)                 # the same weights (drawn first), a shard's batch
    shard.name = "mlp-dp-shard"
    d_out = g.outputs[0].shape[1]
    outs = []
    for r in range(n):
        y = ranks.empty(r, b * d_out * 4)
        ranks.call(shard, r, [ranks.put(r, x[r * b:(r + 1) * b])], [y])
        outs.append(y)
    full = [ranks.empty(r, x.shape[0] * d_out * 4) for r in range(n)]
    works = [ranks.comm.rank(r).all_gather(outs[r], full[r], b * d_out) for r in range(n)]
    for w in works:
        w.wait()
    got = [ranks.comm.download(r, full[r], x.shape[0] * d_out).reshape(x.shape[0], d_out)
           for r in range(n)]
    return g.reference(feeds)[0], got, g, {"split": f"batch of {x.shape[0]} rows: {b} per rank; "
                                           "outputs all-gathered"}


def _mlp_tp(ranks: _Ranks, seed: int) -> tuple[np.ndarray, list[np.ndarray], Graph, dict]:
    g, feeds = mlp(seed)
    c = _consts(g)
    n = ranks.size
    x = feeds["x"]
    (d_in, hidden), d_out = c["w1"].shape, c["w2"].shape[1]
    part = _mlp_partial(x.shape[0], d_in, hidden // n, d_out)
    bias = _add((x.shape[0], d_out), "mlp-tp-bias")
    w1s, b1s, w2s = _shards(c["w1"], n, 1), _shards(c["b1"], n, 0), _shards(c["w2"], n, 0)
    count = x.shape[0] * d_out
    sums = []
    for r in range(n):
        s = ranks.empty(r, count * 4)
        ranks.call(part, r, [ranks.put(r, x), ranks.put(r, w1s[r]), ranks.put(r, b1s[r]),
                             ranks.put(r, w2s[r])], [s])
        sums.append(s)
    _all_reduce(ranks, sums, count)
    ys = []
    for r in range(n):
        y = ranks.empty(r, count * 4)
        ranks.call(bias, r, [sums[r], ranks.put(r, c["b2"])], [y])
        ys.append(y)
    got = [ranks.comm.download(r, ys[r], count).reshape(x.shape[0], d_out) for r in range(n)]
    return g.reference(feeds)[0], got, g, {
        "split": f"W1 and b1 by columns, W2 by rows: {hidden // n} of {hidden} hidden units per "
                 "rank; the partial outputs all-reduced, then b2 added"}


def _all_reduce(ranks: _Ranks, bufs: list[int], count: int) -> None:
    """Sum ``bufs`` (one per rank, ``count`` float32 each) in place over the ranks."""
    works = [ranks.comm.rank(r).all_reduce(bufs[r], bufs[r], count) for r in range(ranks.size)]
    for w in works:
        w.wait()


def _block_dp(ranks: _Ranks, seed: int) -> tuple[np.ndarray, list[np.ndarray], Graph, dict]:
    g, feeds = transformer_block(seed)
    n = ranks.size
    seq, d = feeds["x"].shape
    xs = [feeds["x"]] + [np.random.default_rng([seed, r]).standard_normal((seq, d)).astype(np.float32)
                         for r in range(1, n)]
    outs = []
    for r in range(n):
        y = ranks.empty(r, seq * d * 4)
        ranks.call(g, r, [ranks.put(r, xs[r])], [y])
        outs.append(y)
    full = [ranks.empty(r, n * seq * d * 4) for r in range(n)]
    works = [ranks.comm.rank(r).all_gather(outs[r], full[r], seq * d) for r in range(n)]
    for w in works:
        w.wait()
    got = [ranks.comm.download(r, full[r], n * seq * d).reshape(n * seq, d) for r in range(n)]
    ref = np.concatenate([g.reference({"x": xr})[0] for xr in xs])
    return ref, got, g, {"split": f"a global batch of {n} sequences of {seq} tokens, one per "
                                  "rank (rank 0's is the workload's input, the others drawn from "
                                  "the seed); outputs all-gathered"}


def _block_tp(ranks: _Ranks, seed: int) -> tuple[np.ndarray, list[np.ndarray], Graph, dict]:
    g, feeds = transformer_block(seed)
    c = _consts(g)
    n = ranks.size
    seq, d = feeds["x"].shape
    heads, ff = 4, c["w1"].shape[1]
    hd = d // heads
    attn = _attention_partial(seq, d, heads // n, hd)
    mlp_part = _mlp_block_partial(seq, d, ff // n)
    resid = _add((seq, d), "block-tp-residual")
    cols = {k: _shards(c[k], n, 1) for k in ("wq", "wk", "wv", "w1", "w3")}
    rows = {k: _shards(c[k], n, 0) for k in ("wo", "w2")}
    count = seq * d
    xp = [ranks.put(r, feeds["x"]) for r in range(n)]
    a = [ranks.empty(r, count * 4) for r in range(n)]
    for r in range(n):
        ranks.call(attn, r, [xp[r], ranks.put(r, c["norm1"]), *(ranks.put(r, cols[k][r]) for k in
                                                                ("wq", "wk", "wv")),
                             ranks.put(r, rows["wo"][r])], [a[r]])
    _all_reduce(ranks, a, count)
    h1 = [ranks.empty(r, count * 4) for r in range(n)]
    m = [ranks.empty(r, count * 4) for r in range(n)]
    for r in range(n):
        ranks.call(mlp_part, r, [xp[r], a[r], ranks.put(r, c["norm2"]), ranks.put(r, cols["w1"][r]),
                                 ranks.put(r, cols["w3"][r]), ranks.put(r, rows["w2"][r])],
                   [h1[r], m[r]])
    _all_reduce(ranks, m, count)
    ys = []
    for r in range(n):
        y = ranks.empty(r, count * 4)
        ranks.call(resid, r, [h1[r], m[r]], [y])
        ys.append(y)
    got = [ranks.comm.download(r, ys[r], count).reshape(seq, d) for r in range(n)]
    return g.reference(feeds)[0], got, g, {
        "split": f"attention by heads ({heads // n} of {heads} per rank: W_q, W_k, W_v by columns, "
                 f"W_o by rows), the SwiGLU MLP by {ff // n} of {ff} columns (W1, W3 by columns, "
                 "W2 by rows); an all-reduce after each row-parallel product"}


RUNNERS: dict[tuple[str, str], Callable[[_Ranks, int], tuple]] = {
    ("mlp", "dp"): _mlp_dp, ("mlp", "tp"): _mlp_tp,
    ("transformer-block", "dp"): _block_dp, ("transformer-block", "tp"): _block_tp,
}


# ---- the run ---------------------------------------------------------------------------------------
def run(stack, workload: str, mode: str, seed: int) -> tuple[RunResult, list[dict], dict]:
    """Run ``workload`` split ``mode`` over every device of ``stack``: the run result (rank 0's
    output, every compiled plan), the numerics rows and the report's ``parallel`` section."""
    cfg = stack.config
    check(workload, "graph", cfg.devices, mode, cfg.meta)
    t0 = time.perf_counter()
    comm = stack.communicator()
    ranks = _Ranks(stack, comm)
    try:
        ref, got, graph, info = RUNNERS[(workload, mode)](ranks, seed)
        comm.synchronize()
        plans = list({id(p.plan): p.plan for p in ranks.plans.values()}.values())
    finally:
        ranks.release()
    wall = time.perf_counter() - t0
    rows = _numerics(graph, ref, got)
    single = single_device_time(cfg, workload, seed)
    if (workload, mode) == ("transformer-block", "dp"):    # one device runs every sequence in turn
        single *= comm.size
    sec = section(stack, comm, mode, info["split"], single)
    return RunResult([got[0]], [], [], plans, wall), rows, sec


def _numerics(graph: Graph, ref: np.ndarray, got: list[np.ndarray]) -> list[dict]:
    """Rank 0's result against the float64 reference of the unsplit workload, and every other
    rank's copy against rank 0's (they must be equal bit for bit)."""
    v = graph.outputs[0]
    diff = np.abs(got[0].astype(np.float64) - ref)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    tol = TOLERANCE.get(v.dtype, 0.0)
    same = all(np.array_equal(got[0], o) for o in got[1:])
    return [{"output": v.name, "dtype": v.dtype.value, "shape": list(got[0].shape),
             "max_abs_err": max_abs, "max_rel_err": max_rel, "tol": tol,
             "ok": bool(np.isfinite(got[0]).all()) and max_rel <= tol and same}]


def single_device_time(cfg, workload: str, seed: int) -> float:
    """The simulated time of the unsplit workload on one device of the same chip and stack: its
    kernels' span on a fresh one-device stack (uploads and downloads left out)."""
    import dataclasses

    from ..stack import compose
    from .workloads import get_workload

    one = compose(dataclasses.replace(cfg, devices=1, nodes=1, parallel=None, dump_ir=None))
    build = get_workload(workload).build
    assert build is not None                 # SUPPORTED workloads are graph builders
    graph, feeds = build(seed)
    one.run(graph, feeds)
    kernels = [r for r in one.devices[0].timeline.records if r.kind == "kernel"]
    return max(r.end for r in kernels) - min(r.start for r in kernels) if kernels else 0.0


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1.0
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def section(stack, comm, mode: str, split: str, single_s: float) -> dict:
    """``report["parallel"]``: per rank, from its device's timeline -- ``time_s`` from its first
    kernel's start to the end of its last kernel or collective, ``compute_s`` the time a kernel
    of the workload ran, ``communication_s`` the time inside its collectives,
    ``exposed_communication_s`` the collective time no workload kernel overlapped, ``idle_s``
    the time neither ran (the device waited for the host's launches or another rank); and every
    collective the communicator ran (the family's call name, bytes, algorithm, time)."""
    prefix = comm.name.replace("-", "_") + "_"          # the communicator's own reduction kernels
    colls = [r.to_dict() for r in comm.records]
    spans = [(c["start_s"], c["start_s"] + c["time_s"]) for c in colls]
    per_rank = []
    for r, d in enumerate(comm.devices):
        recs = stack.devices[d].timeline.records
        work = [x for x in recs if x.kind == "kernel" and not x.label.startswith(prefix)]
        ends = [x.end for x in recs if x.kind in ("kernel", "collective", "peer")] + [e for _, e in spans]
        start = min(x.start for x in work)
        end = max(ends)
        busy = [(x.start, x.end) for x in work]
        compute, comm_s = _union(busy), _union(spans)
        per_rank.append({"rank": r, "device": d, "time_s": end - start, "compute_s": compute,
                         "communication_s": comm_s,
                         # collective time no kernel of the workload overlapped
                         "exposed_communication_s": _union(busy + spans) - compute,
                         # neither: the device waited for the host or another rank
                         "idle_s": max(0.0, end - start - _union(busy + spans))})
    slowest = max(p["time_s"] for p in per_rank)
    return {"mode": mode, "ranks": comm.size, "devices": list(comm.devices),
            "nodes": stack.config.nodes, "communicator": comm.name, "split": split,
            "per_rank": per_rank,
            "collectives": [{"op": c["op"], "call": c["call"], "bytes": c["bytes"], "count": c["count"],
                             "dtype": c["dtype"], "algorithm": c["algorithm"], "time_s": c["time_s"],
                             "start_s": c["start_s"], "end_s": c["start_s"] + c["time_s"]}
                            for c in colls],
            "communication_bytes": sum(c["bytes"] for c in colls),
            "time_s": slowest, "single_device_time_s": single_s,
            "speedup": single_s / slowest if slowest > 0 else 0.0,
            "notes": ["time_s per rank: its first workload kernel's start to its last kernel's or "
                      "collective's end on the simulated clock; single_device_time_s: the unsplit "
                      "workload's kernels on one device of the same stack; speedup = "
                      "single_device_time_s / the slowest rank's time_s (for the transformer block's dp, one "
                      "device runs the block once per sequence of the global batch)"]}
