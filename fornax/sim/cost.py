"""The cost model: a simulated duration for every kernel and copy, and analytic estimates.

A kernel costs ``launch + ramp + max(compute, memory)``:

- **compute**: per dtype, matrix FLOPs over ``matrix_peak x`` the dtype's matrix
  efficiency (``matrix_efficiency_by_dtype`` where the spec lists the dtype, else
  ``matrix_efficiency``) (times the matrix-instruction alignment factor: a tile that is not a
  multiple of the spec's ``matrix_shape`` is padded up to it) plus vector
  FLOPs over ``vector_peak`` (divided by the kernel's lane efficiency: a
  kernel translated from a family with narrower SIMD groups keeps its
  layout, so only part of each hardware group's lanes work); divided by wave efficiency (a grid that does not
  fill its last wave over the compute units leaves units idle) or, for a grid
  smaller than the device, by the fraction of units busy; divided by the
  clock fraction (power or thermal throttling, see :mod:`fornax.sim.power`).
- **memory**: the larger of HBM time and L2 time.  Every load and store goes
  through L2 (``l2_bandwidth``).  HBM sees each distinct byte once (the
  footprint) and the repeated loads of a tiled kernel only when the part of
  the footprint one wave of instances works on does not fit in L2.
- **ramp**: a tiled (software-pipelined) kernel waits one HBM latency for its
  first tiles before the matrix unit starts, once per round of waves that
  the resident instances per unit (occupancy: shared memory and registers a
  tile needs) cannot overlap.
- **launch**: the spec's launch latency.

The analytic models (:func:`gemm_counters`, :func:`gemm_cost`,
:func:`attention_cost`, :func:`copy_estimate`) execute nothing: they count
the same quantities the executor would and price them with the same model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .counters import Counters
from .spec import ChipSpec

#: bytes per element of each dtype name the model knows
ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "tfloat32": 4, "bfloat16": 2, "float16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int64": 8, "int32": 4, "int8": 1, "bool": 1,
}

#: a tiled kernel keeps at least two k-stages in shared memory (double buffering)
PIPELINE_STAGES = 2

#: tile shapes (m, n, k) a vendor GEMM library chooses among; k halves for 4-byte inputs
GEMM_TILES: tuple[tuple[int, int, int], ...] = (
    (128, 256, 64), (256, 128, 64), (128, 128, 64), (128, 64, 64), (64, 128, 64), (64, 64, 64),
)

#: flash attention query x key block
ATTENTION_BLOCK = (128, 128)

#: vector operations per attention score (scale, running max, subtract, exp, running sum)
SOFTMAX_OPS_PER_SCORE = 5

#: the ``sparsity`` a kernel's metadata names when its matrix work is 2:4 structured-sparse
SPARSITY = "2:4"

#: copy kinds :func:`copy_cost` prices
COPY_KINDS = ("h2d", "d2h", "d2d", "peer")


@dataclass(frozen=True)
class KernelCost:
    duration_s: float
    compute_s: float
    memory_s: float
    launch_s: float
    wave_efficiency: float
    bound: str          # "compute", "memory" or "latency"
    ramp_s: float = 0.0
    hbm_bytes: float = 0.0
    l2_bytes: float = 0.0
    matrix_flops: dict[str, float] = field(default_factory=dict)
    vector_flops: dict[str, float] = field(default_factory=dict)
    resident: int = 1               # instances resident per compute unit (occupancy)
    alignment: float = 1.0          # matrix work padded to the instruction shape / counted work
    clock_fraction: float = 1.0
    lane_efficiency: float = 1.0    # lanes of each SIMD group doing the vector work
    #: matrix_flops are dense-equivalent work of a 2:4 sparse instruction (``SPARSITY``)
    sparse: bool = False

    @property
    def flops(self) -> float:
        return sum(self.matrix_flops.values()) + sum(self.vector_flops.values())

    def at_clock(self, fraction: float) -> "KernelCost":
        """The same kernel with compute running at ``fraction`` of the nominal clock."""
        compute = self.compute_s * self.clock_fraction / fraction
        body = max(compute, self.memory_s)
        return replace(self, compute_s=compute, clock_fraction=fraction,
                       duration_s=self.launch_s + self.ramp_s + body,
                       bound=_bound(compute, self.memory_s, self.launch_s + self.ramp_s))


def _bound(compute: float, memory: float, fixed: float) -> str:
    body = max(compute, memory)
    return "latency" if body < fixed else ("compute" if compute >= memory else "memory")


def wave_efficiency(instances: int, units: int) -> float:
    """Fraction of unit-slots doing work across the waves a grid needs."""
    if instances <= 0:
        return 1.0
    waves = math.ceil(instances / units)
    return instances / (waves * units)


def resident_instances(spec: ChipSpec, tile: Sequence[int], itemsize: int, acc_words: int = 1) -> int:
    """Instances of a tiled kernel one compute unit holds at once (at least one).

    A ``(bm, bn, bk)`` tile keeps ``PIPELINE_STAGES`` stages of its A and B
    tiles in shared memory and a ``bm x bn`` accumulator in registers.
    """
    bm, bn, bk = tile
    smem = (bm * bk + bk * bn) * itemsize * PIPELINE_STAGES
    regs = bm * bn * acc_words
    return max(1, min(spec.shared_memory_per_unit // smem, spec.registers_per_unit // regs))


def sparse_matrix_shape(spec: ChipSpec) -> tuple[int, int, int]:
    """The 2:4 sparse matrix instruction's shape: the dense one with twice its K (mma.sp
    m16n8k32 beside mma m16n8k16; smfmac 32x32x16 beside mfma 32x32x8), counted in dense
    K columns of which it reads half."""
    m, n, k = spec.matrix_shape
    return m, n, 2 * k


def alignment_factor(tile: Sequence[int], shape: Sequence[int]) -> float:
    """Matrix work the hardware does for a tile padded to the instruction shape, per counted work."""
    f = 1.0
    for t, s in zip(tile, shape):
        f *= math.ceil(t / s) * s / t
    return f


def _main_dtype(c: Counters) -> str | None:
    if not c.matrix_flops:
        return None
    flops = c.matrix_flops
    return max(flops, key=lambda dtype: flops[dtype])


def kernel_cost(spec: ChipSpec, c: Counters, meta: dict[str, Any] | None = None,
                clock_fraction: float = 1.0) -> KernelCost:
    """Price one kernel from its counters.

    ``meta`` is the program's metadata; a ``tile`` entry (``[bm, bn, bk]``)
    marks a tiled kernel and enables occupancy, matrix-instruction alignment
    and the pipeline ramp; a ``lane_efficiency`` entry (in (0, 1], set by a
    binary translator) slows the vector work; ``sparsity = "2:4"`` marks a
    kernel whose matrix work is :class:`~fornax.sim.isa.SparseDot`: its
    dense-equivalent FLOPs run at the spec's ``sparse_matrix_peak`` (the dense
    peak on a chip without one), padded to :func:`sparse_matrix_shape`.  ``clock_fraction`` scales the
    compute clock.
    """
    units = spec.compute_units
    tile = tuple((meta or {}).get("tile") or ()) or None
    dtype = _main_dtype(c)
    sparse = (meta or {}).get("sparsity") == SPARSITY
    resident, align = 1, 1.0
    if tile is not None and len(tile) == 3:
        itemsize = ITEMSIZE.get(dtype or "float32", 4)
        resident = resident_instances(spec, tile, itemsize, 2 if dtype == "float64" else 1)
        if dtype is not None:
            align = alignment_factor(tile, sparse_matrix_shape(spec) if sparse else spec.matrix_shape)
    else:
        tile = None
    eff = wave_efficiency(c.instances, units)
    # A grid smaller than the device leaves units idle; a larger one is quantised into waves.
    busy = min(1.0, c.instances / units) if c.instances else 1.0
    scale = eff if c.instances >= units else busy
    compute = 0.0
    for dt, flops in c.matrix_flops.items():
        rate = (spec.sparse_peak(dt) if sparse else None) or spec.peak(dt, matrix=True)
        compute += flops * align / (rate * spec.matrix_efficiency_for(dt))
    lanes = (meta or {}).get("lane_efficiency", 1.0)
    if isinstance(lanes, bool) or not isinstance(lanes, (int, float)) or not 0.0 < lanes <= 1.0:
        lanes = 1.0                     # not a translator's stamp: the kernel runs as written
    for dt, flops in c.vector_flops.items():
        compute += flops / (spec.peak(dt, matrix=False) * lanes)
    compute = compute / scale / clock_fraction
    memory, hbm, l2 = _memory_time(spec, c, resident, busy)
    launch = spec.launch_latency_s
    ramp = 0.0
    if tile is not None and c.instances:
        waves = math.ceil(c.instances / units)
        ramp = spec.memory_latency_s * math.ceil(waves / resident)
    body = max(compute, memory)
    return KernelCost(launch + ramp + body, compute, memory, launch, eff,
                      _bound(compute, memory, launch + ramp), ramp, hbm, l2,
                      dict(c.matrix_flops), dict(c.vector_flops), resident, align, clock_fraction,
                      float(lanes), sparse)


def hbm_traffic(spec: ChipSpec, c: Counters, resident: int = 1) -> float:
    """Bytes that reach HBM: the footprint, plus repeated loads L2 cannot hold."""
    total = c.bytes_read + c.bytes_written
    if not (c.read_ranges or c.write_ranges):
        return float(total)                     # no footprint recorded: every byte is distinct
    footprint = min(total, c.footprint_bytes)
    reuse = total - footprint
    if reuse <= 0 or c.instances <= 0:
        return float(footprint)
    # One wave of instances works on its share of the footprint at a time.
    working_set = footprint * min(1.0, spec.compute_units * resident / c.instances)
    miss = 0.0 if working_set <= spec.l2_bytes else 1.0 - spec.l2_bytes / working_set
    return footprint + reuse * miss


def _memory_time(spec: ChipSpec, c: Counters, resident: int, busy: float) -> tuple[float, float, float]:
    total = float(c.bytes_read + c.bytes_written)
    hbm = hbm_traffic(spec, c, resident)
    t = max(hbm / (spec.hbm_bandwidth * spec.memory_efficiency), total / spec.l2_bandwidth)
    return t / busy, hbm, total


def copy_cost(spec: ChipSpec, nbytes: int, direction: str) -> float:
    """Duration of one DMA copy: ``direction`` is h2d, d2h, d2d or peer (one peer link: the
    spec's ``peer_link_bandwidth`` at its ``peer_link_efficiency``)."""
    if direction in ("h2d", "d2h"):
        return spec.copy_latency_s + nbytes / spec.host_link_bandwidth
    if direction == "d2d":
        # read and write both cross HBM
        return spec.copy_latency_s + 2 * nbytes / (spec.hbm_bandwidth * spec.memory_efficiency)
    if direction == "peer":
        return spec.peer_link_latency_s + nbytes / spec.peer_link_achievable
    raise ValueError(f"unknown copy direction {direction!r} (expected one of {', '.join(COPY_KINDS)})")


# ---- analytic estimates ----------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """An analytic estimate: the modelled time and the work it stands for."""

    kind: str
    time_s: float
    flops: float = 0.0              # useful FLOPs (2*m*n*k for a GEMM), not padded work
    bytes: float = 0.0              # bytes the bandwidth figure counts
    cost: KernelCost | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def tflops(self) -> float:
        return self.flops / self.time_s / 1e12 if self.time_s > 0 else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0


def _check_positive(**sizes: object) -> None:
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def itemsize(dtype: str) -> int:
    if dtype not in ITEMSIZE:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(ITEMSIZE)})")
    return ITEMSIZE[dtype]


def _next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


def gemm_counters(m: int, n: int, k: int, batch: int = 1, dtype: str = "bfloat16",
                  tile: tuple[int, int, int] = (128, 256, 64), b_batched: bool = False,
                  clamp: bool = True, sparse: bool = False) -> Counters:
    """What the executor counts for a tiled GEMM kernel, without running it.

    Mirrors ``fornax.layers.codegen.gemm_kernel``: a grid of
    ``ceil(n/bn) x ceil(m/bm) x batch`` instances, each looping over
    ``ceil(k/bk)`` k-steps; every step multiplies a full ``bm x bk`` by
    ``bk x bn`` tile (edge tiles are padded work) and loads only the in-bounds
    elements.  ``clamp`` shrinks the tile to the next power of two of a small
    size, as a size-specialised kernel does.  Integer index arithmetic is not
    counted.  Buffers are laid out back to back from address 0.  ``sparse``: A is a
    compressed 2:4 operand (:mod:`fornax.sim.sparsity`): half its values plus an int32
    metadata word per 32 K columns of a row are loaded, and the matrix work is counted
    dense-equivalent (the sparse instruction's rate prices it).
    """
    _check_positive(m=m, n=n, k=k, batch=batch)
    isz = itemsize(dtype)
    bm, bn, bk = tile
    if clamp:
        bm, bn, bk = min(bm, _next_pow2(m)), min(bn, _next_pow2(n)), min(bk, _next_pow2(k))
    gm, gn = math.ceil(m / bm), math.ceil(n / bn)
    instances = gm * gn * batch
    steps = math.ceil(k / bk)
    c = Counters(instances=instances)
    c.matrix_flops[dtype] = 2.0 * bm * bn * bk * steps * instances
    a_bytes = m * k * isz
    if sparse:
        a_bytes = m * (k // 2) * isz + m * -(-k // 32) * 4
    c.bytes_read = batch * (gn * a_bytes + gm * k * n * isz)
    c.bytes_written = isz * batch * m * n
    a_end = batch * a_bytes
    b_end = a_end + (batch if b_batched else 1) * k * n * isz
    c.read_ranges = {"a": (0, a_end), "b": (a_end, b_end)}
    c.write_ranges = {"c": (b_end, b_end + batch * m * n * isz)}
    return c


def _tile3(tile: Sequence[int]) -> tuple[int, int, int]:
    bm, bn, bk = tile
    return bm, bn, bk


def _fitting_tiles(spec: ChipSpec, dtype: str) -> list[tuple[int, int, int]]:
    isz = itemsize(dtype)
    tiles = [(bm, bn, bk if isz < 4 else bk // 2) for bm, bn, bk in GEMM_TILES]
    fit = [t for t in tiles
           if (t[0] * t[2] + t[2] * t[1]) * isz * PIPELINE_STAGES <= spec.shared_memory_per_unit]
    return fit or [min(tiles, key=lambda t: t[0] * t[1])]


def gemm_cost(spec: ChipSpec, m: int, n: int, k: int, dtype: str = "bfloat16", batch: int = 1,
              tile: tuple[int, int, int] | None = None, clock_fraction: float = 1.0) -> Estimate:
    """Modelled time of a ``batch x (m x k) @ (k x n)`` GEMM.

    Without ``tile`` the model picks, like a library heuristic, the fastest of
    :data:`GEMM_TILES` whose pipeline fits the unit's shared memory.
    """
    _check_positive(m=m, n=n, k=k, batch=batch)
    itemsize(dtype)
    tried: list[tuple[tuple[int, int, int], KernelCost, Counters]] = []
    for t in ([_tile3(tile)] if tile else _fitting_tiles(spec, dtype)):
        c = gemm_counters(m, n, k, batch, dtype, t)
        tried.append((t, kernel_cost(spec, c, {"tile": list(t)}, clock_fraction), c))
    t, cost, c = min(tried, key=lambda e: e[1].duration_s)     # the first of the fastest
    return Estimate("gemm", cost.duration_s, 2.0 * m * n * k * batch,
                    float(c.bytes_read + c.bytes_written), cost,
                    {"m": m, "n": n, "k": k, "batch": batch, "dtype": dtype, "tile": list(t),
                     "instances": c.instances, "bound": cost.bound})


def attention_counters(batch: int, heads: int, seq: int, head_dim: int, causal: bool = False,
                       dtype: str = "bfloat16", block: tuple[int, int] = ATTENTION_BLOCK) -> Counters:
    """What a flash-style attention kernel does: one instance per (batch, head, query block).

    Each instance keeps its query block on chip and streams the key/value
    blocks it needs (all of them, or those at or before the diagonal when
    causal): ``QK^T`` and ``PV`` on the matrix unit, the online softmax on the
    vector unit in float32.  Q, K, V and O are laid out back to back.
    """
    _check_positive(batch=batch, heads=heads, seq=seq, head_dim=head_dim)
    isz = itemsize(dtype)
    br, bc = min(block[0], _next_pow2(seq)), min(block[1], _next_pow2(seq))
    nq, nk = math.ceil(seq / br), math.ceil(seq / bc)
    if causal:
        # query block i needs the key blocks that start at or before its last row
        per_query = [min(nk, math.ceil(min(seq, (i + 1) * br) / bc)) for i in range(nq)]
    else:
        per_query = [nk] * nq
    blocks = sum(per_query)
    kv_rows = sum(min(seq, b * bc) for b in per_query)      # in-bounds key (and value) rows loaded
    bh = batch * heads
    c = Counters(instances=bh * nq)
    c.matrix_flops[dtype] = 4.0 * br * bc * head_dim * blocks * bh
    c.vector_flops["float32"] = float(SOFTMAX_OPS_PER_SCORE * br * bc * blocks * bh)
    c.bytes_read = isz * bh * head_dim * (seq + 2 * kv_rows)
    c.bytes_written = isz * bh * seq * head_dim
    one = bh * seq * head_dim * isz
    c.read_ranges = {"q": (0, one), "k": (one, 2 * one), "v": (2 * one, 3 * one)}
    c.write_ranges = {"o": (3 * one, 4 * one)}
    return c


def attention_cost(spec: ChipSpec, batch: int, heads: int, seq: int, head_dim: int,
                   causal: bool = False, dtype: str = "bfloat16",
                   clock_fraction: float = 1.0) -> Estimate:
    """Modelled time of flash-style attention; FLOPs are ``4*B*H*S^2*D`` (halved when causal)."""
    c = attention_counters(batch, heads, seq, head_dim, causal, dtype)
    br, bc = min(ATTENTION_BLOCK[0], _next_pow2(seq)), min(ATTENTION_BLOCK[1], _next_pow2(seq))
    cost = kernel_cost(spec, c, {"tile": [br, bc, head_dim]}, clock_fraction)
    flops = 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    return Estimate("attention", cost.duration_s, flops, float(c.bytes_read + c.bytes_written), cost,
                    {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim,
                     "causal": causal, "dtype": dtype, "block": [br, bc], "bound": cost.bound})


def copy_estimate(spec: ChipSpec, nbytes: int, kind: str) -> Estimate:
    """Modelled time of one copy.  The bandwidth figure counts, for a device-to-device
    copy, the bytes read plus the bytes written (as bandwidth tests report it)."""
    _check_positive(nbytes=nbytes)
    if kind not in COPY_KINDS:
        raise ValueError(f"unknown copy kind {kind!r} (expected one of {', '.join(COPY_KINDS)})")
    t = copy_cost(spec, nbytes, kind)
    moved = 2 * nbytes if kind == "d2d" else nbytes
    return Estimate("copy", t, 0.0, float(moved), None, {"bytes": nbytes, "kind": kind})
