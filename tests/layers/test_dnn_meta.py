"""Cost estimates of the DNN library kernels (layers/codegen_dnn.py) and shape-only stacks.

Every DNN kernel carries an estimate a shape-only (meta) device prices instead of running
it.  The reference here is the executor itself: each routine runs on a data-mode stack with
the device's ``run_kernel`` wrapped, so every launch's real counters (counted lane by lane
while the kernel runs) are compared with what ``estimate_counters`` predicts for the same
program, grid and arguments.  The estimates are exact by construction (masks only switch
memory lanes off; arithmetic runs on whole tiles), so instances, FLOPs per dtype, bytes and
footprints must be equal, not close.  The geometries exercise what changes the counts:
padding, stride, dilation and groups, ragged edge tiles, causal masks, non-power-of-two
rows, and kernels reused for another batch*heads / row count / fill length than they were
built for (``per_slice`` and per-instance estimates).

Then each routine runs on a meta stack with ``runtime.malloc``'d buffers and its kernel
durations are compared with data mode's (no data moves in either run, so the timelines
match; the tolerance of 2 % only leaves room for clock state, the counts being equal).
"""

from __future__ import annotations

import pytest

from fornax.sim.device import estimate_counters
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = FAMILIES
ITEM = {"float32": 4, "float16": 2, "bfloat16": 2}


class Bench:
    """A tiny-spec stack (data or meta) that records every kernel the device runs."""

    def __init__(self, vendor: str, meta: bool):
        self.stack = compose(make_config(vendor, spec="tiny", meta=meta))
        self.rt, self.lib = self.stack.runtime, self.stack.library
        self.runs: list = []
        dev = self.stack.devices[0]
        real = dev.run_kernel

        def run_kernel(space, program, grid, args):
            counters, cost = real(space, program, grid, args)
            self.runs.append((program, tuple(grid), dict(args), counters))
            return counters, cost

        dev.run_kernel = run_kernel
        self.ptrs: list[int] = []

    def buf(self, count: int, dtype: str = "float32") -> int:
        p = self.rt.malloc(max(1, count * (8 if dtype == "int64" else ITEM[dtype])))
        self.ptrs.append(p)
        return p

    def call(self, fn) -> tuple[list, list]:
        """Run ``fn(bench)``; return the device runs and the driver's kernel records it made."""
        r0, k0 = len(self.runs), len(self.stack.driver.kernel_log)
        fn(self)
        self.rt.synchronize()
        out = self.runs[r0:], self.stack.driver.kernel_log[k0:]
        for p in self.ptrs:
            self.rt.free(p)
        self.ptrs = []
        return out


# ---- the routines, each as a call on a bench --------------------------------------------------
def conv(pass_: str, dtype: str, **geo):
    p = dict(geo, dtype=dtype)
    n, c, h, w, k, r, s = (p[x] for x in "nchwkrs")
    st, pad, dil = ((v, v) if isinstance(v, int) else v
                    for v in (p.get("stride", 1), p.get("padding", 0), p.get("dilation", 1)))
    out_h = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // st[0] + 1
    out_w = (w + 2 * pad[1] - dil[1] * (s - 1) - 1) // st[1] + 1
    xs, ws, ys = n * c * h * w, k * (c // p.get("groups", 1)) * r * s, n * k * out_h * out_w

    def run(b: Bench):
        if pass_ == "fwd":
            b.lib.conv2d_fwd(b.buf(xs, dtype), b.buf(ws, dtype), b.buf(ys, dtype), p)
        elif pass_ == "bwd_data":
            b.lib.conv2d_bwd_data(b.buf(ys, dtype), b.buf(ws, dtype), b.buf(xs, dtype), p)
        else:
            b.lib.conv2d_bwd_weights(b.buf(xs, dtype), b.buf(ys, dtype), b.buf(ws, dtype), p)
    return run


def attention(backward: bool, dtype: str, batch: int, heads: int, sq: int, sk: int, d: int,
              causal: bool):
    p = dict(batch=batch, heads=heads, seq_q=sq, seq_k=sk, head_dim=d, causal=causal, dtype=dtype)
    bh = batch * heads

    def run(b: Bench):
        q, k, v, o = (b.buf(bh * s * d, dtype) for s in (sq, sk, sk, sq))
        lse = b.buf(bh * sq)
        if not backward:
            b.lib.attention_fwd(q, k, v, o, lse, p)
        else:
            b.lib.attention_bwd(q, k, v, o, b.buf(bh * sq * d, dtype), lse, b.buf(bh * sq * d, dtype),
                                b.buf(bh * sk * d, dtype), b.buf(bh * sk * d, dtype), p)
    return run


def norm(kind: str, backward: bool, dtype: str, rows: int, cols: int):
    p = dict(rows=rows, cols=cols, dtype=dtype)

    def run(b: Bench):
        x, g, y = b.buf(rows * cols, dtype), b.buf(cols, dtype), b.buf(rows * cols, dtype)
        rstd = b.buf(rows)
        if kind == "layer" and not backward:
            b.lib.layer_norm_fwd(x, g, b.buf(cols, dtype), y, b.buf(rows), rstd, p)
        elif kind == "layer":
            b.lib.layer_norm_bwd(y, x, g, b.buf(rows), rstd, b.buf(rows * cols, dtype),
                                 b.buf(cols, dtype), b.buf(cols, dtype), p)
        elif not backward:
            b.lib.rms_norm_fwd(x, g, y, rstd, p)
        else:
            b.lib.rms_norm_bwd(y, x, g, rstd, b.buf(rows * cols, dtype), b.buf(cols, dtype), p)
    return run


def softmax(backward: bool, log: bool, dtype: str, rows: int, cols: int):
    p = dict(rows=rows, cols=cols, dtype=dtype, log=log)

    def run(b: Bench):
        if not backward:
            b.lib.softmax_fwd(b.buf(rows * cols, dtype), b.buf(rows * cols, dtype), p)
        else:
            b.lib.softmax_bwd(*(b.buf(rows * cols, dtype) for _ in range(3)), p)
    return run


def pool(backward: bool, mode: str, dtype: str, n: int, c: int, h: int, w: int, kernel, stride,
         padding):
    p = dict(n=n, c=c, h=h, w=w, kernel=kernel, stride=stride, padding=padding, mode=mode, dtype=dtype)
    (r, s), (sh, sw), (ph, pw) = ((v, v) if isinstance(v, int) else v for v in (kernel, stride, padding))
    outs = n * c * ((h + 2 * ph - r) // sh + 1) * ((w + 2 * pw - s) // sw + 1)

    def run(b: Bench):
        idx = b.buf(outs, "int64") if mode == "max" else None
        if not backward:
            b.lib.pool2d_fwd(b.buf(n * c * h * w, dtype), b.buf(outs, dtype), p, indices=idx)
        else:
            b.lib.pool2d_bwd(b.buf(outs, dtype), b.buf(n * c * h * w, dtype), p, indices=idx)
    return run


CASES = {
    # convolution: padding, stride, dilation, groups, ragged tiles; a filter tap that never
    # lands inside the image for some outputs; a filter that reaches past every border
    "conv_fwd": conv("fwd", "float32", n=2, c=6, h=9, w=7, k=4, r=3, s=3, padding=1, stride=2),
    "conv_fwd_groups_dil": conv("fwd", "float16", n=1, c=4, h=10, w=11, k=6, r=3, s=2, padding=(2, 0),
                                dilation=2, groups=2),
    "conv_fwd_pad_only": conv("fwd", "float32", n=1, c=1, h=1, w=3, k=2, r=2, s=1, padding=(5, 0),
                              dilation=(10, 1)),
    "conv_bwd_data": conv("bwd_data", "float32", n=2, c=6, h=9, w=7, k=4, r=3, s=3, padding=1, stride=2),
    "conv_bwd_data_groups": conv("bwd_data", "bfloat16", n=1, c=4, h=8, w=9, k=6, r=3, s=3, padding=2,
                                 stride=(2, 3), dilation=2, groups=2),
    "conv_bwd_weights": conv("bwd_weights", "float32", n=2, c=6, h=9, w=7, k=4, r=3, s=3, padding=1,
                             stride=2),
    "conv_bwd_weights_groups": conv("bwd_weights", "float16", n=3, c=4, h=6, w=5, k=2, r=2, s=3,
                                    padding=(0, 1), dilation=(1, 2), groups=2),
    # several row and column tiles (every A tile is loaded once per column tile, every B
    # tile once per row tile), whatever tile the heuristic picks (at most 128 x 64)
    "conv_fwd_tiles": conv("fwd", "float32", n=2, c=3, h=9, w=9, k=72, r=3, s=3, padding=1),
    "conv_bwd_data_tiles": conv("bwd_data", "float16", n=2, c=72, h=9, w=9, k=3, r=3, s=3, padding=1,
                                stride=2),
    "conv_bwd_weights_tiles": conv("bwd_weights", "float32", n=1, c=8, h=5, w=5, k=136, r=3, s=3,
                                   padding=(1, 2), dilation=(2, 1)),
    # attention: ragged query / key tiles, causal, batch*heads reused (per_slice)
    "attention_fwd_tiles": attention(False, "float32", 1, 2, 150, 70, 64, True),
    "attention_bwd_tiles": attention(True, "float16", 2, 1, 150, 70, 64, False),
    "attention_fwd": attention(False, "float32", 1, 1, 37, 70, 64, False),
    "attention_fwd_reused": attention(False, "float32", 2, 3, 37, 70, 64, False),
    "attention_fwd_causal": attention(False, "float16", 2, 1, 50, 50, 64, True),
    "attention_bwd": attention(True, "float32", 1, 2, 45, 33, 64, False),
    "attention_bwd_causal_reused": attention(True, "bfloat16", 3, 1, 45, 33, 64, True),
    # row kernels: non-power-of-two and power-of-two rows, one program reused for other row counts
    "layer_norm_fwd": norm("layer", False, "float32", 5, 48),
    "layer_norm_fwd_reused": norm("layer", False, "float32", 11, 48),
    "layer_norm_bwd": norm("layer", True, "float16", 7, 33),
    "layer_norm_bwd_reused": norm("layer", True, "float16", 2, 33),
    "rms_norm_fwd": norm("rms", False, "bfloat16", 6, 64),
    "rms_norm_bwd": norm("rms", True, "float32", 9, 20),
    "softmax_fwd": softmax(False, False, "float32", 7, 100),
    "log_softmax_fwd": softmax(False, True, "float16", 3, 64),
    "softmax_bwd": softmax(True, False, "float32", 4, 37),
    "log_softmax_bwd": softmax(True, True, "float32", 10, 37),
    # pooling: padding, overlapping and strided windows, a ragged last block
    "max_pool_fwd_tiles": pool(False, "max", "float32", 2, 4, 16, 17, 2, 2, 0),
    "max_pool_fwd": pool(False, "max", "float32", 2, 3, 9, 11, 3, 2, 1),
    "avg_pool_fwd": pool(False, "avg", "float16", 1, 5, 8, 7, (2, 3), (2, 1), (1, 0)),
    "max_pool_bwd": pool(True, "max", "float32", 2, 3, 9, 11, 3, 2, 1),
    "avg_pool_bwd": pool(True, "avg", "float32", 1, 5, 8, 7, (2, 3), (3, 1), (1, 1)),
}
ROUTINES = {  # the kernels each case must launch (fill: the zeroing before a store_reduce)
    "attention_bwd": 2, "attention_bwd_causal_reused": 2, "attention_bwd_tiles": 2, "layer_norm_bwd": 3,
    "layer_norm_bwd_reused": 3, "rms_norm_bwd": 2}

_BENCHES: dict = {}


def bench(vendor: str, meta: bool) -> Bench:
    if (vendor, meta) not in _BENCHES:
        _BENCHES[(vendor, meta)] = Bench(vendor, meta)
    return _BENCHES[(vendor, meta)]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("vendor", VENDORS)
def test_estimate_equals_the_executors_counters(vendor, case):
    runs, _ = bench(vendor, False).call(CASES[case])
    assert len(runs) == ROUTINES.get(case, 1)
    if case.endswith("_tiles"):                 # the geometry really spans several tiles
        assert all(g > 1 for g in runs[-1][1][:2 if "pool" not in case else 1]), runs[-1][1]
    for program, grid, args, real in runs:
        est = estimate_counters(program, grid, args)
        where = f"{program.name} on grid {grid}"
        assert est.instances == real.instances, where
        assert est.matrix_flops == real.matrix_flops, where
        assert est.vector_flops == real.vector_flops, where
        assert est.bytes_read == real.bytes_read, where
        assert est.bytes_written == real.bytes_written, where
        assert est.read_ranges == real.read_ranges, where
        # the fill kernel writes every byte of its range once, so it leaves its footprint out
        if program.meta["estimate"]["kind"] != "outputs":
            assert est.write_ranges == real.write_ranges, where
        else:
            assert est.bytes_written == sum(hi - lo for lo, hi in real.write_ranges.values())


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("vendor", VENDORS)
def test_routine_runs_on_a_shape_only_stack_at_data_mode_cost(vendor, case):
    _, data = bench(vendor, False).call(CASES[case])
    runs, meta = bench(vendor, True).call(CASES[case])
    assert [k.name for k in meta] == [k.name for k in data]
    assert [k.grid for k in meta] == [k.grid for k in data]
    for m, d in zip(meta, data):
        assert m.bytes == d.bytes, m.name
        assert m.flops == d.flops, m.name
        assert m.duration_s == pytest.approx(d.duration_s, rel=0.02), m.name


def test_meta_stack_prices_a_convolution_too_large_to_execute():
    """A ResNet-sized convolution (3.7 GFLOP of useful work) on an H200-like meta stack: priced
    from the estimate in no time; its matrix work is the true convolution's, up to tile padding."""
    st = compose(make_config("cuda-like", spec="h200-like", meta=True))
    rt, lib = st.runtime, st.library
    n, c, h, w, k = 32, 64, 56, 56, 64
    x, wt, y = rt.malloc(n * c * h * w * 2), rt.malloc(k * c * 9 * 2), rt.malloc(n * k * h * w * 2)
    lib.conv2d_fwd(x, wt, y, dict(n=n, c=c, h=h, w=w, k=k, r=3, s=3, padding=1, dtype="bfloat16"))
    rt.synchronize()
    rec = st.driver.kernel_log[-1]
    useful = 2.0 * n * h * w * k * c * 9
    assert useful <= rec.flops
    # x is read once per column tile with its padding taps off, w once per row tile, y written once
    assert rec.bytes >= (n * c * h * w + k * c * 9 + n * k * h * w) * 2
    spec = rt.driver.device_spec(0)
    assert rec.duration_s >= useful / spec.peak("bfloat16", matrix=True)
