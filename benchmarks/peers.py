"""fornax beside the Python device emulators a user might pick instead, in one process and run.

Runners (columns):

* **fornax** on each built-in family: PyTorch tensors on the ``fornax`` device
  (``ft.use_stack(vendor)``, ``t.to("fornax")``); one call is the op plus
  ``torch.fornax.synchronize()``, so the simulated kernel really runs.
* **torch CPU** eager, the same ops on CPU tensors.
* **tinygrad PYTHON**: tinygrad's pure-Python uop emulator (``runtime/ops_python.py``).  The
  pinned tinygrad (0.14) selects devices through its ``DEV`` context variable (``PYTHON=1``
  and assigning ``Device.DEFAULT`` are refused there), so the module uses tinygrad's own API,
  ``Context(DEV="PYTHON")`` plus ``device="PYTHON"`` on every tensor: no environment
  variable is touched.  One call is the lazy expression plus ``.realize()``.
* **triton interpreter**: ``@triton.jit`` kernels (a blocked add; a tiled matmul with
  ``tl.dot(..., input_precision="ieee")`` and an optional bias/ReLU epilogue, two launches for
  the MLP) run by Triton's NumPy interpreter on CPU torch tensors.  ``TRITON_INTERPRET=1`` is
  set before triton is imported and around each launch (triton reads it when a kernel is
  decorated and, for some lazy imports, when one runs) and restored afterwards, so it never
  reaches fornax's own runs.  Note that with triton installed, torch imports it by itself (see
  the note above the kernels), so the kernels use only triton.language builtins.
* **numba CUDA sim**: ``@cuda.jit`` kernels (a 1-D add; a naive matmul, one thread per output,
  with the same bias/ReLU epilogue) on numba's CUDA simulator, which runs every CUDA thread
  as a Python thread.  ``NUMBA_ENABLE_CUDASIM=1`` is set while numba is imported and the
  kernels are decorated (numba reads it into its config then), and restored afterwards.

The three peers are the optional extra ``bench-peers`` (``make bench-peers``), pinned in
pyproject.toml and constraints.txt to versions that install beside numpy 2.4.6 and the torch
2.13.0 CPU build: tinygrad 0.14.0 (no dependencies), triton 3.9.0 (no dependencies; only its
interpreter is used, the CPU build of torch has no GPU for it) and numba 0.68.1 with
llvmlite 0.50.0 (numba 0.68 supports numpy < 2.6).  A peer that is not installed is reported
as "not installed (make bench-peers installs it)", so the module runs without the extra too.

Workloads (rows): float32 add of 1,024 and 65,536 elements; a 256x256x256 float32 GEMM; the
MLP forward 64x256 -> 512 (ReLU) -> 128, float32, random weights.

Each figure is the median wall time of one call after a warm-up call.  Every output is
checked against a NumPy reference (the add bit-exactly, the GEMM and MLP against float64
within float32 tolerance).  Slow emulators are bounded: each (workload, runner) figure may
spend about ``CELL_BUDGET_S`` seconds.  Every runner is first timed on a small slice of the
problem (fewer elements, GEMM rows or MLP batch rows; the other dimensions stay full size);
the full problem is run when a warm-up and a timed call of it are predicted to take at most
half of the budget left, else the largest slice that is.  A row that stays on a slice (in
practice tinygrad's PYTHON device and the numba simulator on the GEMM and the MLP, whose one
full-size call takes about a minute or more, and the simulator's 65,536-element add) is shown
as measured at its size ("@ M=64"),
and its ratio is against fornax timed on the same slice: no figure is extrapolated.  A linear
scaling of its time to the full problem is printed beside it, dim and marked "if linear", as
a rough indication only: the emulators are not linear in size (tinygrad's PYTHON device, for
one, picks different kernels per shape).  Ratios are runner time / fastest fornax family's
time at the same size, so > 1 means fornax is ahead.

All three peers work with the pinned numpy and torch; none is left out.  Wall times depend on
the machine being otherwise idle: on a loaded 2-core machine torch CPU's two-thread kernels
stall (a 65,536-element add went from about 10 µs to 16 ms), so ``main`` prints the load
average beside the tables.

``measure()`` returns every figure as a dict (workload, runner, seconds, ratio, ...) for
another module to write to JSON; ``python -m benchmarks.peers`` prints the tables.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

#: about the most wall time one (workload, runner) figure may take, warm-ups included
CELL_BUDGET_S = 60.0
#: timed calls after the warm-up: as many as fit in this (at least one, at most MAX_REPEATS)
REPEAT_BUDGET_S = 4.0
MAX_REPEATS = 50
NOT_INSTALLED = "not installed (make bench-peers installs it)"


# --------------------------------------------------------------------------- workloads

@dataclass(frozen=True)
class Workload:
    name: str
    kind: str        # "add" | "gemm" | "mlp"
    full: int        # the size of the dimension that is sliced: elements, GEMM rows, batch rows
    smallest: int    # the first slice every runner is timed on
    dim: str         # what ``full`` counts, for the table ("n", "M", "batch")


WORKLOADS: tuple[Workload, ...] = (
    Workload("add 1,024 f32", "add", 1024, 16, "n"),
    Workload("add 65,536 f32", "add", 65536, 1024, "n"),
    Workload("GEMM 256x256x256 f32", "gemm", 256, 4, "M"),
    Workload("MLP 64x256→512→128 f32", "mlp", 64, 1, "batch"),
)
_BY_NAME = {w.name: w for w in WORKLOADS}
GEMM_NK = 256
MLP_DIMS = (256, 512, 128)


def _workload(name: str | Workload) -> Workload:
    if isinstance(name, Workload):
        return name
    if name in _BY_NAME:
        return _BY_NAME[name]
    hits = [w for w in WORKLOADS if w.name.startswith(name)]
    if len(hits) != 1:
        raise KeyError(f"no single workload named {name!r}; one of {list(_BY_NAME)}")
    return hits[0]


def _ladder(w: Workload) -> list[int]:
    sizes, s = [], w.smallest
    while s < w.full:
        sizes.append(s)
        s *= 4
    return sizes + [w.full]


def make_inputs(w: Workload, size: int | None = None) -> dict[str, np.ndarray]:
    """The workload's float32 inputs (seeded), its sliced dimension cut to ``size``."""
    size = w.full if size is None else size
    rng = np.random.default_rng(0)
    if w.kind == "add":
        a = rng.standard_normal(w.full, dtype=np.float32)
        b = rng.standard_normal(w.full, dtype=np.float32)
        return {"a": a[:size].copy(), "b": b[:size].copy()}
    if w.kind == "gemm":
        a = rng.standard_normal((w.full, GEMM_NK), dtype=np.float32)
        b = rng.standard_normal((GEMM_NK, GEMM_NK), dtype=np.float32)
        return {"a": a[:size].copy(), "b": b}
    d_in, d_hidden, d_out = MLP_DIMS
    x = rng.standard_normal((w.full, d_in), dtype=np.float32)
    w1 = rng.standard_normal((d_in, d_hidden), dtype=np.float32) / np.float32(np.sqrt(d_in))
    b1 = rng.standard_normal(d_hidden, dtype=np.float32) * np.float32(0.1)
    w2 = rng.standard_normal((d_hidden, d_out), dtype=np.float32) / np.float32(np.sqrt(d_hidden))
    b2 = rng.standard_normal(d_out, dtype=np.float32) * np.float32(0.1)
    return {"x": x[:size].copy(), "w1": w1, "b1": b1, "w2": w2, "b2": b2}


def reference(w: Workload, inp: dict[str, np.ndarray]) -> np.ndarray:
    """The add in float32 (exactly rounded, so every runner must match it bit for bit); the
    GEMM and the MLP in float64."""
    if w.kind == "add":
        return inp["a"] + inp["b"]
    f = {k: v.astype(np.float64) for k, v in inp.items()}
    if w.kind == "gemm":
        return f["a"] @ f["b"]
    return np.maximum(f["x"] @ f["w1"] + f["b1"], 0.0) @ f["w2"] + f["b2"]


def check(w: Workload, out: np.ndarray, ref: np.ndarray) -> tuple[bool, float]:
    """(correct, max abs error) of a runner's output."""
    out = np.asarray(out)
    if out.shape != ref.shape:
        return False, float("inf")
    err = float(np.max(np.abs(out.astype(np.float64) - ref))) if ref.size else 0.0
    if w.kind == "add":
        return bool(np.array_equal(out, ref)), err
    return bool(np.allclose(out, ref, rtol=1e-4, atol=1e-3)), err


# --------------------------------------------------------------------------- runners

@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Set environment variables for the block only; the old values come back after it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "—"


#: a prepared call: runs the op to completion and returns its output; fetch turns that into NumPy
Call = Callable[[], Any]
Fetch = Callable[[Any], np.ndarray]


class Runner:
    name = ""
    how = ""
    dist = ""
    peer = False

    def unavailable(self) -> str | None:
        """Why the runner cannot run here (None when it can); never imports the peer."""
        return None

    def version(self) -> str:
        return _dist_version(self.dist)

    def prepare(self, w: Workload, inp: dict[str, np.ndarray]) -> tuple[Call, Fetch]:
        raise NotImplementedError


def _torch_op(kind: str, t: dict[str, Any]) -> Callable[[], Any]:
    import torch
    if kind == "add":
        return lambda: t["a"] + t["b"]
    if kind == "gemm":
        return lambda: t["a"] @ t["b"]
    return lambda: torch.relu(t["x"] @ t["w1"] + t["b1"]) @ t["w2"] + t["b2"]


class TorchCPU(Runner):
    name = "torch CPU"
    how = "PyTorch eager on CPU tensors"
    dist = "torch"

    def prepare(self, w, inp):
        import torch
        op = _torch_op(w.kind, {k: torch.from_numpy(v) for k, v in inp.items()})
        return op, lambda out: out.numpy()


class Fornax(Runner):
    dist = "fornax"

    def __init__(self, vendor: str):
        self.vendor = vendor
        self.name = f"fornax {vendor}"
        self.how = f'torch tensors on "fornax", use_stack("{vendor}"); op + torch.fornax.synchronize()'

    def prepare(self, w, inp):
        import torch

        import fornax.frameworks.torch as ft
        ft.use_stack(self.vendor)
        op = _torch_op(w.kind, {k: torch.from_numpy(v).to("fornax") for k, v in inp.items()})

        def call():
            out = op()
            torch.fornax.synchronize()
            return out
        return call, lambda out: out.cpu().numpy()


class Tinygrad(Runner):
    name = "tinygrad PYTHON"
    how = 'Context(DEV="PYTHON"), device="PYTHON": the pure-Python uop emulator; op + .realize()'
    dist = "tinygrad"
    peer = True

    def unavailable(self):
        return None if importlib.util.find_spec("tinygrad") else NOT_INSTALLED

    def prepare(self, w, inp):
        from tinygrad import Device, Tensor
        from tinygrad.helpers import Context

        with Context(DEV="PYTHON"):
            t = {k: Tensor(v, device="PYTHON").realize() for k, v in inp.items()}
        if w.kind == "add":
            def op():
                return t["a"] + t["b"]
        elif w.kind == "gemm":
            def op():
                return t["a"] @ t["b"]
        else:
            def op():
                return (t["x"] @ t["w1"] + t["b1"]).relu() @ t["w2"] + t["b2"]

        def call():
            with Context(DEV="PYTHON"):
                out = op().realize()
                Device["PYTHON"].synchronize()
            return out
        return call, lambda out: out.numpy()


# The peers' kernels are plain module-level functions, decorated only when a peer is first
# used (so importing this module imports no peer).  Both the Triton interpreter and numba's
# simulator patch the kernel's module globals while it runs (``tl`` and ``cuda`` here), so the
# libraries are bound to these module names, not to locals.  The Triton kernels use only
# triton.language builtins: torch itself imports triton, when it is installed, as soon as some
# of its ops are first used (torch._native's Triton implementations; the fornax rows do that
# before the Triton row runs), i.e. without TRITON_INTERPRET, and triton.language's own
# @jit helpers (tl.zeros, tl.sum, ...) are then compiled-mode functions the interpreter
# refuses to call.
tl: Any = None          # triton.language, once _triton_kernels() has imported it
cuda: Any = None        # numba.cuda (the simulator), once _numba_kernels() has imported it


def _tt_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def _tt_matmul(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               HAS_BIAS: tl.constexpr, RELU: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.full((BM, BN), 0.0, tl.float32)    # a builtin, not the @jit helper tl.zeros (note above)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if RELU:
        acc = tl.maximum(acc, 0.0)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _nb_add(a, b, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i] + b[i]


def _nb_matmul(a, b, bias, c, has_bias, relu):
    j, i = cuda.grid(2)                    # x: output column, y: output row
    if i < c.shape[0] and j < c.shape[1]:
        acc = np.float32(0.0)
        for kk in range(a.shape[1]):
            acc += a[i, kk] * b[kk, j]
        if has_bias:
            acc += bias[j]
        if relu and acc < 0:
            acc = np.float32(0.0)
        c[i, j] = acc


_TRITON: dict[str, Any] = {}


def _triton_kernels() -> dict[str, Any]:
    """Import triton with TRITON_INTERPRET=1 and decorate the kernels (once per process)."""
    global tl
    if _TRITON:
        return _TRITON
    with _env(TRITON_INTERPRET="1"):
        import triton
        import triton.language
        tl = triton.language
        add, matmul = triton.jit(_tt_add), triton.jit(_tt_matmul)
    if type(add).__name__ != "InterpretedFunction":
        raise RuntimeError(f"triton did not pick its interpreter ({type(add).__name__})")
    _TRITON.update(triton=triton, add=add, matmul=matmul)
    return _TRITON


class TritonInterp(Runner):
    name = "triton interpreter"
    how = "@triton.jit add and tiled matmul (64x64x32 blocks) under TRITON_INTERPRET=1, CPU torch tensors"
    dist = "triton"
    peer = True
    BLOCK = 1024
    BM, BN, BK = 64, 64, 32

    def unavailable(self):
        return None if importlib.util.find_spec("triton") else NOT_INSTALLED

    def prepare(self, w, inp):
        import torch
        k = _triton_kernels()
        t = {name: torch.from_numpy(v) for name, v in inp.items()}

        def mm(a, b, bias=None, relu=False):
            m, n = a.shape[0], b.shape[1]
            c = torch.empty((m, n), dtype=torch.float32)
            k["matmul"][(-(-m // self.BM), -(-n // self.BN))](
                a, b, c if bias is None else bias, c, m, n, a.shape[1],
                a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                BM=self.BM, BN=self.BN, BK=self.BK, HAS_BIAS=bias is not None, RELU=relu)
            return c

        if w.kind == "add":
            def op():
                out = torch.empty_like(t["a"])
                n = out.numel()
                k["add"][(-(-n // self.BLOCK),)](t["a"], t["b"], out, n, BLOCK=self.BLOCK)
                return out
        elif w.kind == "gemm":
            def op():
                return mm(t["a"], t["b"])
        else:
            def op():
                return mm(mm(t["x"], t["w1"], t["b1"], relu=True), t["w2"], t["b2"])

        def call():
            with _env(TRITON_INTERPRET="1"):
                return op()
        return call, lambda out: out.numpy()


_NUMBA: dict[str, Any] = {}


def _numba_kernels() -> dict[str, Any]:
    """Import numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) and decorate the kernels (once)."""
    global cuda
    if _NUMBA:
        return _NUMBA
    with _env(NUMBA_ENABLE_CUDASIM="1"):
        from numba.core import config
        if not config.ENABLE_CUDASIM:           # numba was imported earlier, without the variable
            if "numba.cuda" in sys.modules:
                raise RuntimeError("numba.cuda was imported earlier without NUMBA_ENABLE_CUDASIM=1")
            config.reload_config()
        import numba.cuda
        cuda = numba.cuda
        add, matmul = cuda.jit(_nb_add), cuda.jit(_nb_matmul)
    if not type(add).__module__.startswith("numba.cuda.simulator"):
        raise RuntimeError(f"numba did not pick its CUDA simulator ({type(add).__module__})")
    _NUMBA.update(cuda=cuda, add=add, matmul=matmul)
    return _NUMBA


class NumbaSim(Runner):
    name = "numba CUDA sim"
    how = "@cuda.jit add and naive matmul (a thread per output) on numba's CUDA simulator"
    dist = "numba"
    peer = True
    THREADS = 256          # add: threads per block
    TILE = (64, 1)         # matmul: (columns, rows) per block; every width here is a multiple of 64

    def unavailable(self):
        return None if importlib.util.find_spec("numba") else NOT_INSTALLED

    def prepare(self, w, inp):
        k = _numba_kernels()
        cuda = k["cuda"]
        d = {name: cuda.to_device(v) for name, v in inp.items()}
        tx, ty = self.TILE

        def mm(a, b, bias=None, relu=False):
            m, n = a.shape[0], b.shape[1]
            c = cuda.device_array((m, n), dtype=np.float32)
            grid = ((n + tx - 1) // tx, (m + ty - 1) // ty)
            k["matmul"][grid, self.TILE](a, b, c if bias is None else bias, c, bias is not None, relu)
            return c

        if w.kind == "add":
            def op():
                n = d["a"].shape[0]
                out = cuda.device_array(n, dtype=np.float32)
                k["add"][(n + self.THREADS - 1) // self.THREADS, self.THREADS](d["a"], d["b"], out)
                return out
        elif w.kind == "gemm":
            def op():
                return mm(d["a"], d["b"])
        else:
            def op():
                return mm(mm(d["x"], d["w1"], d["b1"], relu=True), d["w2"], d["b2"])

        def call():
            out = op()
            cuda.synchronize()
            return out
        return call, lambda out: out.copy_to_host()


def runners() -> list[Runner]:
    from fornax.stack import BUILTIN_FAMILIES
    return [*(Fornax(v) for v in BUILTIN_FAMILIES), TorchCPU(), Tinygrad(), TritonInterp(), NumbaSim()]


def _runner(name: str | Runner) -> Runner:
    if isinstance(name, Runner):
        return name
    for r in runners():
        if r.name == name:
            return r
    raise KeyError(f"no runner {name!r}; one of {[r.name for r in runners()]}")


# --------------------------------------------------------------------------- measuring

def run_once(workload: str | Workload, runner: str | Runner, size: int | None = None) -> np.ndarray:
    """One call of ``workload`` (its sliced dimension cut to ``size``) on ``runner``, as NumPy."""
    w, r = _workload(workload), _runner(runner)
    call, fetch = r.prepare(w, make_inputs(w, size))
    return fetch(call())


def _timed(call: Call) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = call()
    return time.perf_counter() - t0, out


def _repeat(call: Call, first: float, out: Any, left: float) -> tuple[list[float], Any]:
    """More timed calls after ``first``: as many as fit in REPEAT_BUDGET_S and ``left``."""
    samples = [first]
    more = min(MAX_REPEATS, int(REPEAT_BUDGET_S / max(first, 1e-9))) - 1
    for _ in range(max(0, min(more, int(left / max(first, 1e-9))))):
        t, out = _timed(call)
        samples.append(t)
    return samples, out


def _result(w: Workload, size: int, samples: list[float], out: np.ndarray) -> dict[str, Any]:
    ok, err = check(w, out, reference(w, make_inputs(w, size)))
    return {"seconds": statistics.median(samples), "measured_size": size, "full_size": w.full,
            "size_dim": w.dim, "reduced": size != w.full, "repeats": len(samples),
            "correct": ok, "max_abs_err": err,
            "status": "measured" if size == w.full else f"reduced: measured at {w.dim}={size:,} of {w.full:,}"}


def _measure_at(w: Workload, r: Runner, size: int) -> dict[str, Any]:
    """The median per-call time of ``w`` (cut to ``size``) on ``r`` after one warm-up call."""
    call, fetch = r.prepare(w, make_inputs(w, size))
    _timed(call)
    t, out = _timed(call)
    samples, out = _repeat(call, t, out, REPEAT_BUDGET_S)
    return _result(w, size, samples, fetch(out))


def _measure_cell(w: Workload, r: Runner, budget_s: float) -> dict[str, Any]:
    """Time ``w`` on ``r`` at the largest size that fits ``budget_s``: first the smallest slice
    (a warm-up and a timed call), then, from the latest per-unit time, the largest slice whose
    warm-up and timed call are predicted to take at most half of what is left (the half: a
    margin, since an emulator's time can jump with shape), until the full size or none fits."""
    sizes = _ladder(w)
    t_start = time.perf_counter()
    idx = 0
    while True:
        size = sizes[idx]
        call, fetch = r.prepare(w, make_inputs(w, size))
        _timed(call)                                     # warm-up: first-call setup, compiles
        t, out = _timed(call)
        if size == w.full:
            break
        left = budget_s - (time.perf_counter() - t_start)
        fits = [j for j in range(idx + 1, len(sizes)) if 2 * (t / size) * sizes[j] <= left / 2]
        if not fits:
            break
        idx = fits[-1]
    samples, out = _repeat(call, t, out, budget_s - (time.perf_counter() - t_start))
    return _result(w, size, samples, fetch(out))


def measure(workloads: Iterable[str | Workload] | None = None,
            runner_names: Iterable[str | Runner] | None = None,
            budget_s: float = CELL_BUDGET_S, progress: bool = False) -> list[dict[str, Any]]:
    """Every figure, one dict per (workload, runner), ready for JSON:

    * ``workload``, ``runner``, ``peer``, ``version``;
    * ``status``: "measured" (the full problem), "reduced: measured at M=64 of 256" (the full
      problem would not fit the ~``budget_s`` s budget), ``NOT_INSTALLED`` or "failed: ...";
    * ``seconds``: the median wall time per call at ``measured_size`` (None when not run) —
      always a measurement; for a reduced row ``seconds_full_if_linear`` is that time scaled
      linearly to ``full_size``, a rough extrapolation and labelled so;
    * ``ratio``: ``seconds`` / the fastest fornax family's seconds *at the same size* (fornax
      is timed at a reduced row's size too), > 1: fornax ahead; ``ratios_by_family`` per
      family, ``fornax_seconds`` the fornax times used;
    * ``repeats``, ``correct`` and ``max_abs_err`` (the output against the NumPy reference).
    """
    ws = [_workload(w) for w in (workloads or WORKLOADS)]
    rs = [_runner(r) for r in (runner_names or runners())]
    rows: list[dict[str, Any]] = []
    for w in ws:
        for r in rs:
            row: dict[str, Any] = {"workload": w.name, "runner": r.name, "peer": r.peer,
                                   "version": r.version(), "seconds": None, "ratio": None,
                                   "ratios_by_family": {}, "fornax_seconds": {}}
            reason = r.unavailable()
            if reason:
                row["status"] = reason
            else:
                if progress:
                    print(f"  {w.name} on {r.name} …", file=sys.stderr, flush=True)
                try:
                    row.update(_measure_cell(w, r, budget_s))
                except Exception as exc:          # a peer's failure is a table entry, not a crash
                    msg = str(exc).splitlines()[0][:160] if str(exc) else ""
                    row["status"] = f"failed: {type(exc).__name__}: {msg}"
                if row.get("reduced"):
                    row["seconds_full_if_linear"] = row["seconds"] * w.full / row["measured_size"]
            rows.append(row)
    # ratios: against each fornax family at the same size (timed here when a row was reduced)
    fornax_runners = [r for r in rs if isinstance(r, Fornax)]
    at_size: dict[tuple[str, int], dict[str, float]] = {}
    for w in ws:
        for row in rows:
            if row["workload"] == w.name and isinstance(_runner(row["runner"]), Fornax) and row["seconds"]:
                at_size.setdefault((w.name, row["measured_size"]), {})[row["runner"]] = row["seconds"]
        for row in rows:
            if row["workload"] != w.name or not row["seconds"]:
                continue
            key = (w.name, row["measured_size"])
            if key not in at_size and fornax_runners:
                if progress:
                    print(f"  {w.name} at {w.dim}={row['measured_size']:,} on fornax (for the ratio) …",
                          file=sys.stderr, flush=True)
                at_size[key] = {}
                for f in fornax_runners:
                    with contextlib.suppress(Exception):
                        res = _measure_at(w, f, row["measured_size"])
                        if res["correct"]:
                            at_size[key][f.name] = res["seconds"]
            fam = at_size.get(key, {})
            if fam:
                row["fornax_seconds"] = {f.removeprefix("fornax "): s for f, s in fam.items()}
                row["ratio"] = row["seconds"] / min(fam.values())
                row["ratios_by_family"] = {f.removeprefix("fornax "): row["seconds"] / s for f, s in fam.items()}
    return rows


# --------------------------------------------------------------------------- printing

def _fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _fmt_ratio(r: float) -> str:
    return f"{r:,.0f}×" if r >= 100 else f"{r:.1f}×" if r >= 10 else f"{r:.2f}×"


def _cell(row: dict[str, Any]) -> str:
    if row["seconds"] is None:
        status = row["status"]
        return "[dim]not installed[/dim]" if status == NOT_INSTALLED else f"[red]{status}[/red]"
    text = _fmt_time(row["seconds"])
    if row["reduced"]:
        text += f" @ {row['size_dim']}={row['measured_size']:,}"
    if row["ratio"] is not None:
        text += f"\n{_fmt_ratio(row['ratio'])}"
    if row["reduced"]:
        text += f"\n[dim](full ≈{_fmt_time(row['seconds_full_if_linear'])} if linear)[/dim]"
    if not row["correct"]:
        text += f"\n[red]✗ wrong result (max err {row['max_abs_err']:.3g})[/red]"
    return text


def print_tables(rows: list[dict[str, Any]], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 150))
    names = list(dict.fromkeys(row["runner"] for row in rows))
    table = Table(title="fornax vs Python device emulators: median wall time per call after a warm-up; "
                        "below it, runner time / fastest fornax family at the same size (> 1: fornax ahead)",
                  show_lines=True)
    table.add_column("workload")
    for n in names:
        table.add_column(n, justify="right")
    for wname in dict.fromkeys(row["workload"] for row in rows):
        by = {row["runner"]: row for row in rows if row["workload"] == wname}
        table.add_row(wname, *(_cell(by[n]) if n in by else "" for n in names))
    console.print(table)
    info = Table(title="runners")
    for col in ("runner", "version", "how it runs", "status"):
        info.add_column(col)
    all_runners = {r.name: r for r in runners()}
    for n in names:
        r = all_runners.get(n)
        mine = [row for row in rows if row["runner"] == n]
        ran = [row for row in mine if row["seconds"] is not None]
        bad = [row["workload"] for row in ran if not row["correct"]]
        parts = []
        if ran:
            parts.append("ran; outputs checked, " + (f"WRONG on {', '.join(bad)}" if bad else "all correct"))
        parts += [f"{row['workload']}: {row['status']}" for row in mine
                  if row["seconds"] is None and row["status"] != NOT_INSTALLED]
        if all(row["status"] == NOT_INSTALLED for row in mine):
            parts = [NOT_INSTALLED]
        info.add_row(n, mine[0]["version"], r.how if r else "", "; ".join(parts))
    console.print(info)
    console.print(f"Each figure: one warm-up call, then up to {MAX_REPEATS} timed calls within "
                  f"{REPEAT_BUDGET_S:.0f} s (at least one); the median.  Outputs are checked against "
                  "NumPy (the add bit-exactly).  \"@ M=64\": running the full problem would exceed the "
                  f"~{CELL_BUDGET_S:.0f} s budget per figure, so a slice (fewer elements, GEMM rows M or "
                  "MLP batch rows; the other dimensions full size) was timed, and fornax was timed on the "
                  "same slice for the ratio.  \"full ≈ … if linear\" scales that time linearly to the full "
                  "problem: a rough extrapolation, not a measurement (tinygrad's time, for one, is not "
                  "linear in size: its kernels change with shape).")


def main() -> None:
    print("measuring (slow emulators are bounded to about "
          f"{CELL_BUDGET_S:.0f} s per figure) …", file=sys.stderr, flush=True)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    rows = measure(progress=True)
    print_tables(rows)
    print(f"{len(rows)} figures in {time.perf_counter() - t0:.0f} s on {os.cpu_count()} CPUs; load average "
          f"(1 min) {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end: other work on the "
          "machine slows every runner, torch CPU's multi-threaded kernels most.")


if __name__ == "__main__":
    main()
