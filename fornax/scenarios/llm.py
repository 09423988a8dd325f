"""One training step of a Llama-2-70B-like decoder, tensor-parallel, in the graph IR.

:func:`build_step` writes one rank's shard of a whole training step as one
graph: forward, loss, and the backward pass spelled out op by op (no
autodiff).  The model is a decoder-only transformer like Llama 2 70B:

* ``layers`` blocks of pre-norm attention and MLP with residual connections;
* RMSNorm (``x * rsqrt(mean(x^2) + eps) * g``) before attention, before the
  MLP and after the last block;
* grouped-query attention: ``heads`` query heads of ``d_model / heads``,
  ``kv_heads`` key/value heads, each shared by ``heads / kv_heads`` query
  heads; causal, softmax in fp32;
* SwiGLU MLP ``(silu(x W1) * (x W3)) W2`` of width ``ffn``;
* an input embedding and an untied output head over ``vocab`` tokens, and a
  cross-entropy loss (mean over tokens) from a log-softmax built from ops.

What it leaves out: rotary position embeddings (attention has no position
signal beyond the causal mask), dropout, and the optimizer update (the step
ends with the gradients).  The embedding lookup is written gather-free, as
``onehot(tokens) @ E`` (and its gradient as ``onehot^T @ dX``), since the IR
has no gather; the labels come in one-hot too.

Tensor parallelism is Megatron's: on ``tp`` ranks each rank holds
``heads/tp`` query heads, ``kv_heads/tp`` key/value heads and ``ffn/tp`` MLP
columns -- W_q, W_k, W_v, W1, W3 are column-parallel, W_o and W2
row-parallel -- so each block's forward ends its attention and its MLP with
an ``all_reduce(ranks=tp)`` of the ``batch*seq x d_model`` activations, and
the backward pass all-reduces the gradients of the two normalised inputs
(the mirror image): four all-reduces per layer.  The embedding, the norms and
the output head are replicated (every rank computes them in full; their
gradients are the same on every rank).

Precision is mixed: weights and activations in ``dtype`` (bfloat16 for the
real model), matmuls accumulate in fp32 (the GEMM kernels do), and the
softmax, the RMSNorm statistics, the log-softmax and the loss are computed in
float32 with ``cast``.  Elementwise chains are ordered so the compiler's
producer-consumer fusion keeps each norm, softmax and their backward passes
in one kernel.

:func:`simulate_step` runs the step on a shape-only (meta) stack of
``devices`` chips joined by a topology (``tp``-wide tensor-parallel groups
within a node, data-parallel across them): every rank's timeline is
simulated, each device with its own compute stream and communication queues,
every all-reduce joining its group (:mod:`.step_ranks`).
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..layers.compiler import KernelStep, LibraryStep
from ..layers.driver import Marker
from ..layers.errors import ConfigError, FornaxError
from ..layers.framework import MetaArray
from ..layers.graph import DType, Graph, Value
from ..sim.timeline import Packet, Semaphore
from .step_ranks import CostTap, StepRanks

F32 = DType.FLOAT32


@dataclass(frozen=True)
class LlamaConfig:
    """Model and parallelism sizes (defaults: Llama 2 70B, sequence 4096, micro-batch 1, tp 8)."""

    layers: int = 80
    d_model: int = 8192
    heads: int = 64
    kv_heads: int = 8
    ffn: int = 28672
    vocab: int = 32000
    seq: int = 4096
    batch: int = 1
    tp: int = 8
    dtype: DType = DType.BFLOAT16
    eps: float = 1e-5

    def __post_init__(self):
        object.__setattr__(self, "dtype", DType.of(self.dtype))
        for name in ("layers", "d_model", "heads", "kv_heads", "ffn", "vocab", "seq", "batch", "tp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"llama config: {name} must be a positive integer, got {v!r}")
        checks = [(self.d_model % self.heads == 0, "d_model must be a multiple of heads"),
                  (self.heads % self.kv_heads == 0, "heads must be a multiple of kv_heads"),
                  (self.heads % self.tp == 0, "heads must be a multiple of tp"),
                  (self.kv_heads % self.tp == 0, "kv_heads must be a multiple of tp"),
                  (self.ffn % self.tp == 0, "ffn must be a multiple of tp"),
                  (self.dtype.is_float, "dtype must be a floating-point dtype")]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"llama config: {msg} ({self.describe()})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def describe(self) -> str:
        return (f"layers={self.layers} d_model={self.d_model} heads={self.heads} "
                f"kv_heads={self.kv_heads} ffn={self.ffn} vocab={self.vocab} seq={self.seq} "
                f"batch={self.batch} tp={self.tp} dtype={self.dtype.value}")

    def params(self) -> int:
        """Parameters of the whole (unsharded) model."""
        d, hd = self.d_model, self.head_dim
        attn = d * self.heads * hd * 2 + d * self.kv_heads * hd * 2
        per_layer = attn + 3 * d * self.ffn + 2 * d
        return self.layers * per_layer + 2 * self.vocab * d + d

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight of one rank's shard, by name, in the order the graph takes them."""
        d, hd, t = self.d_model, self.head_dim, self.tp
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab, d)}
        for i in range(self.layers):
            shapes.update({f"l{i}.attn_norm": (d,), f"l{i}.wq": (d, self.heads // t * hd),
                           f"l{i}.wk": (d, self.kv_heads // t * hd),
                           f"l{i}.wv": (d, self.kv_heads // t * hd),
                           f"l{i}.wo": (self.heads // t * hd, d), f"l{i}.mlp_norm": (d,),
                           f"l{i}.w1": (d, self.ffn // t), f"l{i}.w3": (d, self.ffn // t),
                           f"l{i}.w2": (self.ffn // t, d)})
        shapes.update({"final_norm": (d,), "head": (d, self.vocab)})
        return shapes


# ---- building the graph -----------------------------------------------------------------
class _Builder:
    def __init__(self, cfg: LlamaConfig, name: str):
        self.cfg = cfg
        self.g = Graph(name)
        self.dt = cfg.dtype
        self._consts: dict[tuple, Value] = {}

    def op(self, name: str, *args: Value, **attrs) -> Value:
        return self.g.op(name, *args, **attrs)

    def c(self, value: float, dtype: DType) -> Value:
        key = (float(value), dtype)
        if key not in self._consts:
            self._consts[key] = self.g.constant(np.array(value, dtype=dtype.numpy), "k")
        return self._consts[key]

    def cast(self, x: Value, dtype: DType) -> Value:
        return x if x.dtype is dtype else self.op("cast", x, dtype=dtype.value)

    def mm(self, a: Value, b: Value) -> Value:
        return self.op("matmul", a, b)

    def t(self, x: Value) -> Value:
        """Transpose of the last two dims (materialised: the IR's matmul takes no flags)."""
        perm = tuple(range(len(x.shape) - 2)) + (len(x.shape) - 1, len(x.shape) - 2)
        return self.op("transpose", x, perm=perm)

    def all_reduce(self, x: Value) -> Value:
        return self.op("all_reduce", x, ranks=self.cfg.tp)

    # -- head layouts ----------------------------------------------------------------
    def split_heads(self, x: Value, n: int, transposed: bool = False) -> Value:
        """``(T, n*hd)`` -> ``(B*n, S, hd)`` (or ``(B*n, hd, S)`` when ``transposed``)."""
        c = self.cfg
        b, s, hd = c.batch, c.seq, c.head_dim
        if b == 1:
            x = self.op("reshape", x, shape=(s, n, hd))
            return self.op("transpose", x, perm=(1, 2, 0) if transposed else (1, 0, 2))
        x = self.op("reshape", x, shape=(b, s, n, hd))
        x = self.op("transpose", x, perm=(0, 2, 3, 1) if transposed else (0, 2, 1, 3))
        return self.op("reshape", x, shape=(b * n, hd, s) if transposed else (b * n, s, hd))

    def merge_heads(self, x: Value, n: int) -> Value:
        """``(B*n, S, hd)`` -> ``(T, n*hd)``."""
        c = self.cfg
        b, s, hd = c.batch, c.seq, c.head_dim
        if b == 1:
            return self.op("reshape", self.op("transpose", x, perm=(1, 0, 2)), shape=(s, n * hd))
        x = self.op("reshape", x, shape=(b, n, s, hd))
        return self.op("reshape", self.op("transpose", x, perm=(0, 2, 1, 3)), shape=(b * s, n * hd))

    def expand_kv(self, x: Value, kv: int, group: int) -> Value:
        """``(B*kv, A, C)`` -> ``(B*kv*group, A, C)``: each kv head serves ``group`` query heads."""
        if group == 1:
            return x
        _, a, c = x.shape
        b = self.cfg.batch
        x = self.op("reshape", x, shape=(b * kv, 1, a, c))
        x = self.op("broadcast_to", x, shape=(b * kv, group, a, c))
        return self.op("reshape", x, shape=(b * kv * group, a, c))

    def reduce_kv(self, x: Value, kv: int, group: int) -> Value:
        """The gradient of :meth:`expand_kv`: sum over each kv head's query heads."""
        if group == 1:
            return x
        _, a, c = x.shape
        x = self.op("reshape", x, shape=(self.cfg.batch * kv, group, a, c))
        return self.op("reduce_sum", x, axis=1, keepdims=False)

    # -- blocks -------------------------------------------------------------------------
    def rmsnorm(self, x: Value, w: Value) -> tuple[Value, Value]:
        """``(x * r) * w`` with ``r = rsqrt(mean(x^2) + eps)`` in fp32; returns (y, r)."""
        xf = self.cast(x, F32)
        ms = self.op("reduce_mean", self.op("mul", xf, xf), axis=-1)
        r = self.op("rsqrt", self.op("add", ms, self.c(self.cfg.eps, F32)))
        y = self.op("mul", self.cast(self.op("mul", xf, r), self.dt), w)
        return y, r

    def rmsnorm_backward(self, x: Value, r: Value, w: Value, dy: Value,
                         residual: Value | None) -> tuple[Value, Value]:
        """(dx [+ residual], dw) of :meth:`rmsnorm`:
        ``dx = r * (g - xhat * mean(g * xhat))`` with ``g = dy * w``, ``xhat = x * r``,
        written as ``r*g - x * (r^3 * mean(g*x))``; ``dw = sum_tokens(dy * x * r)``."""
        g = self.op("mul", dy, w)
        gx = self.cast(self.op("mul", g, x), F32)
        m = self.op("reduce_mean", gx, axis=-1)
        k = self.op("mul", m, self.op("mul", r, self.op("mul", r, r)))
        xk = self.cast(self.op("mul", x, self.cast(k, self.dt)), F32)
        dx = self.op("sub", self.op("mul", self.cast(g, F32), r), xk)
        dx = self.cast(dx, self.dt)
        if residual is not None:
            dx = self.op("add", dx, residual)
        dyx = self.cast(self.op("mul", dy, x), F32)
        dw = self.op("reduce_sum", self.op("mul", dyx, r), axis=0, keepdims=False)
        return dx, self.cast(dw, self.dt)


def build_step(cfg: LlamaConfig | None = None, name: str = "llama-step") -> Graph:
    """One rank's shard of a whole training step (forward, loss, backward) as one graph.

    Inputs: ``tokens`` (one-hot, ``T x vocab``, dtype), ``labels`` (one-hot, float32),
    ``mask`` (``seq x seq`` additive causal mask, float32: 0 on and below the
    diagonal, a large negative number above), then the weights of
    :meth:`LlamaConfig.weight_shapes`.  Outputs: ``loss`` (float32 ``1 x 1``) and
    ``d.<weight>`` for every weight.
    """
    cfg = cfg or LlamaConfig()
    b = _Builder(cfg, name)
    g, dt = b.g, cfg.dtype
    T, V = cfg.tokens, cfg.vocab
    H, K = cfg.heads // cfg.tp, cfg.kv_heads // cfg.tp
    G = H // K
    tokens = g.input("tokens", (T, V), dt)
    labels = g.input("labels", (T, V), F32)
    mask = g.input("mask", (cfg.seq, cfg.seq), F32)
    w = {n: g.input(n, shape, dt) for n, shape in cfg.weight_shapes().items()}
    scale = 1.0 / math.sqrt(cfg.head_dim)

    # ---- forward
    x = b.mm(tokens, w["embed"])
    saved = []
    for i in range(cfg.layers):
        p = f"l{i}."
        s = {"x": x}
        n1, s["r1"] = b.rmsnorm(x, w[p + "attn_norm"])
        s["n1"] = n1
        q3 = b.split_heads(b.mm(n1, w[p + "wq"]), H)
        kt3 = b.expand_kv(b.split_heads(b.mm(n1, w[p + "wk"]), K, transposed=True), K, G)
        v3 = b.expand_kv(b.split_heads(b.mm(n1, w[p + "wv"]), K), K, G)
        scores = b.mm(q3, kt3)                                    # (B*H, S, S)
        sf = b.op("add", b.op("mul", b.cast(scores, F32), b.c(scale, F32)), mask)
        prob = b.cast(b.op("softmax", sf, axis=-1), dt)
        o2 = b.merge_heads(b.mm(prob, v3), H)                     # (T, H*hd)
        x1 = b.op("add", x, b.all_reduce(b.mm(o2, w[p + "wo"])))
        n2, s["r2"] = b.rmsnorm(x1, w[p + "mlp_norm"])
        h1, h3 = b.mm(n2, w[p + "w1"]), b.mm(n2, w[p + "w3"])
        h1f = b.cast(h1, F32)
        silu = b.op("mul", h1f, b.op("sigmoid", h1f))
        gate = b.op("mul", b.cast(silu, dt), h3)
        x = b.op("add", x1, b.all_reduce(b.mm(gate, w[p + "w2"])))
        s.update(q3=q3, kt3=kt3, v3=v3, prob=prob, o2=o2, x1=x1, n2=n2, h1=h1, h3=h3, gate=gate)
        saved.append(s)
    nf, rf = b.rmsnorm(x, w["final_norm"])
    logits = b.mm(nf, w["head"])                                  # (T, V)

    # ---- loss: mean over tokens of -log softmax(logits)[label], and its gradient
    lf = b.cast(logits, F32)
    z = b.op("sub", lf, b.op("reduce_max", lf, axis=-1))
    e = b.op("exp", z)
    se = b.op("reduce_sum", e, axis=-1)
    logp = b.op("sub", z, b.op("log", se))
    nll = b.op("reduce_sum", b.op("mul", labels, logp), axis=-1)            # (T, 1)
    dlogits = b.op("mul", b.op("sub", b.op("div", e, se), labels), b.c(1.0 / T, F32))
    dlogits = b.cast(dlogits, dt)
    loss = b.op("mul", b.op("reduce_sum", nll, axis=0), b.c(-1.0 / T, F32))  # (1, 1)

    # ---- backward
    grads: dict[str, Value] = {}
    grads["head"] = b.mm(b.t(nf), dlogits)
    dnf = b.mm(dlogits, b.t(w["head"]))
    dx, grads["final_norm"] = b.rmsnorm_backward(x, rf, w["final_norm"], dnf, None)
    for i in reversed(range(cfg.layers)):
        p, s = f"l{i}.", saved[i]
        # MLP: x = x1 + allreduce(gate @ W2)
        grads[p + "w2"] = b.mm(b.t(s["gate"]), dx)
        dgate = b.mm(dx, b.t(w[p + "w2"]))                                  # (T, F)
        h1f = b.cast(s["h1"], F32)
        sg = b.op("sigmoid", h1f)
        silu = b.cast(b.op("mul", h1f, sg), dt)
        dh3 = b.op("mul", dgate, silu)
        one = b.c(1.0, F32)
        dsilu = b.cast(b.op("mul", sg, b.op("add", one, b.op("mul", h1f, b.op("sub", one, sg)))), dt)
        dh1 = b.op("mul", b.op("mul", dgate, s["h3"]), dsilu)
        n2t = b.t(s["n2"])
        grads[p + "w1"] = b.mm(n2t, dh1)
        grads[p + "w3"] = b.mm(n2t, dh3)
        dn2 = b.op("add", b.mm(dh1, b.t(w[p + "w1"])), b.mm(dh3, b.t(w[p + "w3"])))
        dx, grads[p + "mlp_norm"] = b.rmsnorm_backward(s["x1"], s["r2"], w[p + "mlp_norm"],
                                                       b.all_reduce(dn2), dx)
        # attention: x1 = x + allreduce(o2 @ Wo)
        grads[p + "wo"] = b.mm(b.t(s["o2"]), dx)
        do3 = b.split_heads(b.mm(dx, b.t(w[p + "wo"])), H)                   # (B*H, S, hd)
        dprob = b.mm(do3, b.t(s["v3"]))                                      # (B*H, S, S)
        dv3 = b.mm(b.t(s["prob"]), do3)
        # softmax backward: dS = P * (dP - sum(dP * P)) (row sums in fp32), times the scale
        rs = b.op("reduce_sum", b.cast(b.op("mul", dprob, s["prob"]), F32), axis=-1)
        dsc = b.op("mul", b.op("mul", s["prob"], b.op("sub", dprob, b.cast(rs, dt))), b.c(scale, dt))
        dq3 = b.mm(dsc, b.t(s["kt3"]))                                       # (B*H, S, hd)
        dk3 = b.mm(b.t(dsc), s["q3"])                                        # (B*H, S, hd)
        dq2 = b.merge_heads(dq3, H)
        dk2 = b.merge_heads(b.reduce_kv(dk3, K, G), K)
        dv2 = b.merge_heads(b.reduce_kv(dv3, K, G), K)
        n1t = b.t(s["n1"])
        grads[p + "wq"] = b.mm(n1t, dq2)
        grads[p + "wk"] = b.mm(n1t, dk2)
        grads[p + "wv"] = b.mm(n1t, dv2)
        dn1 = b.op("add", b.op("add", b.mm(dq2, b.t(w[p + "wq"])), b.mm(dk2, b.t(w[p + "wk"]))),
                   b.mm(dv2, b.t(w[p + "wv"])))
        dx, grads[p + "attn_norm"] = b.rmsnorm_backward(s["x"], s["r1"], w[p + "attn_norm"],
                                                        b.all_reduce(dn1), dx)
    grads["embed"] = b.mm(b.t(tokens), dx)
    names = ["loss"] + [f"d.{n}" for n in w]
    g.output(loss, *(grads[n] for n in w), names=names)
    return g


# ---- feeds ------------------------------------------------------------------------------
def causal_mask(seq: int) -> np.ndarray:
    """Additive causal mask: 0 where a query may attend (key <= query), -1e9 elsewhere."""
    return np.where(np.tri(seq, dtype=bool), 0.0, -1e9).astype(np.float32)


def make_feeds(cfg: LlamaConfig, seed: int = 0, meta: bool = False) -> dict:
    """Inputs for :func:`build_step`: random tokens and labels, small random weights
    (norm gains near 1), or, with ``meta``, shape descriptors only."""
    dt = cfg.dtype.numpy
    T, V = cfg.tokens, cfg.vocab
    f32 = np.dtype(np.float32)
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {
        "tokens": ((T, V), dt), "labels": ((T, V), f32), "mask": ((cfg.seq, cfg.seq), f32)}
    shapes.update({n: (s, dt) for n, s in cfg.weight_shapes().items()})
    if meta:
        return {n: MetaArray(s, d) for n, (s, d) in shapes.items()}
    rng = np.random.default_rng(seed)
    eye = np.eye(V, dtype=np.float32)
    feeds = {"tokens": eye[rng.integers(0, V, T)].astype(dt),
             "labels": eye[rng.integers(0, V, T)], "mask": causal_mask(cfg.seq)}
    for n, s in cfg.weight_shapes().items():
        if len(s) == 1:
            feeds[n] = (1.0 + 0.1 * rng.standard_normal(s)).astype(dt)
        else:
            feeds[n] = (rng.standard_normal(s) / math.sqrt(s[0])).astype(dt)
    return feeds


# ---- FLOP accounting ------------------------------------------------------------------------
def plan_matmul_flops(plans) -> float:
    """``2*m*n*k*batch`` over every GEMM in compiled plans (library calls and generated GEMMs)."""
    total = 0.0
    for plan in plans:
        for step in plan.steps:
            if isinstance(step, LibraryStep) and step.routine == "gemm":
                p = step.params
                total += 2.0 * p["m"] * p["n"] * p["k"] * p.get("batch", 1)
            elif isinstance(step, KernelStep):
                est = plan.programs[step.entry].meta.get("estimate", {})
                if est.get("kind") == "gemm":
                    total += 2.0 * est["m"] * est["n"] * est["k"] * int(est["batch"])
    return total


# ---- collectives on the timeline -------------------------------------------------------------
class TopologyAllReduce:
    """A collective handler: prices each ``all_reduce`` with the stack's topology and
    places it on the device timeline.

    The all-reduce is a packet on its own hardware queue, on the peer-link engine
    its ring uses (``Topology.egress`` to the ring successor); it waits for the
    compute stream's last submitted work (the producer) and the compute stream
    waits for it before its next work (the consumer), so the step time includes
    the communication.  It reads the input buffer and writes the output buffer
    (the race detector checks both orderings).  Every rank runs the same shard,
    so all ranks reach each all-reduce at the same time; this handler times the
    rank it runs on.
    """

    def __init__(self, stack, algorithm: str = "ring"):
        if stack.topology is None:
            raise ConfigError("the stack has no topology; compose it with devices > 1")
        self.stack = stack
        self.topology = stack.topology
        self.algorithm = algorithm
        self.calls = 0
        self.bytes = 0
        self.time_s = 0.0
        self._queues: dict[int, tuple] = {}

    def _queue(self, device):
        if device.index not in self._queues:
            hwq = device.timeline.create_queue("collective:all_reduce")
            self._queues[device.index] = (hwq, Semaphore(f"allreduce{hwq.id}"))
        return self._queues[device.index]

    def __call__(self, runtime, step, ptrs: dict) -> None:
        if step.ranks != self.topology.devices:
            raise FornaxError(f"all_reduce over {step.ranks} ranks, but the topology joins "
                              f"{self.topology.devices} devices", seam="framework", op=step.routine,
                              hint=f"build the graph with tp={self.topology.devices}")
        index = runtime.current_device()
        device = self.stack.devices[index]
        if not device.meta:
            raise FornaxError("a multi-rank all_reduce sums the other ranks' data, which this "
                              "single-shard run does not hold", seam="framework", op=step.routine,
                              hint="run the multi-rank step in shape-only mode (meta)")
        hwq, sem = self._queue(device)
        nbytes, n = int(step.nbytes), self.topology.devices
        duration = self.topology.allreduce_time(nbytes, self.algorithm)
        engine = self.topology.egress(index, (index + 1) % n)
        x, y = int(ptrs["x"]), int(ptrs["y"])
        sent = 2 * (n - 1) * nbytes // n          # what one rank sends in a ring all-reduce

        def work() -> float:
            device.begin("peer", f"all_reduce {nbytes}B")
            device.peer_bytes += sent
            device.timeline.annotate(reads=[(x, x + nbytes, "x")], writes=[(y, y + nbytes, "y")],
                                     bytes=nbytes, algorithm=self.algorithm, ranks=n)
            return duration

        # the launch plan runs on the default stream (in order): its driver queue's marker
        # now is the producer's completion; the queue's next command is the consumer
        queue = runtime.default_stream().queue
        produced = queue.record()
        self.calls += 1
        hwq.submit(Packet(engine, work, f"all_reduce {nbytes}B ({self.algorithm}, {n} ranks)",
                          "collective", waits=[(produced.sem, produced.value)],
                          signals=[(sem, self.calls)]))
        queue.wait(Marker(sem, self.calls))
        self.bytes += nbytes
        self.time_s += duration


# ---- the simulated step -------------------------------------------------------------------
@dataclass
class StepReport:
    config: dict
    vendor: str
    devices: int
    topology: str
    step_time_s: float
    compute_s: float
    communication_s: float
    exposed_communication_s: float
    all_reduces: int
    all_reduce_bytes: int
    kernels: int
    executed_flops: float
    matmul_flops: float
    model_flops: float
    mfu: float
    peak_hbm_bytes: int
    hbm_bytes: int
    fits: bool
    upload_s: float
    host_wall_s: float
    build_wall_s: float
    compile_wall_s: float
    peak_host_rss_bytes: int
    symmetry: str
    notes: list = field(default_factory=list)
    nodes: int = 1
    tp: int = 1
    dp: int = 1
    dp_all_reduces: int = 0
    dp_all_reduce_bytes: int = 0
    #: the slowest rank's step time minus the fastest's
    straggler_spread_s: float = 0.0
    #: per rank: rank, node, step_time_s, compute_s, communication_s, exposed_communication_s
    ranks: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    import sys
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def rank_figures(stack) -> list[dict]:
    """Each rank's step from its device's timeline: first kernel start to the end of its last
    kernel or collective; compute (kernels), communication (collectives) and the part of the
    communication no kernel overlapped."""
    out = []
    topo = stack.topology
    for dev in stack.devices:
        recs = dev.timeline.records
        kern = [(r.start, r.end) for r in recs if r.kind == "kernel"]
        coll = [(r.start, r.end) for r in recs if r.kind == "collective"]
        if not kern:
            raise FornaxError(f"device {dev.index} ran no kernels of the step", seam="framework")
        start = min(lo for lo, _ in kern)
        end = max(hi for _, hi in kern + coll)
        compute = _union(kern)
        out.append({"rank": dev.index, "node": topo.node_of[dev.index] if topo and topo.node_of else 0,
                    "step_time_s": end - start, "compute_s": compute, "communication_s": _union(coll),
                    "exposed_communication_s": _union(kern + coll) - compute})
    return out


def step_numbers(stack, cfg: LlamaConfig, result, ranks: StepRanks | None,
                 build_wall_s: float, host_wall_s: float) -> StepReport:
    """The step's figures from a finished run of every rank (see :func:`simulate_step`)."""
    dev = stack.devices[0]
    per_rank = rank_figures(stack)
    slow = max(per_rank, key=lambda p: p["step_time_s"])
    recs = dev.timeline.records
    start = min(r.start for r in recs if r.kind == "kernel")
    uploads = sum(r.end - r.start for r in recs if r.kind == "copy" and r.end <= start)
    step = slow["step_time_s"]
    kernels = [k for k in stack.driver.kernel_log]
    executed = float(sum(k.flops for k in kernels))
    n = stack.config.devices
    dp = n // cfg.tp
    model = 6.0 * cfg.params() * cfg.tokens * dp
    peak_rate = dev.spec.matrix_peak.get(cfg.dtype.value, 0.0) * n
    mfu = model / (step * peak_rate) if step > 0 and peak_rate > 0 else 0.0
    times = [p["step_time_s"] for p in per_rank]
    tp_points = [p for p in ranks.points if p.kind == "tp"] if ranks else []
    dp_points = [p for p in ranks.points if p.kind == "dp"] if ranks else []
    return StepReport(
        config=asdict(cfg) | {"dtype": cfg.dtype.value, "params": cfg.params()},
        vendor=stack.config.seams["compiler"], devices=n, topology=stack.config.topology,
        step_time_s=step, compute_s=slow["compute_s"], communication_s=slow["communication_s"],
        exposed_communication_s=slow["exposed_communication_s"], all_reduces=len(tp_points),
        all_reduce_bytes=sum(p.nbytes for p in tp_points), kernels=len(kernels),
        executed_flops=executed * n, matmul_flops=plan_matmul_flops(result.plans) * n,
        model_flops=model, mfu=mfu, peak_hbm_bytes=dev.memory.peak, hbm_bytes=dev.spec.hbm_bytes,
        fits=dev.memory.peak <= dev.spec.hbm_bytes, upload_s=uploads, host_wall_s=host_wall_s,
        build_wall_s=build_wall_s, compile_wall_s=stack.compiler.compile_wall_s,
        peak_host_rss_bytes=peak_rss_bytes(), nodes=stack.config.nodes, tp=cfg.tp, dp=dp,
        dp_all_reduces=len(dp_points), dp_all_reduce_bytes=sum(p.nbytes for p in dp_points),
        straggler_spread_s=max(times) - min(times), ranks=per_rank,
        symmetry=(f"every rank's timeline is simulated: rank 0 runs the shard through the stack "
                  f"on device 0; the other {n - 1} rank(s) hold shards of the same shapes and "
                  "replay its kernels and copies on their own devices (each kernel's cost "
                  "accounted by that device's power model at its own start time), with their "
                  "own compute stream and communication queues; every all-reduce starts when "
                  "the last rank of its group arrives; ranks other than 0 allocate no memory "
                  "(their peak equals rank 0's)" if n > 1 else "one device"),
        notes=["step time: the slowest rank's first kernel start to its last kernel or "
               "all-reduce end; the initial upload of weights and inputs (upload_s) and the "
               "gradient download are outside it (a training loop keeps them resident)",
               f"tensor-parallel over {cfg.tp} devices within a node (an all-reduce after each "
               "row-parallel product, consumed at once)"
               + (f", data-parallel over {dp} copies: each backward all-reduce point issues the "
                  "gradients finished since the previous one as a bucket on a separate queue, "
                  "which the backward pass overlaps" if dp > 1 else ""),
               "model FLOPs = 6 x params x tokens x data-parallel copies; mfu = model FLOPs / "
               "(step time x devices x bf16 matrix peak)"])


def default_tp(stack, cfg: LlamaConfig | None = None) -> int:
    """Tensor-parallel width: the most devices of one node that the model's key/value heads
    (and query heads) split over evenly."""
    c = cfg or LlamaConfig(tp=1)
    per_node = stack.config.devices // stack.config.nodes
    return max(t for t in range(1, per_node + 1)
               if per_node % t == 0 and c.kv_heads % t == 0 and c.heads % t == 0
               and c.ffn % t == 0)


def dp_buckets(cfg: LlamaConfig) -> tuple[dict[int, int], int]:
    """Data-parallel gradient buckets: the bytes issued with each tensor-parallel all-reduce of
    the backward pass (by call index), and the last bucket after the step.  At the MLP
    all-reduce of layer ``i``: W2, W1, W3 of layer ``i`` (with the head and final norm at the
    last layer, else the attention norm of layer ``i+1``); at its attention all-reduce: W_o,
    W_q, W_k, W_v and the MLP norm of layer ``i``; after the step: the embedding and layer 0's
    attention norm."""
    shapes = cfg.weight_shapes()
    item = cfg.dtype.itemsize
    L = cfg.layers

    def size(*names: str) -> int:
        return sum(math.prod(shapes[n]) * item for n in names)

    out: dict[int, int] = {}
    for i in reversed(range(L)):
        p = f"l{i}."
        extra = ("head", "final_norm") if i == L - 1 else (f"l{i + 1}.attn_norm",)
        out[2 * L + 2 * (L - 1 - i)] = size(p + "w2", p + "w1", p + "w3", *extra)
        out[2 * L + 2 * (L - 1 - i) + 1] = size(p + "wo", p + "wq", p + "wk", p + "wv", p + "mlp_norm")
    return out, size("embed", "l0.attn_norm")


def _run_ranks(stack, cfg: LlamaConfig, graph: Graph, feeds: dict) -> tuple[object, StepRanks | None]:
    """Rank 0's shard through the stack on device 0 (compiled once, launched on its stream) and,
    with several devices, every other rank alongside (:class:`StepRanks`)."""
    from ..layers.framework import RunResult

    n = stack.config.devices
    if n == 1:
        return stack.framework.run(graph, feeds), None
    buckets, last = dp_buckets(cfg)
    ranks = StepRanks(stack, cfg.tp, lambda i: buckets.get(i, 0))
    rt = stack.runtime
    rt.set_device(0)
    dev0 = stack.devices[0]
    stream = rt.default_stream()
    plan = stack.framework.prepare(graph, stream)
    ptrs: list[int] = []
    try:
        ins = []
        for v in graph.inputs:
            ins.append(rt.malloc(feeds[v.name].nbytes))
            ptrs.append(ins[-1])
            rt.memcpy_h2d(ins[-1], feeds[v.name], stream)
        outs = []
        for v in graph.outputs:
            outs.append(rt.malloc(MetaArray.like(v).nbytes))
            ptrs.append(outs[-1])
        tap = ranks.tap = CostTap(dev0.power)
        dev0.power = tap
        try:
            plan(ins, outs, stream, collective=ranks)
            ranks.finish0(rt, last)
            ranks.run()
        finally:
            dev0.power = tap.power
        rt.synchronize()
    finally:
        for ptr in ptrs:
            rt.free(ptr)
        plan.release()
    return RunResult([], [], [], [plan.plan]), ranks


def simulate_step(vendor: str = "cuda-like", devices: int = 8, topology: str = "switch",
                  cfg: LlamaConfig | None = None, spec: str = "h200-like", seed: int = 0,
                  stack=None, nodes: int = 1) -> tuple[StepReport, object, object]:
    """Compose a shape-only stack of ``devices`` chips and run one training step on all of them.

    Returns the :class:`StepReport`, the stack and rank 0's run result.  ``cfg.tp`` defaults to
    the most devices of a node the model splits over (:func:`default_tp`); the devices form
    ``tp``-wide tensor-parallel groups, ``devices / tp`` of them data-parallel.  A given
    ``stack`` (composed with ``meta``) is used as it is.
    """
    from ..stack import compose, make_config

    t0 = time.perf_counter()
    if stack is None:
        stack = compose(make_config(vendor, spec=spec, devices=devices, topology=topology,
                                    meta=True, seed=seed, nodes=nodes))
    if not stack.config.meta:
        raise ConfigError("the llama training step needs shape-only mode (--meta): a 70B model's "
                          "weights and activations are not materialised")
    devices = stack.config.devices
    cfg = cfg or LlamaConfig(tp=default_tp(stack))
    per_node = devices // stack.config.nodes
    if devices % cfg.tp or per_node % cfg.tp:
        raise ConfigError(f"the step is built for tp={cfg.tp}, which does not split the stack's "
                          f"{devices} device(s) ({per_node} per node) into whole tensor-parallel "
                          "groups within a node",
                          hint=f"compose with --devices a multiple of {cfg.tp}, {cfg.tp} or more a node")
    graph = build_step(cfg)
    feeds = make_feeds(cfg, meta=True)
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    result, ranks = _run_ranks(stack, cfg, graph, feeds)
    run = time.perf_counter() - t1
    rep = step_numbers(stack, cfg, result, ranks, build, build + run)
    return rep, stack, result
